/* ll_analysis_driver: `build/ll_analyze [--json] NOTEBOOK|-`, the analysis
 * CLI without the rest of the kernel (same code as `looseleaf analyze`), for
 * the analysis tests and for use while the kernel does not build. */
#include "analysis/ll_analysis.h"
#include "base/ll_log.h"

int main(int argc, char **argv)
{
    ll_log_init('A');
    argv[0] = "analyze";
    return ll_analyze_main(argc, argv);
}

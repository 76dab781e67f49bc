/* embed_llstore: embeds CPython the way build/looseleaf does and registers
 * _llstore as a builtin through ll_store_pyinit (not the standalone .so),
 * then runs the Python file given as argv[1] with argv[2:] as sys.argv[1:].
 * test_llstore_embedded.py checks its output. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>

#include "base/ll_log.h"
#include "store/ll_store.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s script.py [args...]\n", argv[0]);
        return 2;
    }
    ll_log_init('A');
    if (PyImport_AppendInittab("_llstore", (PyObject * (*) (void) ) ll_store_pyinit) != 0) {
        fprintf(stderr, "cannot register _llstore\n");
        return 1;
    }
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0; /* sys.argv = [script, args...] as given */
    PyStatus status = PyConfig_SetBytesArgv(&config, argc - 1, argv + 1);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        fprintf(stderr, "cannot start Python: %s\n", status.err_msg ? status.err_msg : "?");
        return 1;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    int rc = PyRun_SimpleFileExFlags(f, argv[1], 1, NULL);
    if (Py_FinalizeEx() < 0)
        rc = 1;
    return rc == 0 ? 0 : 1;
}

/* ll_cluster_cmd: `looseleaf cluster ...` and `looseleaf top --cluster`
 * (ll_cluster_cmd.h): find the Python with Ray and the looseleaf_cluster
 * package, then exec `PYTHON -m looseleaf_cluster.cli ARGS` in place of
 * this process (so systemd's units and the administrator's shell see the
 * command's own exit status and signals).  Runs in the `looseleaf` process
 * before anything else; no module depends on it.
 *
 * Where things are (first that exists):
 * - the package: $LL_CLUSTER_PKG; BINDIR/../cluster (a build tree:
 *   build/looseleaf); BINDIR/../lib/looseleaf/cluster (`make
 *   install-cluster`);
 * - the Python: $LL_CLUSTER_PYTHON; the cluster config's "python"; the
 *   build tree's .venv/bin/python; the Python LooseLeaf was built for. */
#include "cli/ll_cluster_cmd.h"
#include "kernel/ll_pyenv.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_DEFAULT_CONFIG "/etc/looseleaf/cluster.json"

bool ll_cluster_cmd_is_top(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--cluster") == 0)
            return true;
    return false;
}

/* The directory of this program's binary into OUT; 0 or -1. */
static int s_bindir(char *out, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    if (n <= 0)
        return -1;
    out[n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

/* The config's "python" (ARGV's --config, else $LL_CLUSTER_CONFIG, else
 * the default) into OUT; false when none says one. */
static bool s_config_python(int argc, char **argv, char *out, size_t len)
{
    const char *path = getenv("LL_CLUSTER_CONFIG");
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--config") == 0)
            path = argv[i + 1];
    json_t *c = json_load_file(path && *path ? path : S_DEFAULT_CONFIG, 0, NULL);
    const char *py = json_string_value(json_object_get(c, "python"));
    bool ok = py && py[0] == '/' && snprintf(out, len, "%s", py) < (int) len;
    json_decref(c); /* (a malformed config: the Python command says what is wrong with it) */
    return ok;
}

int ll_cluster_cmd_main(int argc, char **argv, bool cluster_top)
{
    char bindir[PATH_MAX - 64], pkg[PATH_MAX], py[PATH_MAX + 64], probe[PATH_MAX + 64];
    if (s_bindir(bindir, sizeof bindir) < 0) {
        fprintf(stderr, "looseleaf cluster: cannot find this program's directory\n");
        return 1;
    }
    const char *e = getenv("LL_CLUSTER_PKG");
    snprintf(pkg, sizeof pkg, "%s/../cluster", bindir);
    snprintf(probe, sizeof probe, "%s/looseleaf_cluster/cli.py", pkg);
    if (e && *e)
        snprintf(pkg, sizeof pkg, "%s", e);
    else if (access(probe, R_OK) != 0)
        snprintf(pkg, sizeof pkg, "%s/../lib/looseleaf/cluster", bindir);
    e = getenv("LL_CLUSTER_PYTHON");
    snprintf(probe, sizeof probe, "%s/../.venv/bin/python", bindir);
    if (e && *e)
        snprintf(py, sizeof py, "%s", e);
    else if (!s_config_python(argc, argv, py, sizeof py))
        snprintf(py, sizeof py, "%s", access(probe, X_OK) == 0 ? probe : ll_pyenv_build_python());
    const char *old = getenv("PYTHONPATH");
    char *path = malloc(strlen(pkg) + (old ? strlen(old) : 0) + 2);
    char **args = calloc((size_t) argc + 5, sizeof *args);
    if (!path || !args) {
        fprintf(stderr, "looseleaf cluster: out of memory\n");
        return 1;
    }
    sprintf(path, "%s%s%s", pkg, old && *old ? ":" : "", old && *old ? old : "");
    setenv("PYTHONPATH", path, 1);
    int n = 0;
    args[n++] = py;
    args[n++] = "-m";
    args[n++] = "looseleaf_cluster.cli";
    if (cluster_top)
        args[n++] = "top";
    for (int i = 1; i < argc; i++)
        if (!cluster_top || strcmp(argv[i], "--cluster") != 0)
            args[n++] = argv[i];
    args[n] = NULL;
    execv(py, args);
    fprintf(stderr,
            "looseleaf cluster: cannot run %s: %s (the Python with Ray: LL_CLUSTER_PYTHON, or "
            "\"python\" in the cluster config)\n",
            py, strerror(errno));
    free(path);
    free(args);
    return 1;
}

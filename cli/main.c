/* looseleaf: the program Jupyter starts for a notebook, and its tools.
 *
 *   looseleaf -f CONNECTION_FILE          the kernel (what kernel.json runs)
 *   looseleaf kernel -f CONNECTION_FILE   the same
 *   looseleaf install [...]               write the kernelspec
 *   looseleaf analyze ...                 cell analysis (analysis/ll_analyze_cli.c)
 *   looseleaf trace ... | simulate ...    the fleet simulator (sim/ll_sim_cli.h)
 *   looseleaf pool ... | zygote ...       the host pool and its zygotes (zygote/)
 *   looseleaf hostd ... | top ...         the host's slot broker (hostd/)
 *   looseleaf cluster ... | top --cluster the cluster's commands (ll_cluster_cmd.c)
 *   looseleaf --version | --help
 *
 * Runs in the kernel process (or whichever role the subcommand starts);
 * only argument parsing lives here.  This is the top of the tree (cli/):
 * it includes every role's entry point and nothing includes it, so no
 * module depends on another just to be dispatched. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/ll_analysis.h"
#include "gateway/ll_kernel.h"
#include "gateway/ll_kernelspec.h"
#include "kernel/ll_pyenv.h"
#include "sim/ll_sim_cli.h"
#include "hostd/ll_hostd.h"
#include "cli/ll_cluster_cmd.h"
#include "zygote/ll_hostpool.h"
#include "zygote/ll_zygote.h"

static void s_usage(FILE *out)
{
    fprintf(
        out,
        "usage: looseleaf -f CONNECTION_FILE         run the kernel (Jupyter starts this)\n"
        "                [--allow-insecure-connection-file]  accept a symlink, or a file others\n"
        "                                            may read (refused: the key runs code as you)\n"
        "                [--allow-empty-key]         accept an empty key (nothing signed)\n"
        "       looseleaf kernel -f CONNECTION_FILE  the same\n"
        "       looseleaf install [--user | --system | --sys-prefix | --prefix DIR | --dir DIR]\n"
        "                         [--python PYTHON] [--name NAME] [--display-name TEXT]\n"
        "                         [--no-hints]\n"
        "                         write the Jupyter kernelspec (default: --user, name %s)\n"
        "                         for the environment of PYTHON (default: the active venv,\n"
        "                         else the Python LooseLeaf was built for)\n"
        "       looseleaf analyze ...                static analysis of cells (see analyze "
        "--help)\n"
        "       looseleaf trace ... NOTEBOOK...      notebooks into a trace of sessions (see trace "
        "--help)\n"
        "       looseleaf simulate ... TRACE         the trace on a fleet of GPU hosts, LooseLeaf "
        "and baselines\n"
        "       looseleaf pool ... | zygote ...      the host pool and its zygotes (started by "
        "kernels)\n"
        "       looseleaf hostd ... | top ...        the host's GPU slot broker (a system service) "
        "and what it holds\n"
        "       looseleaf cluster ... | top --cluster  the cluster: keygen, check, raylet, agent, "
        "status (README)\n"
        "       looseleaf --version | --help\n",
        LL_KERNELSPEC_NAME);
}

/* Find the connection file in "-f FILE" / "-f=FILE" / "--f=FILE", and the
 * flags that accept what the kernel refuses by default. */
static int s_kernel_main(int argc, char **argv)
{
    const char *file = NULL;
    ll_kernel_opts_t opts = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--allow-insecure-connection-file") == 0) {
            opts.allow_insecure_file = true;
        } else if (strcmp(a, "--allow-empty-key") == 0) {
            opts.allow_empty_key = true;
        } else if (strcmp(a, "-f") == 0 || strcmp(a, "--f") == 0 ||
                   strcmp(a, "--connection-file") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "looseleaf: %s needs a connection file\n", a);
                return 2;
            }
            file = argv[++i];
        } else if (strncmp(a, "-f=", 3) == 0) {
            file = a + 3;
        } else if (strncmp(a, "--f=", 4) == 0) {
            file = a + 4;
        } else {
            fprintf(stderr, "looseleaf: unknown kernel argument '%s'\n", a);
            s_usage(stderr);
            return 2;
        }
    }
    if (!file || !*file) {
        fprintf(stderr, "looseleaf: no connection file (-f CONNECTION_FILE)\n");
        s_usage(stderr);
        return 2;
    }
    return ll_kernel_run(file, &opts);
}

/* Where the Python of the environment to install into is: --python, else
 * the active virtual environment, else the build's (kernel/ll_pyenv.h). */
static const char *s_env_python(const char *given, char *buf, size_t len)
{
    const char *venv = getenv("VIRTUAL_ENV");
    if (given || !venv || !*venv)
        return given;
    snprintf(buf, len, "%s/bin/python", venv);
    return buf;
}

static int s_install_main(int argc, char **argv)
{
    ll_kernelspec_where_t where = LL_KERNELSPEC_USER;
    const char *arg = NULL, *name = LL_KERNELSPEC_NAME, *display = NULL, *python = NULL;
    bool hints = true;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool has_next = i + 1 < argc;
        if (strcmp(a, "--user") == 0)
            where = LL_KERNELSPEC_USER;
        else if (strcmp(a, "--system") == 0)
            where = LL_KERNELSPEC_SYSTEM;
        else if (strcmp(a, "--sys-prefix") == 0)
            where = LL_KERNELSPEC_SYS_PREFIX;
        else if ((strcmp(a, "--prefix") == 0 || strcmp(a, "--dir") == 0) && has_next) {
            where = strcmp(a, "--prefix") == 0 ? LL_KERNELSPEC_PREFIX : LL_KERNELSPEC_DIR;
            arg = argv[++i];
        } else if (strcmp(a, "--name") == 0 && has_next)
            name = argv[++i];
        else if (strcmp(a, "--display-name") == 0 && has_next)
            display = argv[++i];
        else if (strcmp(a, "--python") == 0 && has_next)
            python = argv[++i];
        else if (strcmp(a, "--no-hints") == 0)
            hints = false;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            s_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "looseleaf install: bad or incomplete argument '%s'\n", a);
            s_usage(stderr);
            return 2;
        }
    }
    char dir[PATH_MAX], binary[PATH_MAX], err[1024], venv_py[PATH_MAX];
    ll_pyenv_t env;
    if (ll_pyenv_find(s_env_python(python, venv_py, sizeof venv_py), &env, err, sizeof err) < 0 ||
        ll_kernelspec_dir(where, arg, env.prefix, name, dir, sizeof dir, err, sizeof err) < 0) {
        fprintf(stderr, "looseleaf install: %s\n", err);
        return 1;
    }
    if (ll_kernelspec_self_path(binary, sizeof binary) < 0) {
        fprintf(stderr, "looseleaf install: cannot find the path of this program\n");
        return 1;
    }
    ll_kernelspec_t spec = {.binary = binary, .display_name = display, .python = env.python};
    if (ll_kernelspec_write(dir, &spec, err, sizeof err) < 0) {
        fprintf(stderr, "looseleaf install: %s\n", err);
        return 1;
    }
    printf("Installed kernelspec %s in %s (Python: %s)\n",
           where == LL_KERNELSPEC_DIR ? LL_KERNELSPEC_NAME : name, dir, env.python);
    /* The edit-time hints extension, for every JupyterLab reading that data
     * directory: <data dir> is two levels above kernels/NAME. */
    if (where != LL_KERNELSPEC_DIR) {
        char jupyter_dir[PATH_MAX];
        snprintf(jupyter_dir, sizeof jupyter_dir, "%s", dir);
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(jupyter_dir, '/');
            if (slash)
                *slash = '\0';
        }
        if (ll_kernelspec_hints(jupyter_dir, hints, err, sizeof err) < 0) {
            fprintf(stderr, "looseleaf install: %s\n", err);
            return 1;
        }
        if (hints)
            printf("JupyterLab sends edit-time hints to LooseLeaf kernels: extension %s in "
                   "%s/labextensions (--no-hints removes it)\n",
                   LL_LABEXT_NAME, jupyter_dir);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        s_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("looseleaf %s\n", LL_VERSION);
        return 0;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        s_usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "kernel") == 0)
        return s_kernel_main(argc - 2, argv + 2);
    if (strcmp(cmd, "install") == 0)
        return s_install_main(argc - 2, argv + 2);
    if (strcmp(cmd, "cluster") == 0 ||
        (strcmp(cmd, "top") == 0 && ll_cluster_cmd_is_top(argc - 1, argv + 1)))
        return ll_cluster_cmd_main(argc - 1, argv + 1, strcmp(cmd, "top") == 0);
    /* The subcommands of other modules get argv[0] = their name. */
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } subs[] = {{"analyze", ll_analyze_main},  {"pool", ll_hostpool_main}, {"hostd", ll_hostd_main},
                {"top", ll_hostd_top_main},    {"zygote", ll_zygote_main}, {"trace", ll_trace_main},
                {"simulate", ll_simulate_main}};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        if (strcmp(cmd, subs[i].name) == 0)
            return subs[i].fn(argc - 1, argv + 1);
    if (cmd[0] == '-')
        return s_kernel_main(argc - 1, argv + 1);
    fprintf(stderr, "looseleaf: unknown command '%s'\n", cmd);
    s_usage(stderr);
    return 2;
}

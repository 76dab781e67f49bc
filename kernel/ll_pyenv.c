/* ll_pyenv: the Python environment of the embedded interpreter (see
 * ll_pyenv.h).  Reads files only: pyvenv.cfg, the executable's name, the
 * standard library's directory; it never runs the Python it inspects. */
#include <Python.h> /* PY_MAJOR_VERSION / PY_MINOR_VERSION of the embedded libpython */

#include "kernel/ll_pyenv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef LL_PYTHON_EXE
#define LL_PYTHON_EXE "/usr/bin/python3"
#endif

#define S_STR2(x) #x
#define S_STR(x)  S_STR2(x)

const char *ll_pyenv_build_python(void)
{
    return LL_PYTHON_EXE;
}

const char *ll_pyenv_embedded_version(void)
{
    return S_STR(PY_MAJOR_VERSION) "." S_STR(PY_MINOR_VERSION);
}

/* DIR of PATH (without the last component) into OUT. */
static void s_dirname(const char *path, char *out, size_t len)
{
    snprintf(out, len, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash == out)
        out[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(out, len, ".");
}

/* "version = 3.11.2" (or version_info) from DIR's pyvenv.cfg: 0 with
 * *MAJOR and *MINOR, 1 when DIR has no pyvenv.cfg, -1 when it has one without a
 * version. */
static int s_venv_version(const char *dir, int *major, int *minor)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/pyvenv.cfg", dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return 1;
    char line[512];
    int rc = -1;
    while (rc < 0 && fgets(line, sizeof line, f)) {
        char key[64];
        int a, b;
        if (sscanf(line, " %63[a-z_] = %d.%d", key, &a, &b) == 3 &&
            (strcmp(key, "version") == 0 || strcmp(key, "version_info") == 0)) {
            *major = a;
            *minor = b;
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

/* The version of a Python that is not a venv's: its executable's real name
 * (python3.11), else the standard library next to it (PREFIX/lib/pythonX.Y). */
static int s_install_version(const char *python, char *prefix, size_t plen, int *major, int *minor)
{
    char real[PATH_MAX];
    if (!realpath(python, real))
        return -1;
    char bindir[PATH_MAX];
    s_dirname(real, bindir, sizeof bindir);
    s_dirname(bindir, prefix, plen);
    const char *base = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
    if (sscanf(base, "python%d.%d", major, minor) == 2)
        return 0;
    for (int m = 40; m >= 0; m--) {
        char os_py[PATH_MAX + 64];
        snprintf(os_py, sizeof os_py, "%s/lib/python3.%d/os.py", prefix, m);
        if (access(os_py, R_OK) == 0) {
            *major = 3;
            *minor = m;
            return 0;
        }
    }
    return -1;
}

int ll_pyenv_find(const char *python, ll_pyenv_t *env, char *err, size_t errlen)
{
    memset(env, 0, sizeof *env);
    if (!python || !*python) {
        const char *named = getenv("LOOSELEAF_PYTHON");
        python = named && *named ? named : LL_PYTHON_EXE;
    }
    if (python[0] == '/') {
        snprintf(env->python, sizeof env->python, "%s", python);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) {
            snprintf(err, errlen, "cannot resolve %s: %s", python, strerror(errno));
            return -1;
        }
        if (strlen(cwd) + strlen(python) + 2 > sizeof env->python) {
            snprintf(err, errlen, "the path of the environment's Python is too long");
            return -1;
        }
        int n = snprintf(env->python, sizeof env->python, "%s/", cwd);
        snprintf(env->python + n, sizeof env->python - (size_t) n, "%s", python);
    }
    struct stat st;
    if (stat(env->python, &st) < 0 || !S_ISREG(st.st_mode) || access(env->python, X_OK) < 0) {
        snprintf(err, errlen, "the environment's Python %s is not an executable file", env->python);
        return -1;
    }
    /* A venv: pyvenv.cfg in the directory above bin/. */
    char bindir[PATH_MAX];
    s_dirname(env->python, bindir, sizeof bindir);
    s_dirname(bindir, env->prefix, sizeof env->prefix);
    int v = s_venv_version(env->prefix, &env->major, &env->minor);
    if (v < 0) {
        snprintf(err, errlen, "%s/pyvenv.cfg names no Python version", env->prefix);
        return -1;
    }
    env->venv = v == 0;
    if (!env->venv && s_install_version(env->python, env->prefix, sizeof env->prefix, &env->major,
                                        &env->minor) < 0) {
        snprintf(err, errlen, "cannot tell the version of the Python %s", env->python);
        return -1;
    }
    if (env->major != PY_MAJOR_VERSION || env->minor != PY_MINOR_VERSION) {
        snprintf(err, errlen,
                 "the environment's Python %s is Python %d.%d, but this LooseLeaf was built for "
                 "Python %s: use an environment made from a Python %s, or rebuild LooseLeaf "
                 "against this one (make PYTHON=%s)",
                 env->python, env->major, env->minor, ll_pyenv_embedded_version(),
                 ll_pyenv_embedded_version(), env->python);
        return -1;
    }
    return 0;
}

/* ---- self-test ----------------------------------------------------------- */

static int s_write(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    fclose(f);
    return chmod(path, mode);
}

/* Fake venvs in a temp dir: the embedded version is accepted, another is
 * refused naming both, a missing or non-executable Python and a pyvenv.cfg
 * without a version are errors; the build's Python is found. */
int ll_pyenv_selftest(bool verbose)
{
    char root[] = "/tmp/ll-pyenv-selftest-XXXXXX";
    if (!mkdtemp(root))
        return -1;
    int rc = -1;
    char path[PATH_MAX + 64], text[128], err[512];
    ll_pyenv_t env;
    const char *names[] = {"good", "other", "bad"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        mkdir(path, 0700);
        snprintf(path, sizeof path, "%s/%s/bin", root, names[i]);
        mkdir(path, 0700);
        snprintf(path, sizeof path, "%s/%s/bin/python", root, names[i]);
        if (s_write(path, "#!/bin/sh\n", 0700) < 0)
            goto out;
    }
    snprintf(text, sizeof text, "home = /usr/bin\nversion = %d.%d.7\n", PY_MAJOR_VERSION,
             PY_MINOR_VERSION);
    snprintf(path, sizeof path, "%s/good/pyvenv.cfg", root);
    s_write(path, text, 0600);
    snprintf(text, sizeof text, "home = /usr/bin\nversion_info = %d.%d.1.final.0\n",
             PY_MAJOR_VERSION, PY_MINOR_VERSION + 1);
    snprintf(path, sizeof path, "%s/other/pyvenv.cfg", root);
    s_write(path, text, 0600);
    snprintf(path, sizeof path, "%s/bad/pyvenv.cfg", root);
    s_write(path, "home = /usr/bin\n", 0600);

    snprintf(path, sizeof path, "%s/good/bin/python", root);
    if (ll_pyenv_find(path, &env, err, sizeof err) < 0 || !env.venv ||
        strcmp(env.python, path) != 0 || env.major != PY_MAJOR_VERSION)
        goto out;
    snprintf(text, sizeof text, "%s/good", root);
    if (strcmp(env.prefix, text) != 0)
        goto out;
    snprintf(path, sizeof path, "%s/other/bin/python", root);
    snprintf(text, sizeof text, "is Python %d.%d, but this LooseLeaf was built for Python %s",
             PY_MAJOR_VERSION, PY_MINOR_VERSION + 1, ll_pyenv_embedded_version());
    if (ll_pyenv_find(path, &env, err, sizeof err) == 0 || !strstr(err, text))
        goto out;
    snprintf(path, sizeof path, "%s/bad/bin/python", root);
    if (ll_pyenv_find(path, &env, err, sizeof err) == 0 || !strstr(err, "names no Python version"))
        goto out;
    snprintf(path, sizeof path, "%s/none/bin/python", root);
    if (ll_pyenv_find(path, &env, err, sizeof err) == 0 || !strstr(err, "not an executable"))
        goto out;
    /* The build's Python, as the kernel finds it by default. */
    if (access(LL_PYTHON_EXE, X_OK) == 0 && ll_pyenv_find(LL_PYTHON_EXE, &env, err, sizeof err) < 0)
        goto out;
    rc = 0;
    if (verbose)
        printf("(venv versions, refusals) ");
out:;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        rc = -1;
    return rc;
}

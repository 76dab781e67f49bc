/* ll_pyenv: which Python environment the embedded interpreter runs in.
 *
 * The kernel embeds one libpython (the one it was built against), but the
 * packages it imports (IPython, numpy, torch, ...) come from an environment:
 * Debian's system Python, or a virtual environment made from it, as a
 * kernel installed from that environment should (`looseleaf install
 * --sys-prefix` inside a venv, like ipykernel).  The environment is named by
 * its Python executable: CPython takes sys.prefix and sys.path from
 * sys.executable (a venv's pyvenv.cfg next to it), so the kernel, its pool's
 * zygotes and every worker see exactly what `python` in that environment
 * sees.
 *
 * The choice: LOOSELEAF_PYTHON (the kernelspec sets it for an environment)
 * or else the build's Python (make PYTHON=...).  An environment whose Python
 * is another version than the embedded libpython cannot work (its
 * site-packages hold extensions for another ABI): it is refused with a
 * message naming both versions.
 *
 * Any process, any thread (no state). */
#ifndef LL_PYENV_H
#define LL_PYENV_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char python[PATH_MAX]; /* the environment's Python executable, absolute (not resolved:
                            * a venv's bin/python is a symlink out of the venv) */
    char prefix[PATH_MAX]; /* its sys.prefix: the venv's directory, else the install prefix */
    bool venv;             /* a virtual environment (pyvenv.cfg) */
    int major, minor;      /* its Python version */
} ll_pyenv_t;

/* The build's Python (make PYTHON=...): what runs when nothing else is named. */
const char *ll_pyenv_build_python(void);

/* The Python version the binary embeds, "3.11". */
const char *ll_pyenv_embedded_version(void);

/* Describe the environment of PYTHON (NULL: $LOOSELEAF_PYTHON, else the
 * build's) into *ENV.  Returns 0, or -1 with a reason in ERR: PYTHON is not
 * an executable file, its version cannot be told, or it is not the version
 * the binary embeds (the reason names both). */
int ll_pyenv_find(const char *python, ll_pyenv_t *env, char *err, size_t errlen);

int ll_pyenv_selftest(bool verbose);

#endif

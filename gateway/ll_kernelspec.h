/* ll_kernelspec: the Jupyter kernelspec of LooseLeaf (kernel.json) and where
 * `looseleaf install` puts it.
 *
 * Used by the `install` subcommand and by the build (which runs
 * `looseleaf install --dir build/kernelspec/looseleaf` so that
 * `jupyter kernelspec install build/kernelspec/looseleaf` works too).  Runs
 * in the command-line process only; no threads. */
#ifndef LL_KERNELSPEC_H
#define LL_KERNELSPEC_H

#include <stdbool.h>
#include <stddef.h>

#define LL_KERNELSPEC_NAME         "looseleaf"
#define LL_KERNELSPEC_DISPLAY_NAME "LooseLeaf (GPU)"

typedef enum {
    LL_KERNELSPEC_USER =
        0, /* $JUPYTER_DATA_DIR or $XDG_DATA_HOME/jupyter or ~/.local/share/jupyter */
    LL_KERNELSPEC_SYSTEM,     /* /usr/local/share/jupyter */
    LL_KERNELSPEC_SYS_PREFIX, /* <prefix of the embedded Python>/share/jupyter */
    LL_KERNELSPEC_PREFIX,     /* <given prefix>/share/jupyter */
    LL_KERNELSPEC_DIR,        /* exactly the given directory */
} ll_kernelspec_where_t;

/* Whether NAME is a valid kernel name (what jupyter_client accepts:
 * letters, digits, '.', '_', '-'). */
bool ll_kernelspec_name_ok(const char *name);

/* Write into BUF the directory a kernelspec named NAME goes to.  ARG is the
 * prefix (PREFIX) or the directory (DIR); ENV_PREFIX is the sys.prefix of
 * the environment the kernel runs in (SYS_PREFIX); else ignored.  Returns 0,
 * or -1 with a reason in ERR. */
int ll_kernelspec_dir(ll_kernelspec_where_t where, const char *arg, const char *env_prefix,
                      const char *name, char *buf, size_t len, char *err, size_t errlen);

/* What a kernel.json says (every string borrowed). */
typedef struct {
    const char *binary;       /* the kernel binary, an absolute path */
    const char *display_name; /* NULL: LL_KERNELSPEC_DISPLAY_NAME */
    const char *python;       /* the environment's Python (kernel/ll_pyenv.h), set as the
                               * kernel's LOOSELEAF_PYTHON; NULL: the build's Python */
} ll_kernelspec_t;

/* The kernel.json text of SPEC.  Returns a malloc'd string (the caller
 * frees it) or NULL. */
char *ll_kernelspec_json(const ll_kernelspec_t *spec);

/* Create DIR (and parents) and write DIR/kernel.json and the launcher icon
 * atomically.  Returns 0, or -1 with a reason in ERR. */
int ll_kernelspec_write(const char *dir, const ll_kernelspec_t *spec, char *err, size_t errlen);

/* The name of the JupyterLab extension that sends edit-time hints. */
#define LL_LABEXT_NAME "looseleaf-hints"

/* Edit-time hints from JupyterLab 4 and Notebook 7: write the prebuilt
 * extension gateway/ll_labext.js (package.json and static/remoteEntry.<hash>.js)
 * into JUPYTER_DIR/labextensions/looseleaf-hints, for every JupyterLab that
 * reads that data directory.  It sends the code cell being edited to a
 * LooseLeaf kernel on a looseleaf.prefetch comm, and nothing to any other
 * kernel; typing, keys and popups stay JupyterLab's own.  ON false removes
 * it.  Either way the settings override of earlier releases
 * (lab/settings/overrides.d/looseleaf.json, continuous hinting, whose
 * completer accepted on Enter) is removed.  Returns 0, or -1 with a reason
 * in ERR. */
int ll_kernelspec_hints(const char *jupyter_dir, bool on, char *err, size_t errlen);

/* Absolute path of the running binary into BUF.  Returns 0 or -1. */
int ll_kernelspec_self_path(char *buf, size_t len);

int ll_kernelspec_selftest(bool verbose);

#endif

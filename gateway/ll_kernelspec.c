/* ll_kernelspec: kernel.json writing for `looseleaf install` and the build
 * (see ll_kernelspec.h).  Command-line process, single-threaded.
 *
 * The JSON is produced with jansson so that any binary path is escaped
 * correctly; the file is written to a temporary name and renamed, so a
 * frontend listing kernelspecs never reads half a file. */
#include "gateway/ll_kernelspec.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/ll_wire.h"

/* The launcher icon (JupyterLab shows logo-svg.svg from the kernelspec
 * directory): a loose leaf, drawn here so the installed binary needs no
 * resource files. */
static const char s_logo_svg[] =
    "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 64 64\" width=\"64\" height=\"64\">\n"
    "  <path d=\"M10 54 C10 26 26 10 56 8 C54 38 38 54 10 54 Z\" fill=\"#3c9a4a\"/>\n"
    "  <path d=\"M10 54 C24 40 36 28 50 14\" stroke=\"#e8f5e9\" stroke-width=\"3\" "
    "fill=\"none\" stroke-linecap=\"round\"/>\n"
    "</svg>\n";

bool ll_kernelspec_name_ok(const char *name)
{
    if (!name || !*name || strlen(name) > 64)
        return false;
    for (const char *p = name; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok)
            return false;
    }
    return strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

int ll_kernelspec_dir(ll_kernelspec_where_t where, const char *arg, const char *env_prefix,
                      const char *name, char *buf, size_t len, char *err, size_t errlen)
{
    char data[PATH_MAX];
    const char *env;
    int n;

    if (where != LL_KERNELSPEC_DIR && !ll_kernelspec_name_ok(name)) {
        snprintf(err, errlen, "invalid kernel name '%s' (use letters, digits, '.', '_', '-')",
                 name ? name : "");
        return -1;
    }
    switch (where) {
    case LL_KERNELSPEC_USER:
        if ((env = getenv("JUPYTER_DATA_DIR")) && *env)
            n = snprintf(data, sizeof data, "%s", env);
        else if ((env = getenv("XDG_DATA_HOME")) && *env)
            n = snprintf(data, sizeof data, "%s/jupyter", env);
        else if ((env = getenv("HOME")) && *env)
            n = snprintf(data, sizeof data, "%s/.local/share/jupyter", env);
        else {
            snprintf(err, errlen, "no JUPYTER_DATA_DIR and no HOME: cannot find the user data dir");
            return -1;
        }
        break;
    case LL_KERNELSPEC_SYSTEM: n = snprintf(data, sizeof data, "/usr/local/share/jupyter"); break;
    case LL_KERNELSPEC_SYS_PREFIX:
        if (!env_prefix || !*env_prefix) {
            snprintf(err, errlen, "--sys-prefix: no environment to install into");
            return -1;
        }
        n = snprintf(data, sizeof data, "%s/share/jupyter", env_prefix);
        break;
    case LL_KERNELSPEC_PREFIX:
        if (!arg || !*arg) {
            snprintf(err, errlen, "--prefix needs a directory");
            return -1;
        }
        n = snprintf(data, sizeof data, "%s/share/jupyter", arg);
        break;
    case LL_KERNELSPEC_DIR:
        if (!arg || !*arg) {
            snprintf(err, errlen, "--dir needs a directory");
            return -1;
        }
        n = snprintf(buf, len, "%s", arg);
        if (n < 0 || (size_t) n >= len) {
            snprintf(err, errlen, "directory name too long");
            return -1;
        }
        return 0;
    default: snprintf(err, errlen, "unknown install location"); return -1;
    }
    if (n < 0 || (size_t) n >= sizeof data) {
        snprintf(err, errlen, "data directory name too long");
        return -1;
    }
    n = snprintf(buf, len, "%s/kernels/%s", data, name);
    if (n < 0 || (size_t) n >= len) {
        snprintf(err, errlen, "kernelspec directory name too long");
        return -1;
    }
    return 0;
}

char *ll_kernelspec_json(const ll_kernelspec_t *spec)
{
    /* metadata.debugger: JupyterLab offers its debugger panel only for kernels
     * whose spec says so (as ipykernel's does); the kernel serves it with
     * debugpy from the environment (looseleaf_kernel/debugger.py). */
    json_t *j = json_pack(
        "{s:[s,s,s], s:s, s:s, s:s, s:s, s:{s:b}}", "argv", spec->binary, "-f", "{connection_file}",
        "display_name", spec->display_name ? spec->display_name : LL_KERNELSPEC_DISPLAY_NAME,
        "language", "python", "interrupt_mode", "signal", "kernel_protocol_version",
        LL_PROTOCOL_VERSION, "metadata", "debugger", 1);
    if (!j)
        return NULL;
    /* An installed kernel starts the user's host pool (its base zygote
     * importing torch: seconds) 200 ms after it starts, so the session's
     * first GPU cell finds it ready (ll_exec.c). */
    json_t *env = json_pack("{s:s}", "LOOSELEAF_POOL_START_MS", "200");
    if (spec->python)
        json_object_set_new(env, "LOOSELEAF_PYTHON", json_string(spec->python));
    json_object_set_new(j, "env", env);
    char *text = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(j);
    return text;
}

/* mkdir -p */
static int s_mkdirs(const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s", dir);
    if (n < 0 || (size_t) n >= sizeof path) {
        snprintf(err, errlen, "directory name too long");
        return -1;
    }
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(path, 0755) < 0 && errno != EEXIST) {
                snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
                return -1;
            }
            *p = saved;
            if (saved == '\0')
                break;
        }
    }
    return 0;
}

/* Write TEXT to DIR/NAME atomically (temporary name, then rename). */
static int s_write_file(const char *dir, const char *name, const char *text, char *err,
                        size_t errlen)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    int m = snprintf(tmp, sizeof tmp, "%s/.%s.%d", dir, name, (int) getpid());
    if (n < 0 || (size_t) n >= sizeof path || m < 0 || (size_t) m >= sizeof tmp) {
        snprintf(err, errlen, "directory name too long");
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    bool ok = fputs(text, f) >= 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) < 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int ll_kernelspec_write(const char *dir, const ll_kernelspec_t *spec, char *err, size_t errlen)
{
    if (!spec->binary || spec->binary[0] != '/') {
        snprintf(err, errlen, "the kernel binary path must be absolute");
        return -1;
    }
    if (s_mkdirs(dir, err, errlen) < 0)
        return -1;
    char *text = ll_kernelspec_json(spec);
    if (!text) {
        snprintf(err, errlen, "cannot build kernel.json");
        return -1;
    }
    size_t len = strlen(text);
    char *line = realloc(text, len + 2); /* end the file with a newline */
    if (!line) {
        free(text);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(line + len, "\n", 2);
    int rc = s_write_file(dir, "logo-svg.svg", s_logo_svg, err, errlen);
    if (rc == 0)
        rc = s_write_file(dir, "kernel.json", line, err, errlen);
    free(line);
    return rc;
}

/* The settings override that turns continuous hinting on (ll_kernelspec.h). */
static const char s_hints_json[] = "{\n"
                                   " \"@jupyterlab/completer-extension:manager\": {\n"
                                   "  \"autoCompletion\": true\n"
                                   " }\n"
                                   "}\n";

int ll_kernelspec_hints(const char *jupyter_dir, bool on, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    int n = snprintf(dir, sizeof dir, "%s/lab/settings/overrides.d", jupyter_dir);
    if (n < 0 || (size_t) n >= sizeof dir) {
        snprintf(err, errlen, "directory name too long");
        return -1;
    }
    if (!on) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/looseleaf.json", dir);
        if (unlink(path) < 0 && errno != ENOENT) {
            snprintf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (s_mkdirs(dir, err, errlen) < 0)
        return -1;
    return s_write_file(dir, "looseleaf.json", s_hints_json, err, errlen);
}

int ll_kernelspec_self_path(char *buf, size_t len)
{
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0)
        return -1;
    path[n] = '\0';
    if ((size_t) n >= len)
        return -1;
    memcpy(buf, path, (size_t) n + 1);
    return 0;
}

/* ---- self-test ----------------------------------------------------------- */

int ll_kernelspec_selftest(bool verbose)
{
    char tmpl[] = "/tmp/ll_kernelspec_XXXXXX";
    char dir[PATH_MAX], err[256], file[PATH_MAX + 16];
    int rc = -1;
    json_t *spec = NULL;
    if (!mkdtemp(tmpl))
        return -1;

    if (ll_kernelspec_name_ok("bad/name") || ll_kernelspec_name_ok("") ||
        ll_kernelspec_name_ok("..") || !ll_kernelspec_name_ok("looseleaf-2.x_y"))
        goto out;
    if (ll_kernelspec_dir(LL_KERNELSPEC_USER, NULL, NULL, "a b", dir, sizeof dir, err,
                          sizeof err) == 0)
        goto out;

    /* The user location honours JUPYTER_DATA_DIR. */
    char *old = getenv("JUPYTER_DATA_DIR") ? strdup(getenv("JUPYTER_DATA_DIR")) : NULL;
    setenv("JUPYTER_DATA_DIR", tmpl, 1);
    int drc = ll_kernelspec_dir(LL_KERNELSPEC_USER, NULL, NULL, "looseleaf", dir, sizeof dir, err,
                                sizeof err);
    if (old) {
        setenv("JUPYTER_DATA_DIR", old, 1);
        free(old);
    } else {
        unsetenv("JUPYTER_DATA_DIR");
    }
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/kernels/looseleaf", tmpl);
    if (drc != 0 || strcmp(dir, want) != 0)
        goto out;
    if (ll_kernelspec_dir(LL_KERNELSPEC_PREFIX, "/opt/x", NULL, "k", want, sizeof want, err,
                          sizeof err) != 0 ||
        strcmp(want, "/opt/x/share/jupyter/kernels/k") != 0)
        goto out;
    /* --sys-prefix: the environment's prefix, and none is an error. */
    if (ll_kernelspec_dir(LL_KERNELSPEC_SYS_PREFIX, NULL, "/venv", "k", want, sizeof want, err,
                          sizeof err) != 0 ||
        strcmp(want, "/venv/share/jupyter/kernels/k") != 0 ||
        ll_kernelspec_dir(LL_KERNELSPEC_SYS_PREFIX, NULL, NULL, "k", want, sizeof want, err,
                          sizeof err) == 0)
        goto out;

    /* Write (parents created), read back, check every field. */
    ll_kernelspec_t ks = {.binary = "/path/with \"quote\"/looseleaf", .python = "/venv/bin/python"};
    if (ll_kernelspec_write(dir, &ks, err, sizeof err) != 0) {
        fprintf(stderr, "ll_kernelspec selftest: %s\n", err);
        goto out;
    }
    ll_kernelspec_t rel = {.binary = "relative/looseleaf"};
    if (ll_kernelspec_write(dir, &rel, err, sizeof err) == 0)
        goto out;
    snprintf(file, sizeof file, "%s/kernel.json", dir);
    spec = json_load_file(file, 0, NULL);
    if (!spec)
        goto out;
    json_t *argv = json_object_get(spec, "argv");
    if (json_array_size(argv) != 3 ||
        strcmp(json_string_value(json_array_get(argv, 0)), "/path/with \"quote\"/looseleaf") != 0 ||
        strcmp(json_string_value(json_array_get(argv, 1)), "-f") != 0 ||
        strcmp(json_string_value(json_array_get(argv, 2)), "{connection_file}") != 0)
        goto out;
    if (strcmp(json_string_value(json_object_get(spec, "display_name")), "LooseLeaf (GPU)") != 0 ||
        strcmp(json_string_value(json_object_get(spec, "language")), "python") != 0 ||
        strcmp(json_string_value(json_object_get(spec, "interrupt_mode")), "signal") != 0 ||
        !json_is_true(json_object_get(json_object_get(spec, "metadata"), "debugger")) ||
        strcmp(json_string_value(json_object_get(spec, "kernel_protocol_version")),
               LL_PROTOCOL_VERSION) != 0 ||
        strcmp(json_string_value(json_object_get(json_object_get(spec, "env"), "LOOSELEAF_PYTHON")),
               "/venv/bin/python") != 0)
        goto out;
    /* The hints override, written and taken back. */
    if (ll_kernelspec_hints(tmpl, true, err, sizeof err) != 0)
        goto out;
    snprintf(file, sizeof file, "%s/lab/settings/overrides.d/looseleaf.json", tmpl);
    json_decref(spec);
    spec = json_load_file(file, 0, NULL);
    if (!json_is_true(json_object_get(
            json_object_get(spec, "@jupyterlab/completer-extension:manager"), "autoCompletion")))
        goto out;
    if (ll_kernelspec_hints(tmpl, false, err, sizeof err) != 0 || access(file, F_OK) == 0 ||
        ll_kernelspec_hints(tmpl, false, err, sizeof err) != 0)
        goto out;
    snprintf(file, sizeof file, "%s/logo-svg.svg", dir);
    if (access(file, R_OK) != 0)
        goto out;
    if (verbose)
        printf("(%s) ", file);
    rc = 0;
out:
    json_decref(spec);
    snprintf(file, sizeof file, "rm -rf '%s'", tmpl);
    if (system(file) != 0)
        rc = -1;
    return rc;
}

/* ll_kernelspec: kernel.json writing for `looseleaf install` and the build
 * (see ll_kernelspec.h).  Command-line process, single-threaded.
 *
 * The JSON is produced with jansson so that any binary path is escaped
 * correctly; the file is written to a temporary name and renamed, so a
 * frontend listing kernelspecs never reads half a file. */
#include "gateway/ll_kernelspec.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gateway/ll_curve.h"
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
    /* metadata.supported_encryption: jupyter_client 8.10+ provisions CurveZMQ
     * keys for a kernel whose spec lists "curve" (transport_encryption
     * "auto"), and refuses "required" for one that does not; declared only
     * when this binary's libzmq can serve them (gateway/ll_curve.h). */
    if (ll_curve_available())
        json_object_set_new(json_object_get(j, "metadata"), "supported_encryption",
                            json_pack("[s]", "curve"));
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

/* The edit-time hints extension (ll_kernelspec.h): gateway/ll_labext.js,
 * made a C string by the build (gateway/gateway.mk). */
static const char s_labext_js[] =
#include "gateway/ll_labext_js.h"
    ;

/* FNV-1a of TEXT: the script's file name changes with its content, so a
 * browser never runs a cached copy of an older one. */
static uint64_t s_fnv1a(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *) text; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return h;
}

/* Remove DIR's files whose names start with PREFIX, except KEEP (may be
 * NULL); a missing DIR is nothing to remove. */
static int s_remove_files(const char *dir, const char *prefix, const char *keep, char *err,
                          size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT
                   ? 0
                   : (snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno)), -1);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[PATH_MAX];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
            (keep && strcmp(e->d_name, keep) == 0))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) < 0 && errno != ENOENT) {
            snprintf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

/* unlink PATH; a missing file is not an error. */
static int s_unlink(const char *path, char *err, size_t errlen)
{
    if (unlink(path) < 0 && errno != ENOENT) {
        snprintf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int ll_kernelspec_hints(const char *jupyter_dir, bool on, char *err, size_t errlen)
{
    char ext[PATH_MAX], stat_dir[PATH_MAX + 16], path[PATH_MAX + 32], script[64];
    int n = snprintf(ext, sizeof ext, "%s/labextensions/%s", jupyter_dir, LL_LABEXT_NAME);
    if (n < 0 || (size_t) n >= sizeof ext - 64) {
        snprintf(err, errlen, "directory name too long");
        return -1;
    }
    snprintf(stat_dir, sizeof stat_dir, "%s/static", ext);
    /* Earlier releases turned JupyterLab's continuous hinting on with this
     * settings override; its completer then rewrote code on Enter.  Taken
     * back by every install. */
    snprintf(path, sizeof path, "%s/lab/settings/overrides.d/looseleaf.json", jupyter_dir);
    if (s_unlink(path, err, errlen) < 0)
        return -1;
    if (!on) {
        snprintf(path, sizeof path, "%s/package.json", ext);
        if (s_remove_files(stat_dir, "", NULL, err, errlen) < 0 || s_unlink(path, err, errlen) < 0)
            return -1;
        /* The directories go when empty; anything else put there stays. */
        rmdir(stat_dir);
        rmdir(ext);
        return 0;
    }
    snprintf(script, sizeof script, "remoteEntry.%016llx.js",
             (unsigned long long) s_fnv1a(s_labext_js));
    json_t *pkg = json_pack("{s:s, s:s, s:s, s:s, s:{s:b, s:{s:s+, s:s}}}", "name", LL_LABEXT_NAME,
                            "version", "1.0.0", "description",
                            "LooseLeaf: the cell being edited, sent to a LooseLeaf kernel so that "
                            "its GPU worker is ready when the cell runs",
                            "license", "BSD-3-Clause", "jupyterlab", "extension", 1, "_build",
                            "load", "static/", script, "extension", "./extension");
    char *text = pkg ? json_dumps(pkg, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(pkg);
    int rc = -1;
    if (!text)
        snprintf(err, errlen, "out of memory");
    else if (s_mkdirs(stat_dir, err, errlen) == 0 &&
             s_write_file(stat_dir, script, s_labext_js, err, errlen) == 0 &&
             s_write_file(ext, "package.json", text, err, errlen) == 0)
        /* An older script goes only once package.json names the new one. */
        rc = s_remove_files(stat_dir, "remoteEntry.", script, err, errlen);
    free(text);
    return rc;
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
    /* "curve" declared exactly when libzmq can serve it. */
    json_t *enc = json_object_get(json_object_get(spec, "metadata"), "supported_encryption");
    if ((enc != NULL) != ll_curve_available() ||
        (enc && strcmp(json_string_value(json_array_get(enc, 0)), "curve") != 0))
        goto out;
    /* The hints extension, written and taken back; the old settings override
     * goes in both cases. */
    char old_override[PATH_MAX + 64];
    snprintf(old_override, sizeof old_override, "%s/lab/settings/overrides.d", tmpl);
    if (s_mkdirs(old_override, err, sizeof err) != 0 ||
        s_write_file(old_override, "looseleaf.json", "{}\n", err, sizeof err) != 0)
        goto out;
    snprintf(old_override, sizeof old_override, "%s/lab/settings/overrides.d/looseleaf.json", tmpl);
    if (ll_kernelspec_hints(tmpl, true, err, sizeof err) != 0 || access(old_override, F_OK) == 0)
        goto out;
    snprintf(file, sizeof file, "%s/labextensions/" LL_LABEXT_NAME "/package.json", tmpl);
    json_decref(spec);
    spec = json_load_file(file, 0, NULL);
    const char *load = json_string_value(
        json_object_get(json_object_get(json_object_get(spec, "jupyterlab"), "_build"), "load"));
    if (!load || strncmp(load, "static/remoteEntry.", 19) != 0 ||
        strcmp(json_string_value(json_object_get(spec, "name")), LL_LABEXT_NAME) != 0)
        goto out;
    snprintf(file, sizeof file, "%s/labextensions/" LL_LABEXT_NAME "/%s", tmpl, load);
    if (access(file, R_OK) != 0)
        goto out;
    snprintf(file, sizeof file, "%s/labextensions/" LL_LABEXT_NAME, tmpl);
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

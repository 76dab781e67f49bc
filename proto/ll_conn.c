/* ll_conn: reading and validating the Jupyter connection file (run once by
 * the kernel's main thread at start-up, before any socket exists).
 *
 * Required: ip, shell_port, control_port, stdin_port, iopub_port, hb_port,
 * key.  Optional, with jupyter_client's defaults: transport ("tcp"),
 * signature_scheme ("hmac-sha256"), kernel_name (""), and the CurveZMQ
 * keypair curve_publickey / curve_secretkey (both or neither; their pairing
 * is checked where libzmq can, gateway/ll_curve.c).  Unknown fields are
 * ignored, as jupyter_client does.  Every error names the field, so a
 * frontend's mistake is fixed from the kernel's one-line message.
 *
 * The file holds the HMAC key, which lets whoever reads it run code as the
 * user: unless the caller allows it, a symbolic link (opened with
 * O_NOFOLLOW, so no swap between check and read) or a file another user or
 * group may read or write is refused, as ssh refuses a private key others
 * can read. */
#include "proto/ll_conn.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* A connection file is a few hundred bytes; refusing anything huge keeps a
 * wrong path (a log, /dev/zero) from eating memory. */
#define LL_CONN_MAX_FILE (1024 * 1024)

static const char *const s_port_fields[LL_CHAN_COUNT] = {
    [LL_CHAN_SHELL] = "shell_port", [LL_CHAN_CONTROL] = "control_port",
    [LL_CHAN_STDIN] = "stdin_port", [LL_CHAN_IOPUB] = "iopub_port",
    [LL_CHAN_HB] = "hb_port",
};

static const char *const s_channel_names[LL_CHAN_COUNT] = {
    [LL_CHAN_SHELL] = "shell", [LL_CHAN_CONTROL] = "control", [LL_CHAN_STDIN] = "stdin",
    [LL_CHAN_IOPUB] = "iopub", [LL_CHAN_HB] = "hb",
};

const char *ll_conn_channel_name(ll_channel_t ch)
{
    if ((int) ch < 0 || ch >= LL_CHAN_COUNT)
        return "?";
    return s_channel_names[ch];
}

static int s_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int s_fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const char *s_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Copy string field NAME into BUF (capacity LEN, NUL-terminated).  A missing
 * optional field yields DEFLT. */
static int s_get_string(const json_t *root, const char *name, bool required, const char *deflt,
                        char *buf, size_t len, char *err, size_t errlen)
{
    const json_t *v = json_object_get(root, name);
    if (!v) {
        if (required)
            return s_fail(err, errlen, "connection file: missing field \"%s\"", name);
        snprintf(buf, len, "%s", deflt);
        return 0;
    }
    if (!json_is_string(v))
        return s_fail(err, errlen, "connection file: field \"%s\" must be a string, not %s", name,
                      s_type_name(v));
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n >= len)
        return s_fail(err, errlen, "connection file: field \"%s\" is too long (%zu bytes, max %zu)",
                      name, n, len - 1);
    if (memchr(s, '\0', n))
        return s_fail(err, errlen, "connection file: field \"%s\" contains a NUL character", name);
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

/* The parsed tree holds a copy of the keys too; wipe them before freeing. */
static void s_wipe_key(json_t *root)
{
    static const char *const secrets[] = {"key", "curve_secretkey"};
    for (size_t i = 0; i < sizeof secrets / sizeof secrets[0]; i++) {
        json_t *key = json_object_get(root, secrets[i]);
        if (json_is_string(key))
            OPENSSL_cleanse((char *) json_string_value(key), json_string_length(key));
    }
}

/* A CurveZMQ key as the connection file carries it: 40 characters of the
 * Z85 alphabet (ZeroMQ RFC 32), the text form of 32 bytes. */
static bool s_z85_key(const char *s)
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";
    if (strlen(s) != 40)
        return false;
    for (; *s; s++)
        if (!strchr(alphabet, *s))
            return false;
    return true;
}

/* curve_publickey / curve_secretkey: optional, but a file with one and not
 * the other is a frontend's mistake that must not silently run unencrypted
 * (the frontend would then fail every handshake). */
static int s_get_curve(const json_t *root, ll_conn_info_t *info, char *err, size_t errlen)
{
    static const char *const names[2] = {"curve_publickey", "curve_secretkey"};
    char *bufs[2] = {info->curve_publickey, info->curve_secretkey};
    bool present[2];
    for (int i = 0; i < 2; i++) {
        present[i] = json_object_get(root, names[i]) != NULL;
        if (s_get_string(root, names[i], false, "", bufs[i], sizeof info->curve_publickey, err,
                         errlen))
            return -1; /* (too long: "max 40 bytes") */
        if (present[i] && !s_z85_key(bufs[i]))
            return s_fail(err, errlen,
                          "connection file: field \"%s\" is not a CurveZMQ key (40 characters "
                          "of Z85 text)",
                          names[i]);
    }
    if (present[0] != present[1])
        return s_fail(err, errlen,
                      "connection file: field \"%s\" is there but \"%s\" is missing; transport "
                      "encryption needs both",
                      names[present[0] ? 0 : 1], names[present[0] ? 1 : 0]);
    return 0;
}

int ll_conn_parse(const char *json_text, ll_conn_info_t *info, char *err, size_t errlen)
{
    if (!info)
        return s_fail(err, errlen, "connection file: no output structure");
    memset(info, 0, sizeof *info);
    if (!json_text)
        return s_fail(err, errlen, "connection file: no text");

    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return s_fail(err, errlen, "connection file: invalid JSON at line %d column %d: %s",
                      jerr.line, jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) {
        s_fail(err, errlen, "connection file: top level must be a JSON object, not %s",
               s_type_name(root));
        goto out_decref;
    }

    if (s_get_string(root, "transport", false, "tcp", info->transport, sizeof info->transport, err,
                     errlen))
        goto out_decref;
    bool tcp = strcmp(info->transport, "tcp") == 0;
    if (!tcp && strcmp(info->transport, "ipc") != 0) {
        s_fail(err, errlen,
               "connection file: field \"transport\" is \"%s\"; expected \"tcp\" or \"ipc\"",
               info->transport);
        goto out_decref;
    }

    if (s_get_string(root, "ip", true, NULL, info->ip, sizeof info->ip, err, errlen))
        goto out_decref;
    if (info->ip[0] == '\0') {
        s_fail(err, errlen, "connection file: field \"ip\" is empty");
        goto out_decref;
    }
    for (const char *c = info->ip; *c; c++)
        if ((unsigned char) *c < 0x20 || (*c == '/' && tcp)) {
            s_fail(err, errlen, "connection file: field \"ip\" contains an invalid character");
            goto out_decref;
        }

    for (int ch = 0; ch < LL_CHAN_COUNT; ch++) {
        const char *name = s_port_fields[ch];
        const json_t *v = json_object_get(root, name);
        if (!v) {
            s_fail(err, errlen, "connection file: missing field \"%s\"", name);
            goto out_decref;
        }
        if (!json_is_integer(v)) {
            s_fail(err, errlen, "connection file: field \"%s\" must be an integer, not %s", name,
                   s_type_name(v));
            goto out_decref;
        }
        json_int_t port = json_integer_value(v);
        /* Port 0 ("pick one") cannot work: the frontend already wrote the
         * port it will connect to. */
        if (port < 1 || port > 65535) {
            s_fail(err, errlen, "connection file: field \"%s\" is %lld; expected 1..65535", name,
                   (long long) port);
            goto out_decref;
        }
        info->ports[ch] = (int) port;
        for (int other = 0; other < ch; other++)
            if (info->ports[other] == info->ports[ch]) {
                s_fail(err, errlen, "connection file: fields \"%s\" and \"%s\" are both %d",
                       s_port_fields[other], name, info->ports[ch]);
                goto out_decref;
            }
    }

    if (!tcp) {
        /* ipc://<ip>-<port> is a unix socket path, whose length is bounded. */
        size_t max_path = sizeof(((struct sockaddr_un *) 0)->sun_path) - 1;
        if (strlen(info->ip) + 6 > max_path) {
            s_fail(err, errlen,
                   "connection file: field \"ip\" is too long for an ipc socket path "
                   "(%zu bytes, max %zu)",
                   strlen(info->ip), max_path - 6);
            goto out_decref;
        }
    }

    const json_t *key = json_object_get(root, "key");
    if (!key) {
        s_fail(err, errlen, "connection file: missing field \"key\"");
        goto out_decref;
    }
    if (!json_is_string(key)) {
        s_fail(err, errlen, "connection file: field \"key\" must be a string, not %s",
               s_type_name(key));
        goto out_decref;
    }
    /* jupyter_client uses the key's UTF-8 bytes as the HMAC key. */
    info->key_len = json_string_length(key);
    if (info->key_len > sizeof info->key) {
        s_fail(err, errlen, "connection file: field \"key\" is too long (%zu bytes, max %zu)",
               info->key_len, sizeof info->key);
        info->key_len = 0;
        goto out_decref;
    }
    memcpy(info->key, json_string_value(key), info->key_len);

    if (s_get_string(root, "signature_scheme", false, "hmac-sha256", info->signature_scheme,
                     sizeof info->signature_scheme, err, errlen))
        goto out_clear;
    /* With no key nothing is signed, so the scheme is moot (Jupyter allows
     * any value then). */
    if (info->key_len > 0 && strcmp(info->signature_scheme, "hmac-sha256") != 0) {
        s_fail(err, errlen,
               "connection file: field \"signature_scheme\" is \"%s\"; only "
               "\"hmac-sha256\" is supported",
               info->signature_scheme);
        goto out_clear;
    }

    if (s_get_string(root, "kernel_name", false, "", info->kernel_name, sizeof info->kernel_name,
                     err, errlen))
        goto out_clear;
    if (s_get_curve(root, info, err, errlen))
        goto out_clear;

    rc = 0;
    goto out_decref;
out_clear:
    ll_conn_clear(info);
out_decref:
    s_wipe_key(root);
    json_decref(root);
    return rc;
}

/* Open PATH for reading, refusing (unless FLAGS allow it) a symbolic link
 * and a file that is not ours alone.  A FILE, or NULL with ERR. */
static FILE *s_open_checked(const char *path, unsigned flags, char *err, size_t errlen)
{
    bool strict = !(flags & LL_CONN_ALLOW_INSECURE);
    const char *opt = "(--allow-insecure-connection-file accepts it anyway)";
    int fd = open(path, O_RDONLY | O_CLOEXEC | (strict ? O_NOFOLLOW : 0));
    if (fd < 0 && errno == ELOOP && strict) {
        s_fail(err, errlen,
               "connection file %s: is a symbolic link; the kernel reads its key only from a "
               "regular file %s",
               path, opt);
        return NULL;
    }
    if (fd < 0) {
        s_fail(err, errlen, "connection file %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        s_fail(err, errlen, "connection file %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        s_fail(err, errlen, "connection file %s: is a directory", path);
        close(fd);
        return NULL;
    }
    if (strict && (!S_ISREG(st.st_mode) || st.st_uid != geteuid())) {
        s_fail(err, errlen, "connection file %s: %s %s", path,
               !S_ISREG(st.st_mode) ? "is not a regular file" : "belongs to another user", opt);
        close(fd);
        return NULL;
    }
    if (strict && (st.st_mode & 077)) {
        s_fail(err, errlen,
               "connection file %s: mode %04o lets %s read or change it, and the key in it "
               "lets anyone who reads it run code as you; make it 0600 %s",
               path, (unsigned) (st.st_mode & 07777),
               (st.st_mode & 070) && (st.st_mode & 07) ? "group and others"
               : (st.st_mode & 070)                    ? "the group"
                                                       : "others",
               opt);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        s_fail(err, errlen, "connection file %s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int ll_conn_load(const char *path, unsigned flags, ll_conn_info_t *info, char *err, size_t errlen)
{
    if (info)
        memset(info, 0, sizeof *info);
    if (!path || !*path)
        return s_fail(err, errlen, "connection file: no path given");
    FILE *f = s_open_checked(path, flags, err, errlen);
    if (!f)
        return -1;
    char *text = malloc(LL_CONN_MAX_FILE + 1);
    if (!text) {
        fclose(f);
        return s_fail(err, errlen, "connection file %s: out of memory", path);
    }
    size_t n = fread(text, 1, LL_CONN_MAX_FILE + 1, f);
    int read_error = ferror(f) ? errno : 0;
    fclose(f);
    int rc;
    if (read_error)
        rc = s_fail(err, errlen, "connection file %s: %s", path, strerror(read_error));
    else if (n > LL_CONN_MAX_FILE)
        rc =
            s_fail(err, errlen, "connection file %s: larger than %d bytes", path, LL_CONN_MAX_FILE);
    else if (memchr(text, '\0', n))
        rc = s_fail(err, errlen, "connection file %s: contains a NUL byte, not JSON text", path);
    else {
        text[n] = '\0';
        char why[200];
        rc = ll_conn_parse(text, info, why, sizeof why);
        if (rc)
            /* why starts with "connection file: "; put the path in. */
            s_fail(err, errlen, "connection file %s:%s", path,
                   strncmp(why, "connection file:", 16) == 0 ? why + 16 : why);
    }
    OPENSSL_cleanse(text, n < LL_CONN_MAX_FILE ? n + 1 : LL_CONN_MAX_FILE + 1);
    free(text);
    return rc;
}

int ll_conn_endpoint(const ll_conn_info_t *info, ll_channel_t ch, char *buf, size_t len)
{
    if (!info || !buf || len == 0 || (int) ch < 0 || ch >= LL_CHAN_COUNT)
        return -1;
    int n;
    if (strcmp(info->transport, "ipc") == 0)
        /* jupyter_client's convention: the port becomes a path suffix. */
        n = snprintf(buf, len, "ipc://%s-%d", info->ip, info->ports[ch]);
    else if (strchr(info->ip, ':') && info->ip[0] != '[')
        /* An IPv6 literal needs brackets in a ZeroMQ endpoint. */
        n = snprintf(buf, len, "tcp://[%s]:%d", info->ip, info->ports[ch]);
    else
        n = snprintf(buf, len, "tcp://%s:%d", info->ip, info->ports[ch]);
    return n < 0 || (size_t) n >= len ? -1 : 0;
}

void ll_conn_clear(ll_conn_info_t *info)
{
    if (!info)
        return;
    OPENSSL_cleanse(info->key, sizeof info->key);
    info->key_len = 0;
    OPENSSL_cleanse(info->curve_secretkey, sizeof info->curve_secretkey);
}

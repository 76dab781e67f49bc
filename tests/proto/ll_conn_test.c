/* Self-test of proto/ll_conn (run by build/ll_selftest): valid files for
 * both transports, endpoint strings, and every bad case (missing or
 * mistyped fields, bad ports, keys, schemes) with a check that the error
 * names the field. */
#include "proto/ll_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int s_failures;

static void s_check(bool ok, const char *what, int line)
{
    if (!ok) {
        fprintf(stderr, "\n  ll_conn_test.c:%d: check failed: %s", line, what);
        s_failures++;
    }
}
#define LL_CHECK(cond) s_check((cond), #cond, __LINE__)

#define S_PORTS                                                          \
    "\"shell_port\": 5001, \"iopub_port\": 5002, \"stdin_port\": 5003, " \
    "\"control_port\": 5004, \"hb_port\": 5005"

static const char s_good[] =
    "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", " S_PORTS ", "
    "\"key\": \"a0436f6c-1916-498b-8eb9-e81ab9368e84\", \"signature_scheme\": \"hmac-sha256\", "
    "\"kernel_name\": \"looseleaf\", \"jupyter_extra\": [1, 2]}";

/* Parsing TEXT fails and the error mentions NEEDLE. */
static void s_expect_error(const char *text, const char *needle, int line)
{
    ll_conn_info_t info;
    char err[300] = "";
    int rc = ll_conn_parse(text, &info, err, sizeof err);
    if (rc != -1 || !strstr(err, needle)) {
        fprintf(stderr, "\n  ll_conn_test.c:%d: expected an error naming \"%s\", got rc=%d \"%s\"",
                line, needle, rc, err);
        s_failures++;
    }
    LL_CHECK(info.key_len == 0); /* a rejected file leaves no key behind */
}
#define S_EXPECT_ERROR(text, needle) s_expect_error((text), (needle), __LINE__)

static void s_test_good(void)
{
    ll_conn_info_t info;
    char err[300] = "";
    LL_CHECK(ll_conn_parse(s_good, &info, err, sizeof err) == 0);
    LL_CHECK(strcmp(info.transport, "tcp") == 0);
    LL_CHECK(strcmp(info.ip, "127.0.0.1") == 0);
    LL_CHECK(info.ports[LL_CHAN_SHELL] == 5001 && info.ports[LL_CHAN_IOPUB] == 5002 &&
             info.ports[LL_CHAN_STDIN] == 5003 && info.ports[LL_CHAN_CONTROL] == 5004 &&
             info.ports[LL_CHAN_HB] == 5005);
    LL_CHECK(info.key_len == 36 && memcmp(info.key, "a0436f6c", 8) == 0);
    LL_CHECK(strcmp(info.signature_scheme, "hmac-sha256") == 0);
    LL_CHECK(strcmp(info.kernel_name, "looseleaf") == 0);

    char ep[300];
    LL_CHECK(ll_conn_endpoint(&info, LL_CHAN_SHELL, ep, sizeof ep) == 0);
    LL_CHECK(strcmp(ep, "tcp://127.0.0.1:5001") == 0);
    LL_CHECK(ll_conn_endpoint(&info, LL_CHAN_HB, ep, sizeof ep) == 0);
    LL_CHECK(strcmp(ep, "tcp://127.0.0.1:5005") == 0);
    LL_CHECK(ll_conn_endpoint(&info, LL_CHAN_HB, ep, 10) == -1);
    LL_CHECK(ll_conn_endpoint(&info, LL_CHAN_COUNT, ep, sizeof ep) == -1);
    LL_CHECK(strcmp(ll_conn_channel_name(LL_CHAN_IOPUB), "iopub") == 0);
    LL_CHECK(strcmp(ll_conn_channel_name(LL_CHAN_COUNT), "?") == 0);

    ll_conn_clear(&info);
    LL_CHECK(info.key_len == 0 && info.key[0] == 0 && info.key[35] == 0);

    /* ipc: the port becomes a path suffix, as in jupyter_client. */
    LL_CHECK(ll_conn_parse("{\"transport\": \"ipc\", \"ip\": \"/tmp/kernel-ipc\", " S_PORTS
                           ", \"key\": \"k\"}",
                           &info, err, sizeof err) == 0);
    LL_CHECK(ll_conn_endpoint(&info, LL_CHAN_CONTROL, ep, sizeof ep) == 0);
    LL_CHECK(strcmp(ep, "ipc:///tmp/kernel-ipc-5004") == 0);

    /* Optional fields default like jupyter_client; IPv6 gets brackets. */
    LL_CHECK(ll_conn_parse("{\"ip\": \"::1\", " S_PORTS ", \"key\": \"k\"}", &info, err,
                           sizeof err) == 0);
    LL_CHECK(strcmp(info.transport, "tcp") == 0);
    LL_CHECK(strcmp(info.signature_scheme, "hmac-sha256") == 0);
    LL_CHECK(info.kernel_name[0] == '\0');
    LL_CHECK(ll_conn_endpoint(&info, LL_CHAN_SHELL, ep, sizeof ep) == 0);
    LL_CHECK(strcmp(ep, "tcp://[::1]:5001") == 0);

    /* Empty key: unsigned, and then any scheme is accepted. */
    LL_CHECK(ll_conn_parse("{\"ip\": \"0.0.0.0\", " S_PORTS ", \"key\": \"\", "
                           "\"signature_scheme\": \"hmac-md5\"}",
                           &info, err, sizeof err) == 0);
    LL_CHECK(info.key_len == 0);

    /* Longest allowed key (512 bytes). */
    char text[2048];
    char key[513];
    memset(key, 'k', 512);
    key[512] = '\0';
    snprintf(text, sizeof text, "{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"%s\"}", key);
    LL_CHECK(ll_conn_parse(text, &info, err, sizeof err) == 0);
    LL_CHECK(info.key_len == 512);
}

static void s_test_bad(void)
{
    char text[4096];
    /* Each required field missing in turn. */
    const char *required[] = {"ip",           "shell_port", "iopub_port", "stdin_port",
                              "control_port", "hb_port",    "key"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char without[1024];
        snprintf(without, sizeof without, "%s", s_good);
        char pattern[64];
        snprintf(pattern, sizeof pattern, "\"%s\"", required[i]);
        /* Rename the field so it is absent without breaking the JSON. */
        char *at = strstr(without, pattern);
        LL_CHECK(at != NULL);
        if (!at)
            continue;
        at[1] = 'X';
        char needle[64];
        snprintf(needle, sizeof needle, "missing field \"%s\"", required[i]);
        S_EXPECT_ERROR(without, needle);
    }

    /* Wrong types. */
    S_EXPECT_ERROR("{\"ip\": 127, " S_PORTS ", \"key\": \"k\"}", "\"ip\" must be a string");
    S_EXPECT_ERROR("{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": 5}", "\"key\" must be a string");
    S_EXPECT_ERROR("{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": null}",
                   "\"key\" must be a string");
    S_EXPECT_ERROR("{\"transport\": 1, \"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"k\"}",
                   "\"transport\" must be a string");
    S_EXPECT_ERROR("{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"k\", \"signature_scheme\": []}",
                   "\"signature_scheme\" must be a string");
    S_EXPECT_ERROR("{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"k\", \"kernel_name\": {}}",
                   "\"kernel_name\" must be a string");

    /* Bad ports: string, real, 0, negative, too large, duplicate. */
    const char *bad_ports[] = {"\"5001\"", "5001.5", "0",    "-1",
                               "65536",    "true",   "null", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_ports / sizeof bad_ports[0]; i++) {
        snprintf(text, sizeof text,
                 "{\"ip\": \"127.0.0.1\", \"shell_port\": 5001, \"iopub_port\": 5002, "
                 "\"stdin_port\": 5003, \"control_port\": 5004, \"hb_port\": %s, \"key\": \"k\"}",
                 bad_ports[i]);
        S_EXPECT_ERROR(text, i == 7 ? "invalid JSON" : "\"hb_port\"");
    }
    S_EXPECT_ERROR(
        "{\"ip\": \"127.0.0.1\", \"shell_port\": 5001, \"iopub_port\": 5001, "
        "\"stdin_port\": 5003, \"control_port\": 5004, \"hb_port\": 5005, \"key\": \"k\"}",
        "\"shell_port\" and \"iopub_port\" are both 5001");

    /* Unknown transport and scheme; empty ip; key too long. */
    S_EXPECT_ERROR("{\"transport\": \"udp\", \"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"k\"}",
                   "\"transport\" is \"udp\"");
    S_EXPECT_ERROR("{\"ip\": \"127.0.0.1\", " S_PORTS
                   ", \"key\": \"k\", \"signature_scheme\": \"hmac-md5\"}",
                   "\"signature_scheme\" is \"hmac-md5\"");
    S_EXPECT_ERROR("{\"ip\": \"\", " S_PORTS ", \"key\": \"k\"}", "\"ip\" is empty");
    S_EXPECT_ERROR("{\"ip\": \"1.2.3.4/8\", " S_PORTS ", \"key\": \"k\"}", "\"ip\"");
    char key[600];
    memset(key, 'k', 513);
    key[513] = '\0';
    snprintf(text, sizeof text, "{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"%s\"}", key);
    S_EXPECT_ERROR(text, "\"key\" is too long");
    char ip[300];
    memset(ip, 'a', 120);
    ip[0] = '/';
    ip[120] = '\0';
    snprintf(text, sizeof text,
             "{\"transport\": \"ipc\", \"ip\": \"%s\", " S_PORTS ", \"key\": \"k\"}", ip);
    S_EXPECT_ERROR(text, "\"ip\" is too long");
    memset(ip, 'a', 299);
    ip[299] = '\0';
    snprintf(text, sizeof text, "{\"ip\": \"%s\", " S_PORTS ", \"key\": \"k\"}", ip);
    S_EXPECT_ERROR(text, "\"ip\" is too long");
    S_EXPECT_ERROR("{\"ip\": \"a\\u0000b\", " S_PORTS ", \"key\": \"k\"}", "\"ip\"");

    /* Not JSON, or not an object. */
    S_EXPECT_ERROR("", "invalid JSON");
    S_EXPECT_ERROR("{\"ip\": ", "invalid JSON");
    S_EXPECT_ERROR("not json", "invalid JSON");
    S_EXPECT_ERROR("[1, 2]", "must be a JSON object");

    ll_conn_info_t info;
    char err[300];
    LL_CHECK(ll_conn_parse(NULL, &info, err, sizeof err) == -1);
    LL_CHECK(ll_conn_parse(s_good, NULL, err, sizeof err) == -1);
    LL_CHECK(ll_conn_parse(s_good, &info, NULL, 0) == 0); /* no error buffer is fine */
}

/* Write a file as Jupyter does: mode 0600. */
static int s_write_file(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    size_t n = fwrite(data, 1, len, f);
    fclose(f);
    return n == len ? 0 : -1;
}

static void s_test_files(void)
{
    char dir[] = "/tmp/ll_conn_test.XXXXXX";
    LL_CHECK(mkdtemp(dir) != NULL);
    char path[256], err[600];
    ll_conn_info_t info;

    snprintf(path, sizeof path, "%s/kernel.json", dir);
    LL_CHECK(s_write_file(path, s_good, strlen(s_good)) == 0);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == 0);
    LL_CHECK(info.ports[LL_CHAN_HB] == 5005);

    /* A file others may read (the key lets them run code as us) or a
     * symbolic link is refused, naming the problem and the way out; the
     * flag accepts both. */
    chmod(path, 0644);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1 && info.key_len == 0);
    LL_CHECK(strstr(err, path) && strstr(err, "mode 0644") && strstr(err, "others") &&
             strstr(err, "--allow-insecure-connection-file"));
    chmod(path, 0640);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1 && strstr(err, "the group"));
    LL_CHECK(ll_conn_load(path, LL_CONN_ALLOW_INSECURE, &info, err, sizeof err) == 0);
    chmod(path, 0600);
    char link[300];
    snprintf(link, sizeof link, "%s/link.json", dir);
    LL_CHECK(symlink(path, link) == 0);
    LL_CHECK(ll_conn_load(link, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, link) && strstr(err, "symbolic link") &&
             strstr(err, "--allow-insecure-connection-file"));
    LL_CHECK(ll_conn_load(link, LL_CONN_ALLOW_INSECURE, &info, err, sizeof err) == 0);
    unlink(link);

    /* The path is named in every file-level error. */
    snprintf(path, sizeof path, "%s/missing.json", dir);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, path) && strstr(err, "No such file"));

    LL_CHECK(ll_conn_load(dir, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, dir) != NULL);

    snprintf(path, sizeof path, "%s/bad.json", dir);
    LL_CHECK(s_write_file(path, "{\"ip\": ", 7) == 0);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, path) && strstr(err, "invalid JSON"));

    snprintf(path, sizeof path, "%s/field.json", dir);
    const char *no_key = "{\"ip\": \"127.0.0.1\", " S_PORTS "}";
    LL_CHECK(s_write_file(path, no_key, strlen(no_key)) == 0);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, path) && strstr(err, "missing field \"key\""));

    snprintf(path, sizeof path, "%s/nul.json", dir);
    LL_CHECK(s_write_file(path, "{\"ip\"\0}", 7) == 0);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, "NUL") != NULL);

    snprintf(path, sizeof path, "%s/huge.json", dir);
    size_t huge_len = 2 * 1024 * 1024;
    char *huge = malloc(huge_len);
    memset(huge, ' ', huge_len);
    LL_CHECK(s_write_file(path, huge, huge_len) == 0);
    free(huge);
    LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1);
    LL_CHECK(strstr(err, "larger than") != NULL);
    unlink(path);

    /* Unreadable (root reads anything, so only meaningful for other users). */
    snprintf(path, sizeof path, "%s/secret.json", dir);
    LL_CHECK(s_write_file(path, s_good, strlen(s_good)) == 0);
    chmod(path, 0);
    if (geteuid() != 0) {
        LL_CHECK(ll_conn_load(path, 0, &info, err, sizeof err) == -1);
        LL_CHECK(strstr(err, "Permission denied") != NULL);
    }

    LL_CHECK(ll_conn_load(NULL, 0, &info, err, sizeof err) == -1);
    LL_CHECK(ll_conn_load("", 0, &info, err, sizeof err) == -1);

    const char *names[] = {"kernel.json", "bad.json", "field.json", "nul.json", "secret.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* The CurveZMQ keypair (transport encryption): both or neither, each 40
 * characters of Z85; the secret is wiped with the HMAC key. */
#define S_PUB        "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
#define S_SEC        "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
#define S_CURVE_BASE "{\"ip\": \"127.0.0.1\", " S_PORTS ", \"key\": \"k\""

static void s_test_curve(void)
{
    ll_conn_info_t info;
    char err[300] = "";
    LL_CHECK(ll_conn_parse(s_good, &info, err, sizeof err) == 0);
    LL_CHECK(info.curve_publickey[0] == 0 && info.curve_secretkey[0] == 0);
    LL_CHECK(ll_conn_parse(S_CURVE_BASE ", \"curve_publickey\": \"" S_PUB
                                        "\", \"curve_secretkey\": \"" S_SEC "\"}",
                           &info, err, sizeof err) == 0);
    LL_CHECK(strcmp(info.curve_publickey, S_PUB) == 0 && strcmp(info.curve_secretkey, S_SEC) == 0);
    ll_conn_clear(&info);
    LL_CHECK(info.curve_secretkey[0] == 0 && info.curve_secretkey[39] == 0);
    LL_CHECK(strcmp(info.curve_publickey, S_PUB) == 0); /* public: nothing to hide */

    S_EXPECT_ERROR(S_CURVE_BASE ", \"curve_publickey\": \"" S_PUB "\"}",
                   "\"curve_secretkey\" is missing");
    S_EXPECT_ERROR(S_CURVE_BASE ", \"curve_secretkey\": \"" S_SEC "\"}",
                   "\"curve_publickey\" is missing");
    S_EXPECT_ERROR(S_CURVE_BASE ", \"curve_publickey\": \"short\", \"curve_secretkey\": \"" S_SEC
                                "\"}",
                   "\"curve_publickey\" is not a CurveZMQ key");
    S_EXPECT_ERROR(S_CURVE_BASE
                   ", \"curve_publickey\": \"" S_PUB
                   "\", \"curve_secretkey\": \"JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh\\\\\"}",
                   "\"curve_secretkey\" is not a CurveZMQ key");
    S_EXPECT_ERROR(S_CURVE_BASE ", \"curve_publickey\": \"" S_PUB
                                "x\", \"curve_secretkey\": \"" S_SEC "\"}",
                   "\"curve_publickey\" is too long");
    S_EXPECT_ERROR(S_CURVE_BASE ", \"curve_publickey\": 5, \"curve_secretkey\": \"" S_SEC "\"}",
                   "\"curve_publickey\" must be a string");
}

int ll_conn_selftest(bool verbose)
{
    s_failures = 0;
    s_test_good();
    s_test_bad();
    s_test_files();
    s_test_curve();
    if (s_failures)
        fprintf(stderr, "\n");
    return s_failures ? -1 : 0;
}

/* bench_wire: encode and decode time per Jupyter message, against
 * jupyter_client's Session.serialize / deserialize measured in the same run
 * by /usr/bin/python3.  Two workloads, both stream messages in reply to an
 * execute_request (the kernel's hottest path while a cell prints):
 *   1 KiB   one ~1 KiB message (the figure)
 *   64 KiB  a coalesced chunk of 1000 printed lines, as the iopub coalescer
 *           sends while a cell prints a million lines
 * Prints per-message times and the ratio ours / jupyter_client (lower is
 * better).  Decode includes signature verification and the replay check.
 *
 * Usage: bench_wire [iterations of the 1 KiB workload]   (run by make bench) */
#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "proto/ll_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const unsigned char s_key[] = "a0436f6c-1916-498b-8eb9-e81ab9368e84";
#define S_ROUNDS 5

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

/* The text of a stream message: LINES lines, LINE_LEN bytes each with '\n'. */
static char *s_text(int lines, int line_len)
{
    char *text = malloc((size_t) lines * (size_t) line_len + 1);
    for (int l = 0; l < lines; l++) {
        char *p = text + (size_t) l * (size_t) line_len;
        memset(p, 'x', (size_t) line_len - 1);
        p[line_len - 1] = '\n';
    }
    text[(size_t) lines * (size_t) line_len] = '\0';
    return text;
}

/* The same workload in Python: prints "encode_us decode_us bytes". */
static const char s_python[] =
    "import sys, time, statistics\n"
    "from jupyter_client.session import Session\n"
    "n, lines, line_len = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])\n"
    "key = b'a0436f6c-1916-498b-8eb9-e81ab9368e84'\n"
    "client, kernel = Session(key=key), Session(key=key)\n"
    "req = client.msg('execute_request', content={'code': 'for i in range(10**6): print(i)',\n"
    "                 'silent': False, 'store_history': True, 'user_expressions': {},\n"
    "                 'allow_stdin': True, 'stop_on_error': True})\n"
    "text = ('x' * (line_len - 1) + '\\n') * lines\n"
    "def encode_round():\n"
    "    t = time.perf_counter()\n"
    "    for _ in range(n):\n"
    "        msg = kernel.msg('stream', content={'name': 'stdout', 'text': text}, parent=req)\n"
    "        frames = kernel.serialize(msg, ident=[b'kernel.x.stream'])\n"
    "    return (time.perf_counter() - t) / n * 1e6, frames\n"
    "def decode_round():\n"
    "    wire = [client.serialize(client.msg('stream', content={'name': 'stdout', 'text': text},\n"
    "            parent=req), ident=[b'kernel.x.stream']) for _ in range(n)]\n"
    "    t = time.perf_counter()\n"
    "    for frames in wire:\n"
    "        idents, rest = kernel.feed_identities(frames)\n"
    "        kernel.deserialize(rest)\n"
    "    return (time.perf_counter() - t) / n * 1e6\n"
    "enc, dec = [], []\n"
    "for _ in range(5):\n"
    "    e, frames = encode_round(); enc.append(e); dec.append(decode_round())\n"
    "size = sum(len(f) for f in frames)\n"
    "print(statistics.median(enc), statistics.median(dec), size)\n";

static int s_python_bench(int n, int lines, int line_len, double *enc_us, double *dec_us,
                          long *bytes)
{
    char path[] = "/tmp/bench_wire_XXXXXX.py";
    int fd = mkstemps(path, 3);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    fputs(s_python, f);
    fclose(f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %d %d %d", path, n, lines, line_len);
    FILE *p = popen(cmd, "r");
    int rc = -1;
    if (p) {
        if (fscanf(p, "%lf %lf %ld", enc_us, dec_us, bytes) == 3)
            rc = 0;
        if (pclose(p) != 0)
            rc = -1;
    }
    remove(path);
    return rc;
}

/* Median encode and decode microseconds per message for one workload. */
static int s_c_bench(ll_session_t *client, ll_session_t *kernel, const ll_msg_t *req, int n,
                     const char *text, double *enc_us, double *dec_us, long *bytes)
{
    double enc[S_ROUNDS], dec[S_ROUNDS];
    zmsg_t **wire = calloc((size_t) n, sizeof *wire);
    for (int r = 0; r < S_ROUNDS; r++) {
        /* Encode: build the reply (fresh header, parent shared) and sign it. */
        double t0 = ll_clock_s();
        for (int i = 0; i < n; i++) {
            ll_msg_t *msg = ll_msg_new(kernel, "stream", req,
                                       json_pack("{s:s,s:s}", "name", "stdout", "text", text));
            zmsg_t *frames = ll_session_encode(kernel, msg);
            if (i == 0 && r == 0)
                *bytes = (long) zmsg_content_size(frames);
            zmsg_destroy(&frames);
            ll_msg_destroy(&msg);
        }
        enc[r] = (ll_clock_s() - t0) / n * 1e6;

        /* Decode: distinct messages (the replay history sees each once). */
        for (int i = 0; i < n; i++) {
            ll_msg_t *msg = ll_msg_new(client, "stream", req,
                                       json_pack("{s:s,s:s}", "name", "stdout", "text", text));
            wire[i] = ll_session_encode(client, msg);
            zmsg_pushstr(wire[i], "kernel.x.stream");
            ll_msg_destroy(&msg);
        }
        char why[256];
        t0 = ll_clock_s();
        for (int i = 0; i < n; i++) {
            ll_msg_t *msg = ll_session_decode(kernel, &wire[i], why, sizeof why);
            if (!msg) {
                fprintf(stderr, "bench_wire: decode failed: %s\n", why);
                free(wire);
                return -1;
            }
            ll_msg_destroy(&msg);
        }
        dec[r] = (ll_clock_s() - t0) / n * 1e6;
    }
    free(wire);
    qsort(enc, S_ROUNDS, sizeof enc[0], s_cmp_double);
    qsort(dec, S_ROUNDS, sizeof dec[0], s_cmp_double);
    *enc_us = enc[S_ROUNDS / 2];
    *dec_us = dec[S_ROUNDS / 2];
    return 0;
}

int main(int argc, char **argv)
{
    ll_log_init('A');
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    if (n < 100 || n > 10000000) {
        fprintf(stderr, "bench_wire: iterations must be 100..10000000\n");
        return 2;
    }
    ll_session_t *client = ll_session_new(s_key, sizeof s_key - 1, "hmac-sha256", 0);
    ll_session_t *kernel = ll_session_new(s_key, sizeof s_key - 1, "hmac-sha256", 0);
    if (!client || !kernel)
        return 1;
    ll_msg_t *req = ll_msg_new(
        client, "execute_request", NULL,
        json_pack("{s:s,s:b,s:b,s:{},s:b,s:b}", "code", "for i in range(10**6): print(i)", "silent",
                  0, "store_history", 1, "user_expressions", "allow_stdin", 1, "stop_on_error", 1));
    static const struct {
        const char *name;
        int lines, line_len, divisor; /* iterations = n / divisor */
    } workloads[] = {
        {"1 KiB", 1, 530, 1}, /* with the headers, about 1 KiB on the wire */
        {"64 KiB", 1000, 64, 40},
    };
    int rc = 0;
    for (size_t w = 0; w < sizeof workloads / sizeof workloads[0]; w++) {
        int iters = n / workloads[w].divisor;
        char *text = s_text(workloads[w].lines, workloads[w].line_len);
        double enc, dec, py_enc, py_dec;
        long bytes = 0, py_bytes = 0;
        int py_iters = iters / 4 > 100 ? iters / 4 : iters;
        if (s_c_bench(client, kernel, req, iters, text, &enc, &dec, &bytes) != 0 ||
            s_python_bench(py_iters, workloads[w].lines, workloads[w].line_len, &py_enc, &py_dec,
                           &py_bytes) != 0) {
            fprintf(stderr, "bench_wire: %s workload failed\n", workloads[w].name);
            rc = 1;
        } else {
            printf("wire %-6s stream message (%ld B ours, %ld B jupyter_client):\n",
                   workloads[w].name, bytes, py_bytes);
            printf("  encode %9.2f us vs %9.2f us  ratio %.3f\n", enc, py_enc, enc / py_enc);
            printf("  decode %9.2f us vs %9.2f us  ratio %.3f\n", dec, py_dec, dec / py_dec);
        }
        free(text);
    }
    ll_msg_destroy(&req);
    ll_session_destroy(&client);
    ll_session_destroy(&kernel);
    return rc;
}

/* ll_zdriver: the test driver of the zygote module (tests/zygote/,
 * tests/prefetch/, through tests/llpool_util.py): a client of the host pool
 * that speaks JSON lines, as a kernel would speak to the pool.
 *
 *   ll_zdriver client DIR [POOL ARGS...]   connect through the client API
 *       (zygote/ll_zclient.h) to the pool of DIR ("-": the default one of
 *       $LL_POOL_EXE's build), starting it with POOL ARGS
 *       when none answers from the binary $LL_POOL_EXE (build/looseleaf:
 *       the pool and its zygotes run as the product runs them); then read
 *       commands as JSON lines on stdin and print every event as a JSON line:
 *       {"op":"run", ...request} {"op":"prefetch", ...request} {"op":"input","id","value"}
 *       {"op":"interrupt","id"} {"op":"cancel","id"} {"op":"stats"} {"op":"quit"}.
 * One thread; polls stdin and the client's fd. */
#include "zygote/ll_zclient.h"
#include "base/ll_log.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void s_print(json_t *ev)
{
    char *s = json_dumps(ev, JSON_COMPACT);
    if (s) {
        printf("%s\n", s);
        fflush(stdout);
    }
    free(s);
}

static int s_client(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ll_zdriver client DIR [POOL ARGS...]\n");
        return 2;
    }
    char err[512];
    /* The pool is build/looseleaf's subcommand: this driver is no pool. */
    const char *exe = getenv("LL_POOL_EXE");
    const char *dir = strcmp(argv[1], "-") == 0 ? NULL : argv[1]; /* "-": the default dir */
    ll_zclient_t *c =
        exe && *exe ? ll_zclient_connect(dir, exe, (const char *const *) argv + 2, err, sizeof err)
                    : NULL;
    if (!exe || !*exe)
        snprintf(err, sizeof err, "set LL_POOL_EXE to the looseleaf binary that runs the pool");
    if (!c) {
        json_t *e = json_pack("{s:s, s:s}", "type", "connect_error", "error", err);
        s_print(e);
        json_decref(e);
        return 1;
    }
    json_t *hello = json_pack("{s:s}", "type", "connected");
    s_print(hello);
    json_decref(hello);
    char *line = NULL;
    size_t cap = 0;
    FILE *in = stdin;
    /* Unbuffered: a second command must not sit in stdio's buffer while
     * poll() says fd 0 has nothing. */
    setvbuf(in, NULL, _IONBF, 0);
    bool in_open = true;
    while (ll_zclient_ok(c)) {
        struct pollfd p[2] = {{ll_zclient_fd(c), POLLIN, 0}, {in_open ? 0 : -1, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[0].revents) {
            json_t *ev;
            while ((ev = ll_zclient_next(c, 0))) {
                s_print(ev);
                json_decref(ev);
            }
        }
        if (p[1].revents) {
            ssize_t n = getline(&line, &cap, in);
            if (n <= 0) {
                in_open = false;
                break;
            }
            json_error_t jerr;
            json_t *cmd = json_loads(line, 0, &jerr);
            const char *op = json_string_value(json_object_get(cmd, "op"));
            const char *id = json_string_value(json_object_get(cmd, "id"));
            int rc = 0;
            if (!op)
                rc = -1, snprintf(err, sizeof err, "bad command");
            else if (strcmp(op, "run") == 0) {
                json_object_del(cmd, "op");
                rc = ll_zclient_run(c, cmd, err, sizeof err);
            } else if (strcmp(op, "prefetch") == 0) {
                json_object_del(cmd, "op");
                rc = ll_zclient_prefetch(c, cmd, err, sizeof err);
            } else if (strcmp(op, "input") == 0)
                rc = ll_zclient_input_reply(c, id ? id : "",
                                            json_string_value(json_object_get(cmd, "value")));
            else if (strcmp(op, "interrupt") == 0)
                rc = ll_zclient_interrupt(c, id ? id : "");
            else if (strcmp(op, "cancel") == 0)
                rc = ll_zclient_cancel(c, id ? id : "");
            else if (strcmp(op, "stats") == 0)
                rc = ll_zclient_stats(c);
            else if (strcmp(op, "quit") == 0) {
                json_decref(cmd);
                break;
            }
            if (rc < 0) {
                json_t *e = json_pack("{s:s, s:s}", "type", "driver_error", "error", err);
                s_print(e);
                json_decref(e);
            }
            json_decref(cmd);
        }
    }
    free(line);
    ll_zclient_destroy(&c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ll_zdriver client DIR [POOL ARGS...]\n");
        return 2;
    }
    if (strcmp(argv[1], "client") == 0) {
        ll_log_init('G');
        return s_client(argc - 1, argv + 1);
    }
    fprintf(stderr, "ll_zdriver: unknown subcommand %s\n", argv[1]);
    return 2;
}

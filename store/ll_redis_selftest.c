/* ll_redis_selftest: the Redis connection's self-test: it starts its own
 * redis-server (ll_redis_server.c) and checks optimistic transactions,
 * the private server's ACL, reconnection after a restart, deadlines on a
 * stalled server and cancellation.  A file of its own because it drives
 * both the connection (ll_redis.c) and the server launcher above it. */
#include "store/ll_redis_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_redis_server.h"
#include "base/ll_check.h"

/* Whether REPLY is the string WANT (and free it). */
static bool s_reply_is(redisReply *reply, int type, const char *want)
{
    bool ok = reply && reply->type == type && (!want || strcmp(reply->str, want) == 0);
    if (reply)
        freeReplyObject(reply);
    return ok;
}

/* One optimistic transaction, as the store's commit makes them: WATCH seq,
 * read it, let OTHER (when not NULL) move it meanwhile, then MULTI, SET
 * seq+1, EXEC pipelined.  Returns the new seq, 0 when EXEC said nil (a
 * concurrent change: try again), -1 on an error. */
static long long s_try_commit(ll_redis_t *r, ll_redis_t *other)
{
    redisReply *w = ll_redis_cmdf(r, "WATCH ll:t:seq");
    if (!s_reply_is(w, REDIS_REPLY_STATUS, "OK"))
        return -1;
    redisReply *g = ll_redis_cmdf(r, "GET ll:t:seq");
    uint64_t cur = ll_redis_u64(g);
    if (g)
        freeReplyObject(g);
    if (other && !s_reply_is(ll_redis_cmdf(other, "INCR ll:t:seq"), REDIS_REPLY_INTEGER, NULL))
        return -1;
    char next[32];
    snprintf(next, sizeof next, "%llu", (unsigned long long) cur + 1);
    ll_redis_argv_t a = {0};
    int bad = ll_redis_arg(&a, "MULTI") || ll_redis_send(r, &a) || ll_redis_arg(&a, "SET") ||
              ll_redis_arg(&a, "ll:t:seq") || ll_redis_arg(&a, next) || ll_redis_send(r, &a) ||
              ll_redis_arg(&a, "EXEC") || ll_redis_send(r, &a);
    ll_redis_argv_free(&a);
    redisReply *exec = !bad && ll_redis_drain(r, 2) == 0 ? ll_redis_reply(r) : NULL;
    long long rc = -1;
    if (exec && exec->type == REDIS_REPLY_NIL)
        rc = 0;
    else if (exec && exec->type == REDIS_REPLY_ARRAY && exec->elements == 1)
        rc = (long long) cur + 1;
    if (exec)
        freeReplyObject(exec);
    return rc;
}

/* The checks of the self-test below, on connection R to the server on
 * SOCK in DIR: true when they all pass (a failure is printed). */
static bool s_selftest_acl(ll_redis_t *r, const char *sock)
{
    /* ACL: nobody gets in without logging in (the default user is off); the
     * store's user may not run what the store does not, nor touch keys
     * outside ll:*. */
    ll_redis_begin(r);
    struct timeval tv = {2, 0};
    redisContext *anon = redisConnectUnixWithTimeout(sock, tv);
    redisReply *no = anon && !anon->err ? redisCommand(anon, "GET ll:t:k") : NULL;
    bool refused = no && no->type == REDIS_REPLY_ERROR && strstr(no->str, "NOAUTH");
    if (no)
        freeReplyObject(no);
    if (anon)
        redisFree(anon);
    S_REQUIRE(refused, fail);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "FLUSHALL"), REDIS_REPLY_ERROR, NULL), fail);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "CONFIG SET appendonly no"), REDIS_REPLY_ERROR, NULL),
              fail);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "SET other 1"), REDIS_REPLY_ERROR, NULL), fail);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "GET ll:t:k"), REDIS_REPLY_STRING, "v"), fail);
    return true;
fail:
    fprintf(stderr, "ll_redis selftest: last error: %s\n", ll_redis_errstr(r));
    return false;
}

static bool s_selftest_waits(ll_redis_t *r, const char *dir)
{
    /* A stopped server (SIGSTOP): the call gives up at its deadline as
     * unavailable, and every later command of the call fails at once; the
     * next call, once the server runs again, reconnects. */
    pid_t spid = ll_redis_server_pid(dir);
    S_REQUIRE(spid > 0, fail);
    r->timeout_ms = 300;
    ll_redis_begin(r);
    kill(spid, SIGSTOP);
    double t0 = ll_clock_ms();
    redisReply *stalled = ll_redis_cmdf(r, "PING");
    double waited = ll_clock_ms() - t0;
    redisReply *after = ll_redis_cmdf(r, "PING");
    kill(spid, SIGCONT);
    S_REQUIRE(!stalled && !after && ll_redis_failure(r) == LL_REDIS_UNAVAILABLE, fail);
    S_REQUIRE(waited >= 250 && waited < 3000 && strstr(ll_redis_errstr(r), "did not answer"), fail);
    r->timeout_ms = 10000;
    ll_redis_begin(r);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "PING"), REDIS_REPLY_STATUS, "PONG"), fail);

    /* An interrupt (the cancel fd) ends a wait at once; one from before
     * the call is not for it (drained). */
    int ifd[2] = {-1, -1};
    S_REQUIRE(pipe2(ifd, O_NONBLOCK | O_CLOEXEC) == 0, fail);
    ll_redis_set_cancel(r, ifd[0], true, NULL, NULL);
    bool wrote = write(ifd[1], "i", 1) == 1;
    ll_redis_begin(r);
    redisReply *pong = ll_redis_cmdf(r, "PING");
    S_REQUIRE(wrote && s_reply_is(pong, REDIS_REPLY_STATUS, "PONG"), fail);
    kill(spid, SIGSTOP);
    wrote = write(ifd[1], "i", 1) == 1;
    t0 = ll_clock_ms();
    stalled = ll_redis_cmdf(r, "PING");
    waited = ll_clock_ms() - t0;
    kill(spid, SIGCONT);
    ll_redis_set_cancel(r, -1, false, NULL, NULL);
    close(ifd[0]);
    close(ifd[1]);
    S_REQUIRE(wrote && !stalled && ll_redis_failure(r) == LL_REDIS_CANCELLED && waited < 1000 &&
                  strstr(ll_redis_errstr(r), "interrupted"),
              fail);
    ll_redis_begin(r);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "PING"), REDIS_REPLY_STATUS, "PONG"), fail);
    return true;
fail:
    fprintf(stderr, "ll_redis selftest: last error: %s\n", ll_redis_errstr(r));
    return false;
}

/* A Redis over TCP (the cluster's, shared across hosts) with an ACL user:
 * LL_REDIS_USER and LL_REDIS_PASSWORD_FILE log in; a wrong password, a
 * password file others may read, a user without a password are refused
 * with errors that say so.  Its own redis-server on 127.0.0.1, in DIR. */
static bool s_selftest_tcp_auth(const char *dir)
{
    int fails = 0;
    char err[512], url[64], pass[300], port_s[16];
    /* A free port: the kernel's choice for a socket bound to port 0. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 ||
        getsockname(fd, (struct sockaddr *) &sa, &sl) < 0) {
        fprintf(stderr, "ll_redis selftest: no TCP port: %s\n", strerror(errno));
        return false;
    }
    close(fd);
    snprintf(port_s, sizeof port_s, "%d", ntohs(sa.sin_port));
    snprintf(url, sizeof url, "redis://127.0.0.1:%s", port_s);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("redis-server", "redis-server", "--bind", "127.0.0.1", "--port", port_s, "--save",
               "", "--appendonly", "no", "--dir", dir, "--user", "default", "off", "--user",
               "ll-cluster", "on", ">s3cret-pw", "~ll:*", "+@all", "--loglevel", "warning",
               (char *) NULL);
        _exit(127);
    }
    if (pid < 0)
        return false;
    snprintf(pass, sizeof pass, "%s/cluster-redis.pass", dir);
    int pf = open(pass, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    S_CHECK(pf >= 0 && write(pf, "s3cret-pw\n", 10) == 10);
    if (pf >= 0)
        close(pf);
    setenv("LL_REDIS_USER", "ll-cluster", 1);
    setenv("LL_REDIS_PASSWORD_FILE", pass, 1);
    ll_redis_t *r = NULL;
    for (double until = ll_clock_ms() + 10000;
         !r && ll_clock_ms() < until && waitpid(pid, NULL, WNOHANG) == 0;) {
        r = ll_redis_connect_timeout(url, 2000, -1, err, sizeof err);
        if (!r)
            poll(NULL, 0, 20); /* the server is still starting */
    }
    S_CHECK(r != NULL);
    if (r) {
        ll_redis_begin(r);
        S_CHECK(s_reply_is(ll_redis_cmdf(r, "SET ll:t:tcp %s", "1"), REDIS_REPLY_STATUS, "OK"));
        ll_redis_destroy(&r);
    }
    setenv("LL_REDIS_PASSWORD_FILE", "", 1);
    setenv("LL_REDIS_PASSWORD", "wrong", 1);
    r = ll_redis_connect_timeout(url, 2000, -1, err, sizeof err);
    S_CHECK(!r && strstr(err, "cannot log in to Redis at") && strstr(err, "as ll-cluster") &&
            strstr(err, "WRONGPASS"));
    ll_redis_destroy(&r);
    unsetenv("LL_REDIS_PASSWORD");
    r = ll_redis_connect_timeout(url, 2000, -1, err, sizeof err);
    S_CHECK(!r && strstr(err, "LL_REDIS_USER=ll-cluster but no password"));
    ll_redis_destroy(&r);
    chmod(pass, 0644);
    setenv("LL_REDIS_PASSWORD_FILE", pass, 1);
    r = ll_redis_connect_timeout(url, 2000, -1, err, sizeof err);
    S_CHECK(!r && strstr(err, "that others cannot read"));
    ll_redis_destroy(&r);
    unsetenv("LL_REDIS_USER");
    unsetenv("LL_REDIS_PASSWORD_FILE");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(pass);
    if (fails)
        fprintf(stderr, "ll_redis selftest: TCP login: last error: %s\n", err);
    return fails == 0;
}

int ll_redis_selftest(bool verbose)
{
    char dir[] = "/tmp/ll-redis-selftest-XXXXXX", err[512] = "", url[600], path[600];
    ll_redis_t *r = NULL, *r2 = NULL;
    char *sock = NULL, *again = NULL;
    bool started = false, server = false;
    int rc = 1;
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ll_redis selftest: mkdtemp: %s\n", strerror(errno));
        return 1;
    }

    /* What fails without a server, and fails at once. */
    S_REQUIRE(!ll_redis_connect("tcp://localhost:6379", err, sizeof err) &&
                  strstr(err, "bad Redis URL"),
              fail);
    S_REQUIRE(!ll_redis_connect("redis://localhost:0", err, sizeof err) && strstr(err, "port"),
              fail);
    S_REQUIRE(!ll_redis_connect("redis://localhost:12x", err, sizeof err) && strstr(err, "port"),
              fail);
    snprintf(url, sizeof url, "unix://%s/none.sock", dir);
    S_REQUIRE(!ll_redis_connect(url, err, sizeof err) &&
                  strstr(err, "cannot connect to Redis at unix://"),
              fail);
    S_REQUIRE(ll_redis_stop(dir, err, sizeof err) == 0, fail); /* none runs */
    snprintf(path, sizeof path, "%s/%0110d", dir, 0);          /* no room for "/redis.sock" */
    S_REQUIRE(!ll_redis_start(path, NULL, &started, err, sizeof err) && strstr(err, "too long"),
              fail);
    err[0] = 0;

    /* A private server; a second start finds it answering. */
    sock = ll_redis_start(dir, NULL, &started, err, sizeof err);
    server = sock != NULL;
    S_REQUIRE(sock && started, fail);
    again = ll_redis_start(dir, NULL, &started, err, sizeof err);
    S_REQUIRE(again && !started && strcmp(again, sock) == 0, fail);
    snprintf(url, sizeof url, "unix://%s", sock);
    r = ll_redis_connect(url, err, sizeof err);
    S_REQUIRE(r && ll_redis_connected(r) && strcmp(ll_redis_url(r), url) == 0, fail);
    r2 = ll_redis_connect(sock, err, sizeof err); /* a bare socket path */
    S_REQUIRE(r2, fail);
    ll_redis_begin(r); /* (every call of the store begins so; here, one per step) */
    ll_redis_begin(r2);

    /* Replies, error replies returned as such, numbers. */
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "SET ll:t:k %s", "v"), REDIS_REPLY_STATUS, "OK"), fail);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "INCR ll:t:k"), REDIS_REPLY_ERROR, NULL), fail);
    const char *argv[] = {"SET", "ll:t:bin"};
    size_t lens[] = {3, 8};
    ll_redis_argv_t a = {0};
    S_REQUIRE(ll_redis_argn(&a, argv[0], lens[0]) == 0 && ll_redis_arg(&a, argv[1]) == 0 &&
                  ll_redis_argn(&a, "a\0b", 3) == 0 && a.argc == 3,
              fail);
    redisReply *x = ll_redis_cmd(r, a.argc, a.argv, a.lens);
    ll_redis_argv_free(&a);
    S_REQUIRE(a.argc == 0 && a.argv == NULL && s_reply_is(x, REDIS_REPLY_STATUS, "OK"), fail);
    x = ll_redis_cmdf(r, "STRLEN ll:t:bin");
    S_REQUIRE(ll_redis_u64(x) == 3, fail);
    freeReplyObject(x);
    x = ll_redis_cmdf(r, "GET ll:t:k");
    S_REQUIRE(ll_redis_u64(x) == 0 && ll_redis_u64(NULL) == 0, fail); /* "v" is no number */
    freeReplyObject(x);

    /* WATCH/EXEC: overtaken between WATCH and EXEC, EXEC says nil and
     * nothing is written; the retry lands on the new value. */
    long long got = -1;
    int attempts = 0;
    while (got <= 0 && attempts < 3)
        got = s_try_commit(r, attempts++ == 0 ? r2 : NULL);
    S_REQUIRE(got == 2 && attempts == 2, fail); /* 0, the other's INCR made 1, ours 2 */

    ll_redis_begin(r);
    ll_redis_begin(r2);
    /* The connection cut right after sending (drop_after_exec): the reply
     * is lost, the command ran; the next call reconnects by itself. */
    S_REQUIRE(ll_redis_append(r, 3, (const char *[]){"SET", "ll:t:dropped", "yes"},
                              (const size_t[]){3, 12, 3}) == 0,
              fail);
    ll_redis_fault_drop(r);
    S_REQUIRE(ll_redis_reply(r) == NULL && !ll_redis_connected(r) && ll_redis_errstr(r)[0], fail);
    S_REQUIRE(ll_redis_append(r, 1, (const char *[]){"PING"}, (const size_t[]){4}) == -1, fail);
    bool seen = false;
    for (double until = ll_clock_ms() + 2000; !seen && ll_clock_ms() < until;) {
        seen = s_reply_is(ll_redis_cmdf(r2, "GET ll:t:dropped"), REDIS_REPLY_STRING, "yes");
        if (!seen)
            poll(NULL, 0, 1); /* 1 ms, then look again */
    }
    S_REQUIRE(seen, fail);
    S_REQUIRE(ll_redis_ensure(r) == 0 && ll_redis_connected(r) && ll_redis_reconnects(r) == 1,
              fail);
    ll_redis_reset(r); /* a reset connection: the next command reconnects */
    S_REQUIRE(!ll_redis_connected(r), fail);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "PING"), REDIS_REPLY_STATUS, "PONG"), fail);
    S_REQUIRE(ll_redis_reconnects(r) == 2, fail);

    ll_redis_begin(r);
    /* The server restarts: acknowledged writes come back (append-only file),
     * and both connections find the new server on their next command. */
    S_REQUIRE(ll_redis_stop(dir, err, sizeof err) == 1, fail);
    server = false;
    S_REQUIRE(ll_redis_stop(dir, err, sizeof err) == 0, fail);
    free(sock);
    sock = ll_redis_start(dir, NULL, &started, err, sizeof err);
    server = sock != NULL;
    S_REQUIRE(sock && started, fail);
    ll_redis_begin(r);
    ll_redis_begin(r2);
    S_REQUIRE(s_reply_is(ll_redis_cmdf(r, "GET ll:t:k"), REDIS_REPLY_STRING, "v"), fail);
    S_REQUIRE(ll_redis_reconnects(r) == 3, fail);
    S_REQUIRE(s_try_commit(r2, NULL) == 3 && ll_redis_reconnects(r2) == 1, fail);

    S_REQUIRE(s_selftest_acl(r, sock), fail);
    S_REQUIRE(s_selftest_waits(r, dir), fail);
    S_REQUIRE(s_selftest_tcp_auth(dir), fail);
    if (verbose)
        printf("(redis in %s) ", dir);
    rc = 0;
fail:
    if (rc != 0) /* what the failed check's call said */
        fprintf(stderr, "ll_redis selftest: last error: %s\n",
                err[0] ? err
                : r    ? ll_redis_errstr(r)
                       : "");
    ll_redis_destroy(&r);
    ll_redis_destroy(&r2);
    free(sock);
    free(again);
    if (server && ll_redis_stop(dir, err, sizeof err) < 0)
        fprintf(stderr, "ll_redis selftest: %s\n", err);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "ll_redis selftest: could not remove %s\n", dir);
    return rc;
}

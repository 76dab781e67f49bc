/* ll_redis: a reconnecting hiredis connection with deadlines and
 * cancellation (see ll_redis.h).  Runs in any process of a session, on the
 * thread that calls the store (under its mutex).
 *
 * DESIGN
 * ------
 * hiredis' blocking calls wait in read() for as long as the server takes: a
 * stopped redis-server (SIGSTOP, a full disk, a stall) would hang a cell
 * for ever, with no interrupt able to end it (hiredis retries EINTR).  So
 * the socket is non-blocking and every wait is our own poll() on it, the
 * cancel fd (an interrupt) and the call's deadline, in slices of 100 ms
 * between which the cancel check runs.  A wait that ends without its reply
 * drops the connection: what the server was in the middle of is unknown,
 * and a commit finds out from its record whether its EXEC ran
 * (ll_store_commit.c).  Once a call failed that way, its later commands
 * fail at once, so a store operation that retries (a commit's WATCH loop)
 * still gives up after one timeout.
 *
 * hiredis contexts carry a sticky err/errstr: once set the context is dead,
 * so every command checks it and reconnects (after a Redis restart the
 * socket reappears once the server answers; a server still loading its
 * append-only file answers -LOADING, retried with backoff until the
 * deadline).  Writes to a closed socket would raise SIGPIPE and kill the
 * process: we set SIGPIPE to SIG_IGN if it is still the default (CPython
 * already does so).
 *
 * The private server (ll_redis_server.c) lets in only its ACL user; its
 * password sits next to its socket (redis.pass, 0600, in a 0700
 * directory), where this connection finds it.  A Redis over TCP (the
 * cluster's, shared across hosts) is logged in to as the ACL user and
 * password the environment names: LL_REDIS_USER, and LL_REDIS_PASSWORD_FILE
 * (a file of ours closed to others) or LL_REDIS_PASSWORD; never from the
 * URL, which error messages quote.
 *
 * The self-test at the bottom starts a throwaway server in a temp dir and
 * drives connect, reconnect (after a cut connection and after the server
 * restarted), an optimistic WATCH/EXEC transaction overtaken and retried,
 * a stopped server (the deadline) and an interrupt (the cancel fd), and the
 * error paths; it polls, never sleeps for a fixed time. */
#include "store/ll_redis.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_redis_internal.h"

#define S_USER           "looseleaf" /* the private server's ACL user */
#define S_RECONNECT_MS   3000.0      /* how long a broken connection is retried */
#define S_SLICE_MS       100         /* between cancel checks */
#define S_BACKOFF_MAX_MS 500.0

double ll_redis_timeout_s(void)
{
    const char *v = getenv("LL_STORE_TIMEOUT_S");
    char *end;
    double s = v ? strtod(v, &end) : 0;
    return v && end != v && s > 0 ? s : 10.0;
}

static void s_ignore_sigpipe(void)
{
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
        !(old.sa_flags & SA_SIGINFO)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_IGN;
        sigaction(SIGPIPE, &sa, NULL);
    }
}

/* The password of the private server whose socket is SOCK: the first line
 * of redis.pass next to it, when that is a regular file of ours closed to
 * others.  Malloc'd, or NULL (no such server: no AUTH). */
static char *s_find_password(const char *sock)
{
    const char *slash = strrchr(sock, '/');
    if (!slash)
        return NULL;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%.*s/redis.pass", (int) (slash - sock), sock) >=
        (int) sizeof path)
        return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    struct stat st;
    char buf[128];
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077))
        n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    return buf[0] ? strdup(buf) : NULL;
}

/* Over TCP: the ACL user and password the environment names into R (see
 * DESIGN).  0 (none named: no AUTH), or -1 with ERR. */
static int s_tcp_credentials(ll_redis_t *r, char *err, size_t errlen)
{
    const char *user = getenv("LL_REDIS_USER"), *file = getenv("LL_REDIS_PASSWORD_FILE");
    const char *pass = getenv("LL_REDIS_PASSWORD");
    if (file && *file) {
        int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        char buf[512];
        ssize_t n = -1;
        if (fd < 0) {
            snprintf(err, errlen, "Redis password file %s (LL_REDIS_PASSWORD_FILE): %s", file,
                     strerror(errno));
            return -1;
        }
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
            !(st.st_mode & 077))
            n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n < 0) {
            snprintf(err, errlen,
                     "Redis password file %s (LL_REDIS_PASSWORD_FILE): must be a regular file "
                     "of uid %u that others cannot read (chmod 600)",
                     file, (unsigned) geteuid());
            return -1;
        }
        buf[n] = 0;
        buf[strcspn(buf, "\r\n")] = 0;
        r->password = strdup(buf);
        memset(buf, 0, sizeof buf);
    } else if (pass && *pass) {
        r->password = strdup(pass);
    }
    if (user && *user && !r->password) {
        snprintf(err, errlen,
                 "LL_REDIS_USER=%s but no password (LL_REDIS_PASSWORD_FILE or LL_REDIS_PASSWORD)",
                 user);
        return -1;
    }
    r->user = strdup(user && *user ? user : "default");
    if (r->password && !r->password[0]) {
        snprintf(err, errlen, "the Redis password (LL_REDIS_PASSWORD_FILE) is empty");
        return -1;
    }
    return 0;
}

/* ---- waiting ----------------------------------------------------------- */

/* The call gave up (KIND: unavailable or cancelled) with the reason FMT.
 * The connection goes: what it was in the middle of is unknown.  -1. */
static int s_give_up(ll_redis_t *r, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int s_give_up(ll_redis_t *r, int kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    r->failure = kind;
    ll_redis_reset(r);
    return -1;
}

static int s_timed_out(ll_redis_t *r)
{
    return s_give_up(r, LL_REDIS_UNAVAILABLE, "Redis at %s did not answer within %g s", r->url,
                     r->timeout_ms / 1e3);
}

static int s_cancelled(ll_redis_t *r)
{
    return s_give_up(r, LL_REDIS_CANCELLED, "interrupted while waiting for Redis at %s", r->url);
}

/* Wait until FD (-1: none, just pause) is ready for EVENTS, for at most
 * UNTIL (ll_clock_ms).  0 when ready, 1 when UNTIL came first, -1 when the
 * call's deadline passed or it was cancelled (the call failed). */
static int s_wait_fd(ll_redis_t *r, int fd, short events, double until)
{
    for (;;) {
        if (r->failure)
            return -1;
        double now = ll_clock_ms();
        if (now >= r->deadline)
            return s_timed_out(r);
        if (now >= until)
            return 1;
        double left = (until < r->deadline ? until : r->deadline) - now;
        int slice = left < S_SLICE_MS ? (int) left + 1 : S_SLICE_MS;
        struct pollfd p[2] = {{fd, events, 0}, {r->quiet ? -1 : r->cancel_fd, POLLIN, 0}};
        int n = poll(p, 2, slice); /* (a negative fd is skipped) */
        if (n < 0 && errno != EINTR)
            return s_give_up(r, LL_REDIS_UNAVAILABLE, "Redis at %s: poll: %s", r->url,
                             strerror(errno));
        if (n > 0 && p[1].revents)
            return s_cancelled(r);
        /* (only after a quiet slice: the check may take a lock, the GIL) */
        if (n == 0 && !r->quiet && r->cancel_check && r->cancel_check(r->cancel_ctx))
            return s_cancelled(r);
        if (n > 0 && p[0].revents)
            return 0;
    }
}

/* Pause MS milliseconds (backoff), ending early like a wait.  0 or -1. */
static int s_pause(ll_redis_t *r, double ms)
{
    return s_wait_fd(r, -1, 0, ll_clock_ms() + ms) < 0 ? -1 : 0;
}

static void s_note_io_error(ll_redis_t *r)
{
    if (r->failure)
        return; /* the reason is recorded already */
    if (r->c && r->c->err)
        snprintf(r->err, sizeof r->err, "Redis at %s: %s", r->url, r->c->errstr);
    else
        snprintf(r->err, sizeof r->err, "Redis at %s: no reply", r->url);
}

/* Send everything buffered.  0, or -1 (connection broken or call failed). */
static int s_flush(ll_redis_t *r)
{
    int done = 0;
    while (!done) {
        if (!r->c || redisBufferWrite(r->c, &done) != REDIS_OK) {
            s_note_io_error(r);
            return -1;
        }
        if (!done && s_wait_fd(r, r->c->fd, POLLOUT, r->deadline) != 0)
            return -1;
    }
    return 0;
}

/* The next reply on the connection (caller frees), or NULL. */
static redisReply *s_read_reply(ll_redis_t *r)
{
    void *reply = NULL;
    if (!r->c || r->c->err || s_flush(r) != 0)
        goto fail;
    for (;;) {
        if (redisGetReplyFromReader(r->c, &reply) != REDIS_OK)
            goto fail;
        if (reply)
            return reply;
        if (s_wait_fd(r, r->c->fd, POLLIN, r->deadline) != 0)
            return NULL;
        if (redisBufferRead(r->c) != REDIS_OK)
            goto fail;
    }
fail:
    s_note_io_error(r);
    return NULL;
}

/* ---- connecting ---------------------------------------------------------- */

/* Connect (the blocking connect of hiredis, bounded by the deadline), make
 * the socket non-blocking, log in.  0, or -1 with the reason in R->err. */
static int s_connect(ll_redis_t *r)
{
    ll_redis_reset(r);
    double left = r->deadline - ll_clock_ms();
    if (left < 1)
        return s_timed_out(r);
    double ms = left < 2000 ? left : 2000;
    struct timeval tv = {(time_t) (ms / 1000), (suseconds_t) ((long) ms % 1000) * 1000};
    r->c = r->path ? redisConnectUnixWithTimeout(r->path, tv)
                   : redisConnectWithTimeout(r->host, r->port, tv);
    if (!r->c) {
        snprintf(r->err, sizeof r->err, "cannot connect to Redis at %s: out of memory", r->url);
        return -1;
    }
    if (r->c->err) {
        snprintf(r->err, sizeof r->err, "cannot connect to Redis at %s: %s", r->url, r->c->errstr);
        ll_redis_reset(r);
        return -1;
    }
    int fl = fcntl(r->c->fd, F_GETFL);
    if (fl < 0 || fcntl(r->c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        snprintf(r->err, sizeof r->err, "cannot connect to Redis at %s: %s", r->url,
                 strerror(errno));
        ll_redis_reset(r);
        return -1;
    }
    r->c->flags &= ~REDIS_BLOCK; /* our waits, not hiredis' */
    if (!r->password)
        return 0;
    const char *user = r->user ? r->user : S_USER;
    const char *argv[] = {"AUTH", user, r->password};
    const size_t lens[] = {4, strlen(user), strlen(r->password)};
    redisReply *reply = NULL;
    if (redisAppendCommandArgv(r->c, 3, argv, lens) == REDIS_OK)
        reply = s_read_reply(r);
    bool ok = reply && reply->type == REDIS_REPLY_STATUS;
    if (!ok && reply)
        snprintf(r->err, sizeof r->err, "cannot log in to Redis at %s as %s: %s", r->url, user,
                 reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply");
    else if (!ok && !r->failure)
        snprintf(r->err, sizeof r->err, "cannot connect to Redis at %s: no answer to AUTH", r->url);
    if (reply)
        freeReplyObject(reply);
    if (!ok)
        ll_redis_reset(r);
    return ok ? 0 : -1;
}

static int s_parse_url(ll_redis_t *r, const char *url, char *err, size_t errlen)
{
    if (strncmp(url, "unix://", 7) == 0) {
        r->path = strdup(url + 7);
    } else if (strncmp(url, "redis://", 8) == 0) {
        const char *hp = url + 8;
        const char *at = strrchr(hp, '@');
        if (at) {
            /* redis://looseleaf:PASSWORD@host:port: a kernel's Redis reached
             * over TCP from another host (cluster mode: the password of its
             * ACL user, the only user it has).  The URL kept for messages
             * leaves it out. */
            const char *colon_pw = memchr(hp, ':', (size_t) (at - hp));
            if (colon_pw && colon_pw + 1 < at) {
                free(r->password);
                r->password = strndup(colon_pw + 1, (size_t) (at - colon_pw - 1));
            }
            char *redacted = NULL;
            if (asprintf(&redacted, "redis://%s", at + 1) > 0) {
                free(r->url);
                r->url = redacted;
            }
            hp = at + 1;
        }
        const char *colon = strrchr(hp, ':');
        size_t hl = colon ? (size_t) (colon - hp) : strcspn(hp, "/");
        r->host = strndup(hp, hl);
        r->port = 6379;
        if (colon) {
            char *end;
            long port = strtol(colon + 1, &end, 10);
            if (port <= 0 || port > 65535 || (*end && *end != '/')) {
                snprintf(err, errlen, "bad Redis URL %s: port", url);
                return -1;
            }
            r->port = (int) port;
        }
    } else if (url[0] == '/') {
        r->path = strdup(url);
    } else {
        snprintf(err, errlen, "bad Redis URL %s (want unix:///path or redis://host:port)", url);
        return -1;
    }
    if (!r->path && !r->host) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

ll_redis_t *ll_redis_connect(const char *url, char *err, size_t errlen)
{
    return ll_redis_connect_timeout(url, ll_redis_timeout_s() * 1e3, -1, err, errlen);
}

ll_redis_t *ll_redis_connect_timeout(const char *url, double timeout_ms, int cancel_fd, char *err,
                                     size_t errlen)
{
    s_ignore_sigpipe();
    ll_redis_t *r = calloc(1, sizeof *r);
    if (!r || !(r->url = strdup(url))) {
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->cancel_fd = cancel_fd;
    r->timeout_ms = timeout_ms;
    if (s_parse_url(r, url, err, errlen) != 0) {
        ll_redis_destroy(&r);
        return NULL;
    }
    if (r->path)
        r->password = s_find_password(r->path);
    else if (s_tcp_credentials(r, err, errlen) != 0) {
        ll_redis_destroy(&r);
        return NULL;
    }
    ll_redis_begin(r);
    if (s_connect(r) != 0) {
        snprintf(err, errlen, "%s", r->err);
        ll_redis_destroy(&r);
        return NULL;
    }
    return r;
}

void ll_redis_destroy(ll_redis_t **r_p)
{
    if (!r_p || !*r_p)
        return;
    ll_redis_t *r = *r_p;
    ll_redis_reset(r);
    free(r->url);
    free(r->path);
    free(r->host);
    free(r->user);
    if (r->password) {
        memset(r->password, 0, strlen(r->password));
        free(r->password);
    }
    free(r);
    *r_p = NULL;
}

void ll_redis_begin_quiet(ll_redis_t *r, double ms)
{
    r->deadline = ll_clock_ms() + (ms < r->timeout_ms ? ms : r->timeout_ms);
    r->failure = LL_REDIS_OK;
    r->quiet = true;
}

void ll_redis_begin(ll_redis_t *r)
{
    r->deadline = ll_clock_ms() + r->timeout_ms;
    r->failure = LL_REDIS_OK;
    r->quiet = false;
    if (r->cancel_fd >= 0 && r->cancel_drain) {
        char buf[64]; /* an eventfd gives 8 bytes at once, a pipe what it holds */
        while (read(r->cancel_fd, buf, sizeof buf) > 0)
            ;
    }
}

void ll_redis_set_cancel(ll_redis_t *r, int fd, bool drain, bool (*check)(void *ctx), void *ctx)
{
    r->cancel_fd = fd;
    r->cancel_drain = drain;
    r->cancel_check = check;
    r->cancel_ctx = ctx;
}

int ll_redis_failure(ll_redis_t *r)
{
    return r->failure;
}

bool ll_redis_connected(ll_redis_t *r)
{
    return r->c && !r->c->err;
}

int ll_redis_ensure(ll_redis_t *r)
{
    if (r->failure)
        return -1;
    if (r->c && !r->c->err)
        return 0;
    if (r->c)
        snprintf(r->err, sizeof r->err, "Redis at %s: %s", r->url, r->c->errstr);
    /* A restarting server needs a moment before its socket answers. */
    double until = ll_clock_ms() + S_RECONNECT_MS, backoff = 10;
    while (s_connect(r) != 0) {
        if (r->failure)
            return -1;
        if (ll_clock_ms() >= until) {
            r->failure = LL_REDIS_UNAVAILABLE;
            return -1;
        }
        if (s_pause(r, backoff) != 0)
            return -1;
        backoff = backoff * 2 < S_BACKOFF_MAX_MS ? backoff * 2 : S_BACKOFF_MAX_MS;
    }
    r->reconnects++;
    ll_info("store", "reconnected to Redis at %s", r->url);
    return 0;
}

/* One formatted command CMD (LEN bytes) with the retries ll_redis_cmd
 * promises. */
static redisReply *s_command(ll_redis_t *r, const char *cmd, size_t len)
{
    double backoff = 20;
    for (int attempt = 0; attempt < 2;) {
        if (ll_redis_ensure(r) != 0)
            return NULL;
        redisReply *reply = NULL;
        if (redisAppendFormattedCommand(r->c, cmd, len) == REDIS_OK)
            reply = s_read_reply(r);
        if (!reply) {
            if (r->failure)
                return NULL;
            s_note_io_error(r);
            attempt++;
            continue;
        }
        /* A server still loading its append-only file after a restart
         * says so: wait for it, within the deadline. */
        if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "LOADING", 7) == 0) {
            freeReplyObject(reply);
            if (s_pause(r, backoff) != 0)
                return NULL;
            backoff = backoff * 2 < S_BACKOFF_MAX_MS ? backoff * 2 : S_BACKOFF_MAX_MS;
            continue;
        }
        return reply;
    }
    return NULL;
}

redisReply *ll_redis_cmd(ll_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    char *cmd;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return NULL;
    }
    redisReply *reply = s_command(r, cmd, (size_t) len);
    redisFreeCommand(cmd);
    return reply;
}

redisReply *ll_redis_cmdf(ll_redis_t *r, const char *fmt, ...)
{
    char *cmd;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len < 0) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return NULL;
    }
    redisReply *reply = s_command(r, cmd, (size_t) len);
    redisFreeCommand(cmd);
    return reply;
}

int ll_redis_append(ll_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    if (r->failure || !r->c || r->c->err) {
        s_note_io_error(r);
        return -1;
    }
    if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) {
        s_note_io_error(r);
        return -1;
    }
    return 0;
}

redisReply *ll_redis_reply(ll_redis_t *r)
{
    if (r->failure)
        return NULL;
    return s_read_reply(r);
}

int ll_redis_argn(ll_redis_argv_t *a, const char *s, size_t len)
{
    if (a->argc == a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        const char **v = realloc(a->argv, (size_t) cap * sizeof *v);
        if (!v)
            return -1;
        a->argv = v;
        size_t *l = realloc(a->lens, (size_t) cap * sizeof *l);
        if (!l)
            return -1;
        a->lens = l;
        a->cap = cap;
    }
    a->argv[a->argc] = s;
    a->lens[a->argc++] = len;
    return 0;
}

int ll_redis_arg(ll_redis_argv_t *a, const char *s)
{
    return ll_redis_argn(a, s, strlen(s));
}

int ll_redis_send(ll_redis_t *r, ll_redis_argv_t *a)
{
    int rc = ll_redis_append(r, a->argc, a->argv, a->lens);
    a->argc = 0;
    return rc;
}

void ll_redis_argv_free(ll_redis_argv_t *a)
{
    free(a->argv);
    free(a->lens);
    memset(a, 0, sizeof *a);
}

int ll_redis_drain(ll_redis_t *r, int n)
{
    for (int i = 0; i < n; i++) {
        redisReply *reply = ll_redis_reply(r);
        if (!reply)
            return -1;
        freeReplyObject(reply);
    }
    return 0;
}

uint64_t ll_redis_u64(const redisReply *reply)
{
    if (reply && reply->type == REDIS_REPLY_STRING)
        return strtoull(reply->str, NULL, 10);
    if (reply && reply->type == REDIS_REPLY_INTEGER)
        return (uint64_t) reply->integer;
    return 0;
}

void ll_redis_reset(ll_redis_t *r)
{
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
}

void ll_redis_fault_drop(ll_redis_t *r)
{
    if (!r->c || r->c->err)
        return;
    s_flush(r);
    if (r->c)
        shutdown(r->c->fd, SHUT_RDWR);
    ll_warn("store", "LL_STORE_FAULT: dropped the Redis connection after sending");
}

const char *ll_redis_errstr(ll_redis_t *r)
{
    return r->err;
}

const char *ll_redis_url(ll_redis_t *r)
{
    return r->url;
}

unsigned long ll_redis_reconnects(ll_redis_t *r)
{
    return r->reconnects;
}

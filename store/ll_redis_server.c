/* ll_redis_server: the private redis-server of a runtime directory and the
 * guard that keeps it running (see ll_redis_server.h).  The launcher runs on
 * the thread of whichever process calls it (the session's owner, the
 * kernel, in practice); the guard on a thread of its own in the owner.
 *
 * DESIGN
 * ------
 * The private server listens only on RUNTIME_DIR/redis.sock (port 0,
 * unixsocketperm 700, the directory 0700), in its own session so a Ctrl-C or
 * a killpg() meant for the kernel does not take it down.  It keeps an
 * append-only file in the runtime directory with appendfsync "always": Redis
 * writes and fsyncs a transaction before it replies, so a server killed and
 * restarted mid-session comes back with every commit it acknowledged.
 * ("everysec" would be cheaper, but while a slow background fsync is pending
 * Redis postpones the write and still replies, so a kill -9 can lose
 * acknowledged commits.)  Measured here: 0.2 ms median, 2 ms p90 per commit
 * on disk, nothing on tmpfs.
 *
 * Who may talk to it: the default user is off (Redis still replays the
 * append-only file as that user, so it keeps the same rights as ours); the
 * one user, "looseleaf",
 * has a random password (redis.pass, 0600) and may run only the commands
 * the store uses (no FLUSHALL, CONFIG, DEBUG, EVAL, SHUTDOWN, ACL...) on the
 * keys of its session.  The socket's permissions already keep other users
 * out; the ACL keeps a confused client of ours from doing more than the
 * store does.
 *
 * It must not outlive its kernel: it is started with fork + exec (the
 * kernel has threads by then: only async-signal-safe calls between the two)
 * so that the child can ask for SIGKILL when the thread that started it
 * ends (PR_SET_PDEATHSIG: the kernel's main thread, or the guard's), which
 * no recycled pid can fake.
 *
 * The guard watches the server through a pidfd (exactly that process, never
 * a recycled pid): when it exits, the guard reaps it (it is our child: no
 * <defunct> stays behind) and starts a new one on the same directory, whose
 * append-only file brings every acknowledged commit back; clients reconnect
 * by themselves (ll_redis.c).  Once a second it PINGs the server; a server
 * that has not answered for half the store's timeout (stopped, stalled) is
 * killed, and so restarted, so a stall costs at most the cell that met it.
 *
 * The self-test is in ll_redis.c (it drives a server and a connection). */
#include "store/ll_redis_server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_redis.h"

/* The commands the store sends (ll_store*.c), and nothing else. */
#define S_ACL_COMMANDS                                                                           \
    "+ping +auth +hello +select +get +set +incr +strlen +exists +del +unlink +scan +hget +hset " \
    "+hdel +hmget +hgetall +hvals +copy +watch +unwatch +multi +exec +discard"

static void s_nap_ms(double ms)
{
    struct timespec ts = {(time_t) (ms / 1000), (long) ((long) ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* mkdir -p DIR with 0700 for what it creates. */
static int s_mkdirs(const char *dir)
{
    char *p = strdup(dir);
    if (!p)
        return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0700) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *s = '/';
    }
    int rc = mkdir(p, 0700) != 0 && errno != EEXIST ? -1 : 0;
    free(p);
    return rc;
}

/* Make RUNTIME_DIR exist, belong to us and be closed to others. */
static int s_prepare_dir(const char *dir, char *err, size_t errlen)
{
    if (s_mkdirs(dir) != 0) {
        snprintf(err, errlen, "cannot create runtime directory %s: %s", dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "runtime directory %s is not a directory", dir);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, errlen, "runtime directory %s belongs to another user", dir);
        return -1;
    }
    if ((st.st_mode & 077) && chmod(dir, 0700) != 0) {
        snprintf(err, errlen, "cannot make %s private (0700): %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

static char *s_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* 1 when a server answers PING on SOCK (logged in with PASSWORD when not
 * NULL), 0 when none (or still loading). */
static int s_ping(const char *sock, const char *password)
{
    struct timeval tv = {0, 500000};
    redisContext *c = redisConnectUnixWithTimeout(sock, tv);
    if (!c)
        return 0;
    int ok = 0;
    if (!c->err) {
        redisSetTimeout(c, tv);
        redisReply *a = password ? redisCommand(c, "AUTH looseleaf %s", password) : NULL;
        bool in = !password || (a && a->type == REDIS_REPLY_STATUS);
        if (a)
            freeReplyObject(a);
        redisReply *r = in ? redisCommand(c, "PING") : NULL;
        ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
        if (r)
            freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

static void s_log_tail(const char *dir, char *err, size_t errlen)
{
    char *log = s_join(dir, "redis.log");
    FILE *f = log ? fopen(log, "re") : NULL;
    free(log);
    if (!f)
        return;
    char line[512], last[512] = "";
    while (fgets(line, sizeof line, f))
        if (line[0] != '\n')
            snprintf(last, sizeof last, "%s", line);
    fclose(f);
    last[strcspn(last, "\n")] = 0;
    size_t n = strlen(err);
    if (last[0] && n + 10 < errlen)
        snprintf(err + n, errlen - n, " (redis.log: %s)", last);
}

/* ---- the ACL user --------------------------------------------------------- */

/* The server's password: read from DIR/redis.pass, made (random, 0600)
 * when there is none.  Into PW (65 bytes).  0, or -1 with ERR. */
static int s_password(const char *dir, char pw[65], char *err, size_t errlen)
{
    char *path = s_join(dir, "redis.pass");
    int rc = -1;
    if (!path) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        ssize_t n = read(fd, pw, 64);
        close(fd);
        pw[n > 0 ? n : 0] = 0;
        pw[strcspn(pw, "\r\n")] = 0;
        if (strlen(pw) >= 32) {
            rc = 0;
            goto out;
        }
        unlink(path); /* truncated (a crash while writing it): make a new one */
    }
    unsigned char rnd[32];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t) sizeof rnd) {
        snprintf(err, errlen, "cannot make a password for redis-server: %s", strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(pw + 2 * i, 3, "%02x", rnd[i]);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, pw, 64) != 64) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto out;
    }
    close(fd);
    rc = 0;
out:
    free(path);
    return rc;
}

/* Write DIR/users.acl: the default user off, "looseleaf" with password PW
 * allowed S_ACL_COMMANDS on the keys of SESSION (all ll:* keys when NULL).
 * 0, or -1 with ERR. */
static int s_write_acl(const char *dir, const char *session, const char *pw, char *err,
                       size_t errlen)
{
    char *path = s_join(dir, "users.acl"), *tmp = s_join(dir, "users.acl.tmp");
    int rc = -1;
    if (!path || !tmp) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto out;
    }
    /* The default user is off (no connection starts logged in, nobody can
     * log in as it), yet keeps the same rights as ours: Redis replays the
     * append-only file as that user, and checks each EXEC's commands. */
    const char *star = session ? ":*" : "";
    fprintf(f, "user default off nopass ~ll:%s%s resetchannels -@all %s\n", session ? session : "*",
            star, S_ACL_COMMANDS);
    fprintf(f, "user looseleaf on >%s ~ll:%s%s resetchannels -@all %s\n", pw,
            session ? session : "*", star, S_ACL_COMMANDS);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    free(path);
    free(tmp);
    return rc;
}

/* ---- spawning -------------------------------------------------------------- */

/* Start ARGV[0] (found on PATH) with ARGV, in a session of its own, stdio on
 * /dev/null, signals at their defaults, and SIGKILL once the calling thread
 * ends.  fork + exec, not posix_spawn: only the child can ask for its parent
 * death signal.  Between the two only async-signal-safe calls (this process
 * has other threads).  0 with *PID, or -1 with ERR (the exec failed: its
 * errno comes back through a close-on-exec pipe). */
static int s_spawn(char *const argv[], pid_t *pid, char *err, size_t errlen)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "cannot start %s: pipe: %s", argv[0], strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* no handler of ours runs in the child */
    pid_t child = fork();
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the parent went before we could ask */
            _exit(127);
        setsid();
        static const int defaults[] = {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD};
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            sigaction(defaults[i], &dfl, NULL);
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        /* Nothing of the kernel's (sockets, the pool) goes with it. */
        if (pfd[1] > 3)
            syscall(SYS_close_range, 3, pfd[1] - 1, 0);
        syscall(SYS_close_range, pfd[1] + 1, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvp(argv[0], argv);
        int e = errno;
        ssize_t w = write(pfd[1], &e, sizeof e);
        (void) w;
        _exit(127);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(pfd[1]);
    if (child < 0) {
        close(pfd[0]);
        snprintf(err, errlen, "cannot start %s: fork: %s", argv[0], strerror(fork_errno));
        return -1;
    }
    int e = 0;
    ssize_t n;
    while ((n = read(pfd[0], &e, sizeof e)) < 0 && errno == EINTR)
        ;
    close(pfd[0]);
    if (n == (ssize_t) sizeof e) {
        waitpid(child, NULL, 0);
        snprintf(err, errlen, "cannot start %s: %s", argv[0], strerror(e));
        return -1;
    }
    *pid = child;
    return 0;
}

char *ll_redis_start(const char *runtime_dir, const char *session, bool *started, char *err,
                     size_t errlen)
{
    *started = false;
    if (s_prepare_dir(runtime_dir, err, errlen) != 0)
        return NULL;
    char *sock = s_join(runtime_dir, "redis.sock");
    char *pidf = s_join(runtime_dir, "redis.pid");
    char *logf = s_join(runtime_dir, "redis.log");
    char *aclf = s_join(runtime_dir, "users.acl");
    char *lockf = s_join(runtime_dir, "redis.lock");
    char *result = NULL;
    char pw[65] = "";
    int lock_fd = -1;
    if (!sock || !pidf || !logf || !aclf || !lockf) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (strlen(sock) >= sizeof(((struct sockaddr_un *) 0)->sun_path)) {
        snprintf(err, errlen, "runtime directory path too long for a unix socket: %s", sock);
        goto out;
    }
    /* Two processes starting the server at once would each spawn one, and
     * the second would take over the socket and share the first's AOF: a
     * lock file serializes starters; the second then finds it answering. */
    lock_fd = open(lockf, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "cannot lock %s/redis.lock: %s", runtime_dir, strerror(errno));
        goto out;
    }
    if (s_password(runtime_dir, pw, err, errlen) != 0)
        goto out;
    if (s_ping(sock, pw)) {
        result = sock;
        sock = NULL;
        goto out;
    }
    if (s_write_acl(runtime_dir, session, pw, err, errlen) != 0)
        goto out;
    unlink(sock);
    const char *server = getenv("LL_REDIS_SERVER");
    if (!server || !*server)
        server = "redis-server";
    const char *argv[] = {server,      "--port",           "0",      "--unixsocket",
                          sock,        "--unixsocketperm", "700",    "--dir",
                          runtime_dir, "--save",           "",       "--appendonly",
                          "yes",       "--appendfsync",    "always", "--appenddirname",
                          "redis-aof", "--pidfile",        pidf,     "--logfile",
                          logf,        "--daemonize",      "no",     "--databases",
                          "1",         "--aclfile",        aclf,     NULL};
    pid_t pid;
    if (s_spawn((char *const *) argv, &pid, err, errlen) != 0)
        goto out;
    double deadline = ll_clock_s() + 15.0;
    for (;;) {
        if (s_ping(sock, pw))
            break;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            snprintf(err, errlen, "redis-server in %s exited at start (status %d)", runtime_dir,
                     WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
            s_log_tail(runtime_dir, err, errlen);
            goto out;
        }
        if (ll_clock_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            snprintf(err, errlen, "redis-server in %s did not answer within 15 s", runtime_dir);
            s_log_tail(runtime_dir, err, errlen);
            goto out;
        }
        s_nap_ms(2);
    }
    ll_info("store", "started redis-server %d on %s", (int) pid, sock);
    *started = true;
    result = sock;
    sock = NULL;
out:
    if (lock_fd >= 0)
        close(lock_fd); /* releases the lock */
    memset(pw, 0, sizeof pw);
    free(sock);
    free(pidf);
    free(logf);
    free(aclf);
    free(lockf);
    return result;
}

/* Whether PID runs a redis-server (so a recycled pid is never killed). */
static bool s_is_redis(pid_t pid)
{
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int) pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    if (!fgets(comm, sizeof comm, f))
        comm[0] = 0;
    fclose(f);
    return strncmp(comm, "redis", 5) == 0;
}

pid_t ll_redis_server_pid(const char *runtime_dir)
{
    char *pidf = s_join(runtime_dir, "redis.pid");
    FILE *f = pidf ? fopen(pidf, "re") : NULL;
    free(pidf);
    if (!f)
        return 0;
    int pid = 0;
    if (fscanf(f, "%d", &pid) != 1)
        pid = 0;
    fclose(f);
    return pid > 0 && s_is_redis(pid) ? (pid_t) pid : 0;
}

int ll_redis_stop(const char *runtime_dir, char *err, size_t errlen)
{
    pid_t pid = ll_redis_server_pid(runtime_dir);
    if (pid <= 0)
        return 0;
    if (kill(pid, SIGTERM) != 0) {
        if (errno == ESRCH)
            return 0;
        snprintf(err, errlen, "cannot stop redis-server %d: %s", (int) pid, strerror(errno));
        return -1;
    }
    kill(pid, SIGCONT); /* a stopped server could not act on it */
    double deadline = ll_clock_s() + 10.0;
    bool killed = false;
    for (;;) {
        int status;
        pid_t w = waitpid(pid, &status, WNOHANG); /* reap it if it is our child */
        if (w == pid || (w < 0 && kill(pid, 0) != 0 && errno == ESRCH))
            break;
        if (w < 0 && !s_is_redis(pid)) /* a zombie of someone else's */
            break;
        if (!killed && ll_clock_s() > deadline) {
            ll_warn("store", "redis-server %d ignored SIGTERM for 10 s; killing it", (int) pid);
            kill(pid, SIGKILL);
            killed = true;
        }
        s_nap_ms(2);
    }
    ll_info("store", "stopped redis-server %d of %s", (int) pid, runtime_dir);
    return 1;
}

/* ---- the guard -------------------------------------------------------------- */

struct ll_redis_guard_t {
    char *dir, *session;
    pid_t owner; /* the process whose thread it is */
    int stop_fd; /* eventfd: the thread ends */
    pthread_t thread;
    _Atomic unsigned long restarts;
};

static int s_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int) syscall(SYS_pidfd_open, pid, 0);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static void s_pidfd_kill(int pidfd, pid_t pid)
{
#ifdef SYS_pidfd_send_signal
    if (pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0) == 0)
        return;
#endif
    if (s_is_redis(pid))
        kill(pid, SIGKILL);
}

/* Wait up to MS for the stop eventfd (true: stop) or, when PIDFD >= 0, the
 * server's exit (*EXITED).  Without a pidfd the pid is polled. */
static bool s_guard_wait(ll_redis_guard_t *g, int pidfd, pid_t pid, int ms, bool *exited)
{
    struct pollfd p[2] = {{g->stop_fd, POLLIN, 0}, {pidfd, POLLIN, 0}};
    int n = poll(p, 2, ms);
    if (n > 0 && p[0].revents)
        return true;
    *exited = pidfd >= 0 ? n > 0 && p[1].revents : pid > 0 && !s_is_redis(pid);
    return false;
}

/* Start the server again until it runs (or the guard stops): with backoff,
 * since a server that cannot start now may later.  Returns its pid, 0 when
 * stopped. */
static pid_t s_guard_restart(ll_redis_guard_t *g)
{
    double backoff = 100;
    for (;;) {
        char err[512];
        bool started;
        char *sock = ll_redis_start(g->dir, g->session, &started, err, sizeof err);
        pid_t pid = sock ? ll_redis_server_pid(g->dir) : 0;
        free(sock);
        if (pid > 0) {
            if (started) {
                atomic_fetch_add(&g->restarts, 1);
                ll_warn("store", "redis-server of %s started again (pid %d) on the same data",
                        g->dir, (int) pid);
            }
            return pid;
        }
        ll_error("store", "cannot start redis-server of %s again: %s", g->dir,
                 sock ? "no pid file" : err);
        bool exited;
        if (s_guard_wait(g, -1, 0, (int) backoff, &exited))
            return 0;
        backoff = backoff * 2 < 10000 ? backoff * 2 : 10000;
    }
}

/* One health check: PING within HALF_MS on CONN (made here when NULL).
 * False when the server did not answer in time although it took the
 * connection (stopped, stalled); a refused connection is a server going or
 * starting, which the pidfd tells: true. */
static bool s_guard_ping(ll_redis_guard_t *g, ll_redis_t **conn, double half_ms)
{
    char err[256];
    if (!*conn) {
        char *sock = s_join(g->dir, "redis.sock");
        char url[PATH_MAX + 8];
        snprintf(url, sizeof url, "unix://%s", sock ? sock : "");
        free(sock);
        /* Stopping the guard ends a login or PING that waits for a silent
         * server. */
        *conn = ll_redis_connect_timeout(url, half_ms, g->stop_fd, err, sizeof err);
        if (!*conn)
            return !strstr(err, "did not answer");
    }
    ll_redis_begin(*conn);
    redisReply *r = ll_redis_cmdf(*conn, "PING");
    bool stalled = !r && ll_redis_failure(*conn) == LL_REDIS_UNAVAILABLE &&
                   strstr(ll_redis_errstr(*conn), "did not answer");
    if (r)
        freeReplyObject(r);
    if (!r)
        ll_redis_destroy(conn); /* a fresh connection next time */
    return !stalled;
}

static void *s_guard_main(void *arg)
{
    ll_redis_guard_t *g = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    /* A PING gets half the store's timeout: a server silent that long is
     * killed and started again before the store's own calls give up. */
    double half_ms = ll_redis_timeout_s() * 1e3 / 2;
    ll_redis_t *conn = NULL;
    pid_t pid = ll_redis_server_pid(g->dir);
    int pidfd = pid > 0 ? s_pidfd_open(pid) : -1;
    for (;;) {
        bool exited = pid <= 0;
        if (!exited && s_guard_wait(g, pidfd, pid, 1000, &exited))
            break;
        if (exited) {
            int status = 0;
            bool ours = pid > 0 && waitpid(pid, &status, WNOHANG) == pid; /* no <defunct> */
            if (pid > 0)
                ll_warn("store", "redis-server %d of %s %s; starting it again", (int) pid, g->dir,
                        !ours                 ? "is gone"
                        : WIFSIGNALED(status) ? "was killed"
                                              : "exited");
            if (pidfd >= 0)
                close(pidfd);
            ll_redis_destroy(&conn);
            pid = s_guard_restart(g);
            if (pid <= 0)
                break;
            pidfd = s_pidfd_open(pid);
            continue;
        }
        if (!s_guard_ping(g, &conn, half_ms)) {
            ll_warn("store", "redis-server %d of %s did not answer for %.1f s: killing it",
                    (int) pid, g->dir, half_ms / 1e3);
            s_pidfd_kill(pidfd, pid);
        }
    }
    if (pidfd >= 0)
        close(pidfd);
    ll_redis_destroy(&conn);
    return NULL;
}

ll_redis_guard_t *ll_redis_guard_new(const char *runtime_dir, const char *session)
{
    ll_redis_guard_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->dir = strdup(runtime_dir);
    g->session = session ? strdup(session) : NULL;
    g->owner = getpid();
    g->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!g->dir || (session && !g->session) || g->stop_fd < 0 ||
        pthread_create(&g->thread, NULL, s_guard_main, g) != 0) {
        ll_warn("store", "cannot start the guard of redis-server in %s: it will not be restarted",
                runtime_dir);
        if (g->stop_fd >= 0)
            close(g->stop_fd);
        free(g->dir);
        free(g->session);
        free(g);
        return NULL;
    }
    return g;
}

void ll_redis_guard_destroy(ll_redis_guard_t **g_p)
{
    if (!g_p || !*g_p)
        return;
    ll_redis_guard_t *g = *g_p;
    if (getpid() == g->owner) {
        uint64_t one = 1;
        ssize_t w = write(g->stop_fd, &one, sizeof one);
        (void) w;
        pthread_join(g->thread, NULL);
        close(g->stop_fd);
    }
    free(g->dir);
    free(g->session);
    free(g);
    *g_p = NULL;
}

unsigned long ll_redis_guard_restarts(ll_redis_guard_t *g)
{
    return g ? atomic_load(&g->restarts) : 0;
}

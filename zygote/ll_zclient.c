/* ll_zclient: the kernel's side of the host pool (zygote/API.md).
 *
 * Runs in the kernel process, which has ZeroMQ threads and therefore never
 * forks: a missing pool is started with posix_spawn (exec), and the pool
 * detaches itself.  One thread uses a client at a time. */
#include "zygote/ll_zclient.h"
#include "zygote/ll_zframe.h"
#include "base/ll_clock.h"
#include "base/ll_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct ll_zclient_t {
    int fd;           /* connection to the pool */
    ll_zreader_t *rd; /* frames from it */
    bool ok;          /* connection up */
};

void ll_zclient_default_dir(char *out, size_t outlen)
{
    const char *env = getenv("LOOSELEAF_POOL_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (env && *env)
        snprintf(out, outlen, "%s", env);
    else if (xdg && *xdg)
        snprintf(out, outlen, "%s/looseleaf-pool", xdg);
    else
        snprintf(out, outlen, "/tmp/looseleaf-pool-%d", (int) getuid());
}

static int s_connect(const char *sock)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sa.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

ll_zclient_t *ll_zclient_connect(const char *runtime_dir, const char *exe,
                                 const char *const *extra_args, char *err, size_t errlen)
{
    char dir[PATH_MAX], sock[PATH_MAX + 16];
    if (runtime_dir)
        snprintf(dir, sizeof dir, "%s", runtime_dir);
    else
        ll_zclient_default_dir(dir, sizeof dir);
    snprintf(sock, sizeof sock, "%s/pool.sock", dir);
    int fd = s_connect(sock);
    if (fd < 0) {
        char self[PATH_MAX], name[PATH_MAX];
        const char *argv0 = exe;
        if (!exe) {
            /* Our own binary, even when a rebuild replaced it on disk. */
            if (ll_zframe_self_exe(self, sizeof self, name, sizeof name) < 0) {
                snprintf(err, errlen, "cannot find the looseleaf binary: %s", strerror(errno));
                return NULL;
            }
            exe = self;
            argv0 = name;
        }
        const char *argv[64] = {argv0, "pool", "--runtime-dir", dir};
        int na = 4;
        for (int i = 0; extra_args && extra_args[i] && na < 62; i++)
            argv[na++] = extra_args[i];
        argv[na] = NULL;
        /* The pool outlives this kernel and serves others: its own session
         * (a notebook interrupt signals the kernel's process group), no
         * signal blocked (the kernel's threads block some), and not the
         * kernel's stdout/stderr (they may be the capture pipes that feed the
         * notebook): the pool redirects them to its log as it detaches. */
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        sigset_t none;
        sigemptyset(&none);
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        if (ll_log_fd() > 2) {
            posix_spawn_file_actions_adddup2(&fa, ll_log_fd(), 1);
            posix_spawn_file_actions_adddup2(&fa, ll_log_fd(), 2);
        }
        pid_t pid;
        int rc = posix_spawn(&pid, exe, &fa, &attr, (char *const *) argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        if (rc != 0) {
            snprintf(err, errlen, "cannot start the pool (%s): %s", exe, strerror(rc));
            return NULL;
        }
        int status;
        waitpid(pid, &status, 0); /* the pool detached; this is its launcher */
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            snprintf(err, errlen, "the pool failed to start (status %d); see %s/pool.log", status,
                     dir);
            return NULL;
        }
        /* The detached pool binds its socket within milliseconds; wait for it
         * (connecting is the condition, there is nothing else to watch). */
        for (int i = 0; i < 1000 && fd < 0; i++) {
            fd = s_connect(sock);
            if (fd < 0) {
                struct timespec ts = {0, 10 * 1000000};
                nanosleep(&ts, NULL);
            }
        }
        if (fd < 0) {
            snprintf(err, errlen, "the pool did not come up at %s: %s (see %s/pool.log)", sock,
                     strerror(errno), dir);
            return NULL;
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ll_zclient_t *self = calloc(1, sizeof *self);
    if (!self) {
        close(fd);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->fd = fd;
    self->rd = ll_zreader_new(fd);
    self->ok = true;
    return self;
}

void ll_zclient_destroy(ll_zclient_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_zclient_t *self = *self_p;
    close(self->fd);
    ll_zreader_destroy(&self->rd);
    free(self);
    *self_p = NULL;
}

int ll_zclient_fd(ll_zclient_t *self)
{
    return self->fd;
}

bool ll_zclient_ok(ll_zclient_t *self)
{
    return self->ok;
}

static int s_send(ll_zclient_t *self, json_t *msg)
{
    int rc = self->ok ? ll_zframe_send(self->fd, msg, -1) : -1;
    if (rc < 0)
        self->ok = false;
    json_decref(msg);
    return rc;
}

int ll_zclient_run(ll_zclient_t *self, const json_t *request, char *err, size_t errlen)
{
    if (!json_is_object(request) || !json_is_string(json_object_get(request, "id")) ||
        !json_is_string(json_object_get(request, "code")) ||
        !json_is_string(json_object_get(request, "session")) ||
        !json_is_string(json_object_get(request, "store_dir"))) {
        snprintf(err, errlen, "a run request needs string fields id, code, session and store_dir");
        return -1;
    }
    json_t *m = json_copy((json_t *) request);
    json_object_set_new(m, "type", json_string("run"));
    if (s_send(self, m) < 0) {
        snprintf(err, errlen, "the pool connection is gone: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int ll_zclient_prefetch(ll_zclient_t *self, const json_t *request, char *err, size_t errlen)
{
    if (!json_is_object(request) || !json_is_string(json_object_get(request, "id")) ||
        !json_is_string(json_object_get(request, "session")) ||
        !json_is_string(json_object_get(request, "store_dir"))) {
        snprintf(err, errlen, "a prefetch request needs string fields id, session and store_dir");
        return -1;
    }
    json_t *m = json_copy((json_t *) request);
    json_object_set_new(m, "type", json_string("prefetch"));
    if (s_send(self, m) < 0) {
        snprintf(err, errlen, "the pool connection is gone: %s", strerror(errno));
        return -1;
    }
    return 0;
}

json_t *ll_zclient_next(ll_zclient_t *self, int timeout_ms)
{
    bool bad = false;
    json_t *m = ll_zreader_pop(self->rd, &bad);
    if (m || bad || !self->ok)
        goto out;
    double t0 = ll_clock_ms();
    for (;;) {
        struct pollfd p = {self->fd, POLLIN, 0};
        int left = timeout_ms;
        if (timeout_ms > 0) {
            left = timeout_ms - (int) (ll_clock_ms() - t0);
            if (left < 0)
                left = 0;
        }
        int rc = poll(&p, 1, left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return NULL;
        int fr = ll_zreader_fill(self->rd);
        m = ll_zreader_pop(self->rd, &bad);
        if (m || bad)
            break;
        if (fr < 0) {
            self->ok = false;
            return json_pack("{s:s}", "type", "pool_gone");
        }
        if (timeout_ms == 0)
            return NULL;
    }
out:
    if (bad) {
        self->ok = false;
        return json_pack("{s:s}", "type", "pool_gone");
    }
    return m;
}

int ll_zclient_input_reply(ll_zclient_t *self, const char *id, const char *value)
{
    return s_send(self, json_pack("{s:s, s:s, s:s}", "type", "input_reply", "id", id, "value",
                                  value ? value : ""));
}

int ll_zclient_interrupt(ll_zclient_t *self, const char *id)
{
    return s_send(self, json_pack("{s:s, s:s}", "type", "interrupt", "id", id));
}

int ll_zclient_cancel(ll_zclient_t *self, const char *id)
{
    return s_send(self, json_pack("{s:s, s:s}", "type", "cancel", "id", id));
}

int ll_zclient_stats(ll_zclient_t *self)
{
    return s_send(self, json_pack("{s:s}", "type", "stats"));
}

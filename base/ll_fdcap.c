/* ll_fdcap: capture of fds 1 and 2 into pipes (see ll_fdcap.h).
 *
 * Runs in the kernel process.  The reader thread polls the read ends of the
 * pipes and an eventfd used to stop it.  Pipes are enlarged to 1 MiB so a
 * burst of C-level output does not stall the writer on a 64 KiB pipe while
 * the reader is busy; read ends are close-on-exec so children hold only the
 * write side (through fds 1/2). */
#include "base/ll_fdcap.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define LL_FDCAP_PIPE_SIZE (1 << 20)
#define LL_FDCAP_CHUNK     (64 * 1024)

struct ll_fdcap_t {
    size_t n;                /* captured descriptors */
    int fds[LL_FDCAP_MAX];   /* the captured numbers (1, 2) */
    int saved[LL_FDCAP_MAX]; /* dups of what they were before */
    int rd[LL_FDCAP_MAX];    /* read ends of the pipes (-1 at EOF) */
    const char *names[LL_FDCAP_MAX];
    ll_fdcap_sink_fn *sink;
    void *ctx;
    int stop_fd;          /* eventfd: wakes the reader to exit */
    pthread_mutex_t lock; /* one reader of the pipes at a time */
    pthread_t reader;
    bool reader_started;
    char chunk[LL_FDCAP_CHUNK]; /* read buffer (under lock) */
};

/* Read what is available on pipe I now and pass it on.  Caller holds lock.
 * Returns false at EOF. */
static bool s_drain_one(ll_fdcap_t *self, size_t i)
{
    while (self->rd[i] >= 0) {
        ssize_t r = read(self->rd[i], self->chunk, sizeof self->chunk);
        if (r > 0) {
            self->sink(self->ctx, self->names[i], self->chunk, (size_t) r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return true;
        /* EOF (every write end closed) or a real error: stop reading it. */
        close(self->rd[i]);
        self->rd[i] = -1;
        return false;
    }
    return false;
}

static void *s_reader(void *arg)
{
    ll_fdcap_t *self = arg;
    /* Signals are for the thread that runs the cell (KeyboardInterrupt). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    struct pollfd pfd[LL_FDCAP_MAX + 1];
    for (;;) {
        size_t np = 0;
        pfd[np++] = (struct pollfd){.fd = self->stop_fd, .events = POLLIN};
        for (size_t i = 0; i < self->n; i++)
            pfd[np++] = (struct pollfd){.fd = self->rd[i], .events = POLLIN};
        /* A negative fd is ignored by poll: finished pipes drop out. */
        int rc = poll(pfd, np, -1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            break;
        if (pfd[0].revents)
            break;
        pthread_mutex_lock(&self->lock);
        for (size_t i = 0; i < self->n; i++)
            if (pfd[i + 1].revents)
                s_drain_one(self, i);
        pthread_mutex_unlock(&self->lock);
    }
    return NULL;
}

ll_fdcap_t *ll_fdcap_new(const int *fds, const char *const *names, size_t n, ll_fdcap_sink_fn *sink,
                         void *ctx, char *err, size_t errlen)
{
    if (n == 0 || n > LL_FDCAP_MAX || !sink) {
        snprintf(err, errlen, "fdcap: bad arguments");
        return NULL;
    }
    ll_fdcap_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "fdcap: out of memory");
        return NULL;
    }
    self->sink = sink;
    self->ctx = ctx;
    self->stop_fd = -1;
    for (size_t i = 0; i < LL_FDCAP_MAX; i++)
        self->saved[i] = self->rd[i] = self->fds[i] = -1;
    pthread_mutex_init(&self->lock, NULL);

    self->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (self->stop_fd < 0) {
        snprintf(err, errlen, "fdcap: eventfd: %s", strerror(errno));
        goto out_undo;
    }
    for (size_t i = 0; i < n; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) {
            snprintf(err, errlen, "fdcap: pipe: %s", strerror(errno));
            goto out_undo;
        }
        (void) fcntl(p[0], F_SETPIPE_SZ, LL_FDCAP_PIPE_SIZE); /* best effort */
        (void) fcntl(p[0], F_SETFL, O_NONBLOCK);
        int saved = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
        if (saved < 0 || dup2(p[1], fds[i]) < 0) {
            snprintf(err, errlen, "fdcap: redirecting fd %d: %s", fds[i], strerror(errno));
            if (saved >= 0)
                close(saved);
            close(p[0]);
            close(p[1]);
            goto out_undo;
        }
        close(p[1]);
        self->fds[i] = fds[i];
        self->saved[i] = saved;
        self->rd[i] = p[0];
        self->names[i] = names[i];
        self->n = i + 1;
    }
    if (pthread_create(&self->reader, NULL, s_reader, self) != 0) {
        snprintf(err, errlen, "fdcap: cannot start the reader thread");
        goto out_undo;
    }
    self->reader_started = true;
    return self;

out_undo:
    ll_fdcap_destroy(&self);
    return NULL;
}

void ll_fdcap_destroy(ll_fdcap_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_fdcap_t *self = *self_p;
    /* Put the original files back first: later writes go there directly. */
    for (size_t i = 0; i < self->n; i++)
        if (self->saved[i] >= 0)
            dup2(self->saved[i], self->fds[i]);
    if (self->reader_started) {
        uint64_t one = 1;
        ssize_t w = write(self->stop_fd, &one, sizeof one);
        (void) w;
        pthread_join(self->reader, NULL);
    }
    /* Whatever was written before the restore is still in the pipes. */
    for (size_t i = 0; i < self->n; i++) {
        if (self->rd[i] >= 0) {
            s_drain_one(self, i);
            if (self->rd[i] >= 0)
                close(self->rd[i]);
        }
        if (self->saved[i] >= 0)
            close(self->saved[i]);
    }
    if (self->stop_fd >= 0)
        close(self->stop_fd);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

int ll_fdcap_original(const ll_fdcap_t *self, size_t i)
{
    if (!self || i >= self->n)
        return -1;
    return self->saved[i];
}

void ll_fdcap_sync(ll_fdcap_t *self)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->lock);
    for (size_t i = 0; i < self->n; i++)
        s_drain_one(self, i);
    pthread_mutex_unlock(&self->lock);
}

/* ---- self-test ----------------------------------------------------------- */

typedef struct {
    pthread_mutex_t lock;
    char text[256];
    size_t len;
    char last_name[16];
} s_sink_t;

static void s_sink(void *ctx, const char *name, const char *data, size_t len)
{
    s_sink_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, data, len);
        s->len += len;
    }
    snprintf(s->last_name, sizeof s->last_name, "%s", name);
    pthread_mutex_unlock(&s->lock);
}

int ll_fdcap_selftest(bool verbose)
{
    static s_sink_t s;
    int rc = -1;
    char err[128];
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.lock, NULL);

    /* Capture a private descriptor (not the runner's own stdout) that points
     * at a file, so the restore can be checked too. */
    char path[] = "/tmp/ll_fdcap_XXXXXX";
    int file = mkstemp(path);
    if (file < 0)
        return -1;
    unlink(path);
    int fd = fcntl(file, F_DUPFD, 20);
    int fds[1] = {fd};
    const char *names[1] = {"stdout"};
    ll_fdcap_t *cap = ll_fdcap_new(fds, names, 1, s_sink, &s, err, sizeof err);
    if (!cap) {
        fprintf(stderr, "ll_fdcap selftest: %s\n", err);
        goto out;
    }
    if (write(fd, "hello ", 6) != 6 || write(fd, "world\n", 6) != 6)
        goto out;
    /* After sync everything written is with the sink, no waiting needed. */
    ll_fdcap_sync(cap);
    pthread_mutex_lock(&s.lock);
    bool got = s.len == 12 && memcmp(s.text, "hello world\n", 12) == 0 &&
               strcmp(s.last_name, "stdout") == 0;
    pthread_mutex_unlock(&s.lock);
    if (!got) {
        fprintf(stderr, "ll_fdcap selftest: captured text missing\n");
        goto out;
    }
    /* A child process writing to the captured fd is captured as well. */
    char cmd[64];
    snprintf(cmd, sizeof cmd, "printf child >/dev/fd/%d", fd);
    if (system(cmd) != 0)
        goto out;
    ll_fdcap_sync(cap);
    pthread_mutex_lock(&s.lock);
    got = s.len == 17 && memcmp(s.text + 12, "child", 5) == 0;
    pthread_mutex_unlock(&s.lock);
    if (!got) {
        fprintf(stderr, "ll_fdcap selftest: child output missing\n");
        goto out;
    }
    if (ll_fdcap_original(cap, 0) < 0 || ll_fdcap_original(cap, 1) != -1)
        goto out;
    ll_fdcap_destroy(&cap);
    /* Restored: writes reach the file again, not the sink. */
    if (write(fd, "after", 5) != 5)
        goto out;
    char back[8] = {0};
    if (pread(file, back, 5, 0) != 5 || memcmp(back, "after", 5) != 0) {
        fprintf(stderr, "ll_fdcap selftest: fd not restored\n");
        goto out;
    }
    if (s.len != 17)
        goto out;
    if (verbose)
        printf("(captured %zu bytes) ", s.len);
    rc = 0;
out:
    ll_fdcap_destroy(&cap);
    close(fd);
    close(file);
    pthread_mutex_destroy(&s.lock);
    return rc;
}

/* ll_zframe: length-prefixed JSON frames (+ optional SCM_RIGHTS fd) over unix
 * stream sockets; used by the pool, the zygotes, the workers, the client and
 * the broker.
 * No threads, no state besides a reader's buffer. */
#include "proto/ll_zframe.h"
#include "base/ll_check.h"

#include <limits.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <stdio.h>
#include <unistd.h>

struct ll_zreader_t {
    int fd;     /* not owned */
    char *buf;  /* bytes read and not yet popped */
    size_t len; /* bytes in buf */
    size_t cap; /* allocated */
    size_t max; /* the longest frame body accepted */
};

int ll_zframe_self_exe(char *exec_path, size_t plen, char *argv0, size_t alen)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    static const char gone[] = " (deleted)";
    size_t gl = sizeof gone - 1;
    if ((size_t) n > gl && strcmp(buf + n - gl, gone) == 0)
        buf[n - gl] = '\0';
    snprintf(exec_path, plen, "/proc/self/exe");
    snprintf(argv0, alen, "%s", buf);
    return 0;
}

char *ll_zframe_encode(const json_t *msg, size_t *len)
{
    char *body = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!body)
        return NULL;
    size_t n = strlen(body);
    char *out = malloc(n + 4);
    if (out) {
        out[0] = (char) (n >> 24), out[1] = (char) (n >> 16), out[2] = (char) (n >> 8),
        out[3] = (char) n;
        memcpy(out + 4, body, n);
        *len = n + 4;
    }
    free(body);
    return out;
}

int ll_zframe_send(int fd, const json_t *msg, int passfd)
{
    return ll_zframe_send_within(fd, msg, passfd, -1);
}

int ll_zframe_send_within(int fd, const json_t *msg, int passfd, int timeout_ms)
{
    char *body = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!body) {
        errno = ENOMEM;
        return -1;
    }
    size_t n = strlen(body);
    unsigned char hdr[4] = {(unsigned char) (n >> 24), (unsigned char) (n >> 16),
                            (unsigned char) (n >> 8), (unsigned char) n};
    struct iovec iov[2] = {{hdr, 4}, {body, n}};
    struct msghdr mh = {0};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } cbuf;
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    if (passfd >= 0) {
        memset(&cbuf, 0, sizeof cbuf);
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = sizeof cbuf.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &passfd, sizeof(int));
    }
    size_t total = 4 + n, sent = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (sent < total) {
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                /* A slow reader: the pool's sockets are non-blocking; wait
                 * for room rather than drop a frame half-written (a frame
                 * cut short would leave the stream unreadable). */
                int left = -1;
                if (timeout_ms >= 0) {
                    struct timespec t;
                    clock_gettime(CLOCK_MONOTONIC, &t);
                    long spent = (long) (t.tv_sec - t0.tv_sec) * 1000 +
                                 (long) (t.tv_nsec - t0.tv_nsec) / 1000000;
                    if (spent >= timeout_ms) {
                        free(body);
                        errno = ETIMEDOUT;
                        return -1;
                    }
                    left = timeout_ms - (int) spent;
                }
                struct pollfd p = {fd, POLLOUT, 0};
                (void) poll(&p, 1, left); /* error or hang-up: sendmsg says which */
                continue;
            }
            int e = errno;
            free(body);
            errno = e;
            return -1;
        }
        sent += (size_t) w;
        mh.msg_control = NULL; /* the fd went with the first byte */
        mh.msg_controllen = 0;
        /* Advance the iovecs past what was written. */
        size_t skip = (size_t) w;
        while (mh.msg_iovlen && skip >= mh.msg_iov[0].iov_len) {
            skip -= mh.msg_iov[0].iov_len;
            mh.msg_iov++;
            mh.msg_iovlen--;
        }
        if (mh.msg_iovlen) {
            mh.msg_iov[0].iov_base = (char *) mh.msg_iov[0].iov_base + skip;
            mh.msg_iov[0].iov_len -= skip;
        }
    }
    free(body);
    return 0;
}

/* Read exactly LEN bytes; the first read may pick up a passed fd. */
static int s_read_full(int fd, void *dst, size_t len, int *passfd, bool nointr)
{
    size_t got = 0;
    while (got < len) {
        struct iovec iov = {(char *) dst + got, len - got};
        struct msghdr mh = {0};
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } cbuf;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.buf;
        mh.msg_controllen = sizeof cbuf.buf;
        ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        if (r < 0) {
            if (errno == EINTR && nointr)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = got ? EPROTO : 0;
            return -1;
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int pfd;
                memcpy(&pfd, CMSG_DATA(c), sizeof(int));
                if (passfd && *passfd < 0)
                    *passfd = pfd;
                else
                    close(pfd);
            }
        }
        got += (size_t) r;
    }
    return 0;
}

json_t *ll_zframe_recv(int fd, int *passfd, bool nointr)
{
    if (passfd)
        *passfd = -1;
    unsigned char hdr[4];
    if (s_read_full(fd, hdr, 4, passfd, nointr) < 0)
        return NULL;
    uint32_t n =
        ((uint32_t) hdr[0] << 24) | ((uint32_t) hdr[1] << 16) | ((uint32_t) hdr[2] << 8) | hdr[3];
    if (n > LL_ZFRAME_MAX) {
        errno = EPROTO;
        return NULL;
    }
    char *body = malloc(n + 1);
    if (!body) {
        errno = ENOMEM;
        return NULL;
    }
    if (s_read_full(fd, body, n, passfd, true) < 0) {
        int e = errno ? errno : EPROTO;
        free(body);
        errno = e;
        return NULL;
    }
    json_error_t jerr;
    json_t *msg = json_loadb(body, n, 0, &jerr);
    free(body);
    if (!msg || !json_is_object(msg)) {
        json_decref(msg);
        errno = EPROTO;
        return NULL;
    }
    return msg;
}

ll_zreader_t *ll_zreader_new(int fd)
{
    return ll_zreader_new_max(fd, LL_ZFRAME_MAX);
}

ll_zreader_t *ll_zreader_new_max(int fd, size_t max)
{
    if (max < 1 || max > LL_ZFRAME_MAX)
        return NULL;
    ll_zreader_t *self = calloc(1, sizeof *self);
    if (self) {
        self->fd = fd;
        self->max = max;
    }
    return self;
}

void ll_zreader_destroy(ll_zreader_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->buf);
    free(*self_p);
    *self_p = NULL;
}

int ll_zreader_fill(ll_zreader_t *self)
{
    int any = 0;
    /* One whole frame fits; past that the peer's bytes wait in its socket
     * until frames are popped (a peer cannot grow this buffer at will). */
    size_t limit = self->max + 4, first = limit < 131072 ? limit : 131072;
    for (;;) {
        if (self->len >= limit)
            return any;
        size_t room = limit - self->len < 65536 ? limit - self->len : 65536;
        if (self->cap - self->len < room) {
            size_t cap = self->cap ? self->cap * 2 : first;
            cap = cap < limit ? cap : limit;
            char *nb = realloc(self->buf, cap);
            if (!nb) {
                errno = ENOMEM;
                return -1;
            }
            self->buf = nb;
            self->cap = cap;
        }
        size_t want = self->cap - self->len;
        want = want < limit - self->len ? want : limit - self->len;
        ssize_t r = read(self->fd, self->buf + self->len, want);
        if (r > 0) {
            self->len += (size_t) r;
            any = 1;
            continue;
        }
        if (r == 0) {
            errno = 0;
            return any ? 1 : -1; /* report the bytes first; EOF on the next call */
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN)
            return any;
        return -1;
    }
}

json_t *ll_zreader_pop(ll_zreader_t *self, bool *bad)
{
    *bad = false;
    if (self->len < 4)
        return NULL;
    const unsigned char *h = (const unsigned char *) self->buf;
    uint32_t n = ((uint32_t) h[0] << 24) | ((uint32_t) h[1] << 16) | ((uint32_t) h[2] << 8) | h[3];
    if (n > self->max) {
        *bad = true;
        return NULL;
    }
    if (self->len < 4 + (size_t) n)
        return NULL;
    json_error_t jerr;
    json_t *msg = json_loadb(self->buf + 4, n, 0, &jerr);
    memmove(self->buf, self->buf + 4 + n, self->len - 4 - n);
    self->len -= 4 + n;
    if (!msg || !json_is_object(msg)) {
        json_decref(msg);
        *bad = true;
        return NULL;
    }
    return msg;
}

/* ------------------------------------------------------------------ */
/* Self-test: round trip, a passed descriptor, partial and bad frames. */

#include <fcntl.h>

int ll_zframe_selftest(bool verbose)
{
    int sv[2], fails = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return 1;
    /* Blocking round trip with a descriptor. */
    int pfd[2];
    S_CHECK(pipe2(pfd, O_CLOEXEC) == 0);
    json_t *m = json_pack("{s:s, s:i, s:s}", "type", "fork", "n", 42, "text", "h\xc3\xa9llo");
    S_CHECK(ll_zframe_send(sv[0], m, pfd[1]) == 0);
    int got = -1;
    json_t *r = ll_zframe_recv(sv[1], &got, true);
    S_CHECK(r && json_equal(r, m));
    S_CHECK(got >= 0 && got != pfd[1]);
    if (got >= 0) {
        S_CHECK(write(got, "x", 1) == 1); /* the passed fd is the pipe's write end */
        char c = 0;
        S_CHECK(read(pfd[0], &c, 1) == 1 && c == 'x');
        close(got);
    }
    json_decref(r);
    close(pfd[0]);
    close(pfd[1]);
    /* A reader on a non-blocking fd: frames split anywhere, several in one read. */
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    ll_zreader_t *rd = ll_zreader_new(sv[1]);
    S_CHECK(ll_zframe_send(sv[0], m, -1) == 0 && ll_zframe_send(sv[0], m, -1) == 0);
    bool bad = true;
    S_CHECK(ll_zreader_fill(rd) == 1);
    json_t *a = ll_zreader_pop(rd, &bad), *b = ll_zreader_pop(rd, &bad),
           *c3 = ll_zreader_pop(rd, &bad);
    S_CHECK(a && b && !c3 && !bad && json_equal(a, m) && json_equal(b, m));
    json_decref(a);
    json_decref(b);
    S_CHECK(ll_zreader_fill(rd) == 0); /* nothing more: EAGAIN */
    const unsigned char part[] = {0, 0, 0, 2, '{'};
    S_CHECK(write(sv[0], part, sizeof part) == (ssize_t) sizeof part);
    S_CHECK(ll_zreader_fill(rd) == 1 && !ll_zreader_pop(rd, &bad) && !bad);
    S_CHECK(write(sv[0], "}", 1) == 1);
    S_CHECK(ll_zreader_fill(rd) == 1);
    a = ll_zreader_pop(rd, &bad);
    S_CHECK(a && json_object_size(a) == 0);
    json_decref(a);
    /* Not an object, and an oversize length: bad, never a crash. */
    const unsigned char arr[] = {0, 0, 0, 2, '[', ']'};
    S_CHECK(write(sv[0], arr, sizeof arr) == (ssize_t) sizeof arr);
    ll_zreader_fill(rd);
    S_CHECK(!ll_zreader_pop(rd, &bad) && bad);
    ll_zreader_destroy(&rd);
    S_CHECK(rd == NULL);
    ll_zreader_destroy(&rd); /* safe twice */
    const unsigned char huge[] = {0xff, 0xff, 0xff, 0xff};
    S_CHECK(write(sv[0], huge, sizeof huge) == 4);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) & ~O_NONBLOCK);
    errno = 0;
    S_CHECK(!ll_zframe_recv(sv[1], NULL, true) && errno == EPROTO);
    /* A bounded reader: a frame above its MAX is bad, and however much the
     * peer sent, it holds one frame's worth (the rest waits in the socket). */
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    {
        char junk[64];
        while (read(sv[1], junk, sizeof junk) > 0) /* what the huge header left */
            ;
    }
    json_t *small = json_pack("{s:s}", "type", "stats"); /* 16 bytes of JSON */
    rd = ll_zreader_new_max(sv[1], 20);
    S_CHECK(rd && !ll_zreader_new_max(sv[1], 0) && !ll_zreader_new_max(sv[1], LL_ZFRAME_MAX + 1));
    for (int i = 0; i < 10; i++)
        S_CHECK(ll_zframe_send(sv[0], small, -1) == 0);
    int popped = 0;
    S_CHECK(ll_zreader_fill(rd) == 1);
    while ((a = ll_zreader_pop(rd, &bad)))
        popped++, json_decref(a);
    S_CHECK(popped == 1 && !bad); /* 24 bytes buffered at most: one frame a fill */
    for (int turn = 0; turn < 20 && popped < 10; turn++) {
        ll_zreader_fill(rd);
        while ((a = ll_zreader_pop(rd, &bad)))
            popped++, json_decref(a);
    }
    S_CHECK(popped == 10 && !bad);
    json_t *big = json_pack("{s:s, s:s}", "type", "stats", "pad", "0123456789");
    S_CHECK(ll_zframe_send(sv[0], big, -1) == 0);
    ll_zreader_fill(rd);
    S_CHECK(!ll_zreader_pop(rd, &bad) && bad);
    ll_zreader_destroy(&rd);
    json_decref(big);
    {
        char junk[64];
        while (read(sv[1], junk, sizeof junk) > 0) /* the rest of the bad frame */
            ;
    }
    json_decref(small);
    /* A peer that does not read: ll_zframe_send_within gives up. */
    {
        int sp[2];
        S_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp) == 0);
        char pad[4096];
        memset(pad, 'x', sizeof pad - 1);
        pad[sizeof pad - 1] = '\0';
        json_t *fat = json_pack("{s:s}", "pad", pad);
        int rc = 0;
        for (int i = 0; i < 10000 && rc == 0; i++)
            rc = ll_zframe_send_within(sp[0], fat, -1, 50);
        S_CHECK(rc == -1 && errno == ETIMEDOUT);
        json_decref(fat);
        close(sp[0]);
        close(sp[1]);
    }
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) & ~O_NONBLOCK);
    /* Orderly EOF. */
    close(sv[0]);
    errno = 1;
    S_CHECK(!ll_zframe_recv(sv[1], NULL, true) && errno == 0);
    close(sv[1]);
    json_decref(m);
    if (verbose)
        fprintf(stderr, "ll_zframe: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}

/* ll_stream: stdout/stderr coalescer (see ll_stream.h for the contract).
 *
 * Runs in the kernel process: writers are Python threads (through the
 * interpreter hooks) and the fd-capture reader thread; the flusher is a
 * thread of its own.  Two locks, always taken in the order send -> buf:
 *   buf_lock   guards the write buffer; held only for a memcpy, so a writer
 *              never waits for the network;
 *   send_lock  held while a chunk is turned into a message and sent, and by
 *              ll_stream_flush_then callers; it orders everything on iopub.
 * A flush swaps the write buffer with the spare one under buf_lock, then
 * emits from the spare under send_lock alone, so writers keep appending
 * while the previous chunk is encoded and sent (that overlap is most of the
 * speed of the million-line benchmark on two cores). */
#include "base/ll_stream.h"
#include "base/ll_clock.h"
#include "base/ll_check.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LL_STREAM_DEFAULT_INTERVAL_MS 50
#define LL_STREAM_DEFAULT_THRESHOLD   (256 * 1024)
/* Past this many buffered bytes a writer flushes itself: bounded memory when
 * the frontend (or the flusher) cannot keep up. */
#define LL_STREAM_HARD_FACTOR 32
#define LL_STREAM_NAME_MAX    16

struct ll_stream_t {
    ll_stream_emit_fn *emit; /* where chunks go */
    void *ctx;               /* EMIT's context */
    int64_t interval_ns;     /* longest wait of a buffered byte */
    size_t threshold;        /* buffered bytes that wake the flusher early */

    pthread_mutex_t send_lock; /* orders emission; see top of file */
    pthread_mutex_t buf_lock;  /* guards every field below up to `spare` */
    pthread_cond_t cond;       /* wakes the flusher (data, urgency, stop) */
    char *buf;                 /* write buffer */
    size_t len, cap;
    char name[LL_STREAM_NAME_MAX]; /* stream of what is in buf */
    int64_t first_ns;              /* when buf became non-empty (monotonic) */
    uint64_t seq;                  /* number of writes, to detect a stale held tail */
    uint64_t hold_seq;             /* seq when an incomplete tail was last held back */
    bool holding;                  /* buf holds only a held-back incomplete tail */
    bool urgent;                   /* threshold crossed: flush without waiting */
    bool stop;                     /* destroy in progress */

    char *spare; /* chunk being emitted (send_lock) */
    size_t spare_cap;
    char *clean; /* UTF-8-cleaned copy of spare (send_lock) */
    size_t clean_cap;
    pthread_t flusher;
};

/* Length of the UTF-8 sequence starting with byte C, 0 if C cannot start one. */
static int s_seq_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* Whether S[0..N) (N >= 2) is a well-formed sequence (no overlongs, no
 * surrogates, nothing past U+10FFFF), judging only the bytes present. */
static bool s_seq_ok(const unsigned char *s, int n)
{
    unsigned char c = s[0], d = s[1];
    if (c == 0xE0 && d < 0xA0)
        return false;
    if (c == 0xED && d > 0x9F)
        return false;
    if (c == 0xF0 && d < 0x90)
        return false;
    if (c == 0xF4 && d > 0x8F)
        return false;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return false;
    return true;
}

size_t ll_stream_utf8_clean(const char *src, size_t len, bool final, char *dst, size_t *consumed)
{
    const unsigned char *s = (const unsigned char *) src;
    size_t i = 0, o = 0;
    while (i < len) {
        /* ASCII runs are the common case: copy them in one go. */
        size_t j = i;
        while (j < len && s[j] < 0x80)
            j++;
        if (j > i) {
            memcpy(dst + o, s + i, j - i);
            o += j - i;
            i = j;
            continue;
        }
        int n = s_seq_len(s[i]);
        if (n > 0 && i + n <= len && s_seq_ok(s + i, n)) {
            memcpy(dst + o, s + i, n);
            o += n;
            i += n;
            continue;
        }
        if (n > 0 && i + n > len) {
            /* Truncated at the end: a prefix of a valid sequence is held back. */
            size_t have = len - i;
            bool prefix_ok = have < 2 || s_seq_ok(s + i, (int) have);
            if (prefix_ok && !final)
                break;
        }
        memcpy(dst + o, "\xEF\xBF\xBD", 3); /* U+FFFD for one bad byte */
        o += 3;
        i++;
    }
    *consumed = i;
    return o;
}

/* Ensure *BUF has room for NEED bytes. */
static int s_reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 4096;
    while (ncap < need)
        ncap *= 2;
    char *nb = realloc(*buf, ncap);
    if (!nb)
        return -1;
    *buf = nb;
    *cap = ncap;
    return 0;
}

/* Emit what is buffered.  Caller holds send_lock, not buf_lock.  A non-final
 * flush keeps an incomplete UTF-8 tail in the buffer. */
static void s_flush_locked(ll_stream_t *self, bool final)
{
    char name[LL_STREAM_NAME_MAX];
    size_t len;

    pthread_mutex_lock(&self->buf_lock);
    if (self->len == 0) {
        pthread_mutex_unlock(&self->buf_lock);
        return;
    }
    /* A held tail not completed since waits for its next write or a final
     * flush: a timer never sends half a character (a writer stalled on a
     * loaded host for longer than one interval would see it as U+FFFD). */
    if (!final && self->holding && self->hold_seq == self->seq) {
        pthread_mutex_unlock(&self->buf_lock);
        return;
    }
    size_t keep = 0;
    if (!final) {
        /* Find an incomplete sequence in the last 3 bytes. */
        const unsigned char *s = (const unsigned char *) self->buf;
        size_t start = self->len > 3 ? self->len - 3 : 0;
        for (size_t i = self->len; i > start; i--) {
            unsigned char c = s[i - 1];
            if ((c & 0xC0) == 0x80)
                continue; /* continuation byte: look further back */
            int n = s_seq_len(c);
            if (n > 1 && (i - 1) + n > self->len)
                keep = self->len - (i - 1);
            break;
        }
    }
    /* Swap buffers; the held tail moves to the front of the new one. */
    char *out = self->buf;
    size_t out_cap = self->cap;
    len = self->len - keep;
    if (keep && s_reserve(&self->spare, &self->spare_cap, keep) < 0)
        keep = 0, len = self->len;
    self->buf = self->spare;
    self->cap = self->spare_cap;
    if (keep)
        memcpy(self->buf, out + len, keep);
    self->len = keep;
    self->holding = keep > 0;
    self->hold_seq = self->seq;
    self->first_ns = ll_clock_ns();
    self->urgent = false;
    self->spare = out;
    self->spare_cap = out_cap;
    memcpy(name, self->name, sizeof name);
    pthread_mutex_unlock(&self->buf_lock);

    if (len == 0)
        return;
    if (s_reserve(&self->clean, &self->clean_cap, len * 3) < 0) {
        /* Out of memory: dropping output beats crashing the kernel. */
        return;
    }
    size_t used;
    size_t n = ll_stream_utf8_clean(self->spare, len, true, self->clean, &used);
    self->emit(self->ctx, name, self->clean, n);
}

static void *s_flusher(void *arg)
{
    ll_stream_t *self = arg;
    /* Signals are for the thread that runs the cell (KeyboardInterrupt). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&self->buf_lock);
    while (!self->stop) {
        if (self->len == 0 || (self->holding && self->hold_seq == self->seq)) {
            /* Nothing, or only a held-back incomplete tail: a write wakes us. */
            pthread_cond_wait(&self->cond, &self->buf_lock);
            continue;
        }
        if (!self->urgent) {
            int64_t deadline = self->first_ns + self->interval_ns;
            if (ll_clock_ns() < deadline) {
                struct timespec ts = {.tv_sec = deadline / 1000000000,
                                      .tv_nsec = deadline % 1000000000};
                pthread_cond_timedwait(&self->cond, &self->buf_lock, &ts);
                continue;
            }
        }
        pthread_mutex_unlock(&self->buf_lock);
        pthread_mutex_lock(&self->send_lock);
        s_flush_locked(self, false);
        pthread_mutex_unlock(&self->send_lock);
        pthread_mutex_lock(&self->buf_lock);
    }
    pthread_mutex_unlock(&self->buf_lock);
    return NULL;
}

ll_stream_t *ll_stream_new(ll_stream_emit_fn *emit, void *ctx, int interval_ms, size_t threshold)
{
    ll_stream_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->emit = emit;
    self->ctx = ctx;
    self->interval_ns =
        (int64_t) (interval_ms > 0 ? interval_ms : LL_STREAM_DEFAULT_INTERVAL_MS) * 1000000;
    self->threshold = threshold ? threshold : LL_STREAM_DEFAULT_THRESHOLD;
    pthread_mutex_init(&self->send_lock, NULL);
    pthread_mutex_init(&self->buf_lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&self->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&self->flusher, NULL, s_flusher, self) != 0) {
        pthread_cond_destroy(&self->cond);
        pthread_mutex_destroy(&self->buf_lock);
        pthread_mutex_destroy(&self->send_lock);
        free(self);
        return NULL;
    }
    return self;
}

void ll_stream_destroy(ll_stream_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ll_stream_t *self = *self_p;
    pthread_mutex_lock(&self->buf_lock);
    self->stop = true;
    pthread_cond_signal(&self->cond);
    pthread_mutex_unlock(&self->buf_lock);
    pthread_join(self->flusher, NULL);
    ll_stream_flush(self);
    pthread_cond_destroy(&self->cond);
    pthread_mutex_destroy(&self->buf_lock);
    pthread_mutex_destroy(&self->send_lock);
    free(self->buf);
    free(self->spare);
    free(self->clean);
    free(self);
    *self_p = NULL;
}

void ll_stream_write(ll_stream_t *self, const char *name, const char *data, size_t len)
{
    if (!self || !name || (!data && len))
        return;
    if (len == 0)
        return;
    pthread_mutex_lock(&self->buf_lock);
    /* Another stream's text is buffered: send it first to keep the order. */
    while (self->len > 0 && strncmp(self->name, name, LL_STREAM_NAME_MAX - 1) != 0) {
        pthread_mutex_unlock(&self->buf_lock);
        pthread_mutex_lock(&self->send_lock);
        s_flush_locked(self, true);
        pthread_mutex_unlock(&self->send_lock);
        pthread_mutex_lock(&self->buf_lock);
    }
    if (s_reserve(&self->buf, &self->cap, self->len + len) < 0) {
        pthread_mutex_unlock(&self->buf_lock);
        return;
    }
    if (self->len == 0 || self->holding) {
        /* The buffer's first byte (a held tail counts as none): its
         * interval starts now, and the flusher waits for it. */
        if (self->len == 0)
            snprintf(self->name, sizeof self->name, "%s", name);
        self->first_ns = ll_clock_ns();
        pthread_cond_signal(&self->cond);
    }
    memcpy(self->buf + self->len, data, len);
    self->len += len;
    self->seq++;
    self->holding = false;
    bool hard = self->len >= self->threshold * LL_STREAM_HARD_FACTOR;
    if (!self->urgent && self->len >= self->threshold) {
        self->urgent = true;
        pthread_cond_signal(&self->cond);
    }
    pthread_mutex_unlock(&self->buf_lock);
    if (hard) {
        pthread_mutex_lock(&self->send_lock);
        s_flush_locked(self, false);
        pthread_mutex_unlock(&self->send_lock);
    }
}

void ll_stream_flush_whole(ll_stream_t *self)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->send_lock);
    s_flush_locked(self, false);
    pthread_mutex_unlock(&self->send_lock);
}

void ll_stream_flush(ll_stream_t *self)
{
    ll_stream_flush_then(self, NULL, NULL);
}

void ll_stream_flush_then(ll_stream_t *self, void (*fn)(void *arg), void *arg)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->send_lock);
    s_flush_locked(self, true);
    if (fn)
        fn(arg);
    pthread_mutex_unlock(&self->send_lock);
}

/* ---- self-test ----------------------------------------------------------- */

typedef struct {
    pthread_mutex_t lock;
    int chunks;
    char names[64][LL_STREAM_NAME_MAX];
    char text[1 << 16];
    size_t len;
    size_t total;
} s_record_t;

static void s_record_emit(void *ctx, const char *name, const char *text, size_t len)
{
    s_record_t *r = ctx;
    pthread_mutex_lock(&r->lock);
    if (r->chunks < 64)
        snprintf(r->names[r->chunks], LL_STREAM_NAME_MAX, "%s", name);
    r->chunks++;
    if (r->len + len < sizeof r->text) {
        memcpy(r->text + r->len, text, len);
        r->len += len;
    }
    r->total += len;
    pthread_mutex_unlock(&r->lock);
}

static int s_record_chunks(s_record_t *r)
{
    pthread_mutex_lock(&r->lock);
    int n = r->chunks;
    pthread_mutex_unlock(&r->lock);
    return n;
}

static void s_marker(void *arg)
{
    s_record_emit(arg, "marker", "|", 1);
}

int ll_stream_selftest(bool verbose)
{
    static s_record_t r; /* large: keep it off the stack */
    ll_stream_t *st = NULL;
    char out[64];
    size_t used, n;

    /* UTF-8 cleaning. */
    n = ll_stream_utf8_clean("abc", 3, false, out, &used);
    S_REQUIRE(n == 3 && used == 3 && memcmp(out, "abc", 3) == 0, out_fail);
    n = ll_stream_utf8_clean("a\xC3\xA9z", 4, false, out, &used); /* é */
    S_REQUIRE(n == 4 && used == 4, out_fail);
    n = ll_stream_utf8_clean("a\xE2\x82", 3, false, out, &used); /* € cut after 2 bytes */
    S_REQUIRE(n == 1 && used == 1, out_fail);
    n = ll_stream_utf8_clean("a\xE2\x82", 3, true, out, &used);
    S_REQUIRE(used == 3 && n == 7 && memcmp(out + 1, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0, out_fail);
    n = ll_stream_utf8_clean("\xFF"
                             "b",
                             2, false, out, &used);
    S_REQUIRE(n == 4 && used == 2 &&
                  memcmp(out,
                         "\xEF\xBF\xBD"
                         "b",
                         4) == 0,
              out_fail);
    n = ll_stream_utf8_clean("\xED\xA0\x80", 3, false, out, &used); /* surrogate */
    S_REQUIRE(n == 9 && used == 3, out_fail);
    n = ll_stream_utf8_clean("x\0y", 3, false, out, &used); /* NUL kept */
    S_REQUIRE(n == 3 && out[1] == '\0', out_fail);

    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.lock, NULL);
    st = ll_stream_new(s_record_emit, &r, 20, 1024);
    S_REQUIRE(st, out_fail);

    /* Many small writes become one chunk on flush. */
    for (int i = 0; i < 100; i++)
        ll_stream_write(st, "stdout", "x\n", 2);
    ll_stream_flush(st);
    S_REQUIRE(r.chunks == 1 && r.len == 200 && strcmp(r.names[0], "stdout") == 0, out_fail);

    /* Switching streams keeps the order: out, err, out. */
    ll_stream_write(st, "stdout", "a", 1);
    ll_stream_write(st, "stderr", "b", 1);
    ll_stream_write(st, "stdout", "c", 1);
    ll_stream_flush_then(st, s_marker, &r);
    S_REQUIRE(r.chunks == 5, out_fail);
    S_REQUIRE(strcmp(r.names[1], "stdout") == 0 && strcmp(r.names[2], "stderr") == 0 &&
                  strcmp(r.names[3], "stdout") == 0 && strcmp(r.names[4], "marker") == 0,
              out_fail);
    S_REQUIRE(memcmp(r.text + 200, "abc|", 4) == 0, out_fail);

    /* The timer flushes without anyone calling flush (poll, no fixed sleep). */
    ll_stream_write(st, "stdout", "tick", 4);
    for (int i = 0; i < 2000 && s_record_chunks(&r) < 6; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    S_REQUIRE(s_record_chunks(&r) == 6, out_fail);

    /* A multi-byte character split across writes is not split across chunks:
     * the timer sends "ab" and holds the cut euro sign back until its last
     * byte comes, however long that takes. */
    ll_stream_t *slow = ll_stream_new(s_record_emit, &r, 200, 1024);
    S_REQUIRE(slow, out_fail);
    ll_stream_write(slow, "stdout", "ab\xE2\x82", 4);
    for (int i = 0; i < 5000 && s_record_chunks(&r) < 7; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    /* Three intervals with no write: still held (a timer never sends it). */
    nanosleep(&(struct timespec){0, 600000000}, NULL);
    S_REQUIRE(s_record_chunks(&r) == 7, out_fail);
    /* A program's flush() (a Python print(..., flush=True) at the end of a
     * cell while fd output is still being drained) does not send it either. */
    ll_stream_flush_whole(slow);
    S_REQUIRE(s_record_chunks(&r) == 7, out_fail);
    ll_stream_write(slow, "stdout", "\xAC", 1);
    ll_stream_flush(slow);
    ll_stream_destroy(&slow);
    pthread_mutex_lock(&r.lock);
    bool split_ok = r.chunks == 8 && memcmp(r.text + r.len - 5, "ab\xE2\x82\xAC", 5) == 0;
    pthread_mutex_unlock(&r.lock);
    S_REQUIRE(split_ok, out_fail);

    /* Large output: past the threshold the flusher sends without waiting;
     * nothing is lost. */
    size_t before = r.total;
    char line[100];
    memset(line, 'y', sizeof line);
    for (int i = 0; i < 5000; i++)
        ll_stream_write(st, "stdout", line, sizeof line);
    ll_stream_flush(st);
    S_REQUIRE(r.total - before == 5000 * sizeof line, out_fail);

    ll_stream_destroy(&st);
    S_REQUIRE(st == NULL, out_fail);
    ll_stream_destroy(&st); /* safe twice */
    if (verbose)
        printf("(%d chunks) ", r.chunks);
    pthread_mutex_destroy(&r.lock);
    return 0;
out_fail:
    ll_stream_destroy(&st);
    return -1;
}

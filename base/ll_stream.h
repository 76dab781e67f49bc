/* ll_stream: the stdout/stderr coalescer of the kernel process.
 *
 * Python's sys.stdout/sys.stderr and the fd-capture reader hand text to
 * ll_stream_write; the text is buffered and handed to EMIT as one chunk per
 * stream name, at most INTERVAL_MS after the first buffered byte, at once
 * when the buffer grows past a threshold (by a flusher thread, so the writer
 * keeps running), or when someone calls ll_stream_flush.  One message per
 * ~50 ms instead of one per print() is what makes printing a million lines
 * cheap (ipykernel flushes every 200 ms).
 *
 * Order: writes of a different stream name flush what is buffered first, so
 * stdout/stderr interleaving is kept.  EMIT is always called with the
 * coalescer's send lock held, and ll_stream_flush_then runs a caller function
 * under the same lock right after flushing: that is how every other iopub
 * message is kept in order with the stream text (the lock also serializes
 * all use of the iopub socket).
 *
 * Text handed to EMIT is valid UTF-8: an incomplete multi-byte sequence at
 * the end of the buffer (a pipe read can split one) is held back until the
 * next write, however long that takes, unless the flush is final (a caller's
 * ll_stream_flush, or text of the other stream coming); invalid bytes become
 * U+FFFD.
 *
 * Threads: write/flush from any thread; one internal flusher thread. */
#ifndef LL_STREAM_H
#define LL_STREAM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ll_stream_t ll_stream_t;

/* Called with the send lock held; TEXT is valid UTF-8 of LEN bytes (not
 * NUL-terminated, may contain NUL). */
typedef void(ll_stream_emit_fn)(void *ctx, const char *name, const char *text, size_t len);

/* INTERVAL_MS: longest a byte waits (0: default 50).  THRESHOLD: buffered
 * bytes that wake the flusher at once (0: default 256 KiB).  The caller owns
 * the result (ll_stream_destroy); CTX is borrowed.  Returns NULL if the
 * flusher thread cannot start. */
ll_stream_t *ll_stream_new(ll_stream_emit_fn *emit, void *ctx, int interval_ms, size_t threshold);

/* Flush what is buffered, stop the flusher, free.  Nulls *SELF_P; safe on NULL. */
void ll_stream_destroy(ll_stream_t **self_p);

/* Append LEN bytes of NAME ("stdout"/"stderr"; other names are accepted and
 * kept apart).  Never blocks on the network unless the buffer is far beyond
 * the threshold (backpressure). */
void ll_stream_write(ll_stream_t *self, const char *name, const char *data, size_t len);

/* Emit everything buffered now (incomplete UTF-8 tails included, as U+FFFD). */
void ll_stream_flush(ll_stream_t *self);

/* Send what is buffered now, except an incomplete UTF-8 character at its
 * end, which waits for its last bytes (fd output a pipe read cut in two):
 * what a program's flush() means.  Text a program writes itself is whole
 * characters, so only captured fd output can be held; the final flush
 * after the fds are drained (ll_stream_flush, ll_stream_flush_then) sends
 * the rest. */
void ll_stream_flush_whole(ll_stream_t *self);

/* Flush, then call FN(ARG) under the send lock. */
void ll_stream_flush_then(ll_stream_t *self, void (*fn)(void *arg), void *arg);

/* Copy SRC to DST (capacity at least 3 * LEN) replacing invalid UTF-8 by
 * U+FFFD.  When FINAL is false an incomplete sequence at the end is not
 * copied.  Returns the bytes written; *CONSUMED gets the source bytes used. */
size_t ll_stream_utf8_clean(const char *src, size_t len, bool final, char *dst, size_t *consumed);

int ll_stream_selftest(bool verbose);

#endif

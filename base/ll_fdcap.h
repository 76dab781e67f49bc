/* ll_fdcap: capture of file descriptors 1 and 2 in the kernel process.
 *
 * Output that C extensions, os.system and `!cmd` shell commands write to the
 * process's fds never passes through Python's sys.stdout, so the kernel
 * points fds 1 and 2 at pipes and a reader thread turns what arrives into
 * stream text (through SINK, normally ll_stream_write).  Child processes
 * inherit the pipes, which is how their output is caught too.
 *
 * ll_fdcap_sync is the barrier the shell loop uses at the end of a request:
 * when it returns, every byte written to a captured fd before the call has
 * been handed to SINK (the reader and sync both read under one lock, and the
 * reader hands a chunk over before releasing it).
 *
 * Threads: new/destroy/sync from the main thread; one reader thread. */
#ifndef LL_FDCAP_H
#define LL_FDCAP_H

#include <stdbool.h>
#include <stddef.h>

#define LL_FDCAP_MAX 4

typedef struct ll_fdcap_t ll_fdcap_t;

/* Receives LEN bytes read from the fd captured under NAME. */
typedef void(ll_fdcap_sink_fn)(void *ctx, const char *name, const char *data, size_t len);

/* Capture the N (<= LL_FDCAP_MAX) descriptors FDS, reporting their bytes
 * under NAMES (static strings).  The caller owns the result (ll_fdcap_destroy).
 * Returns NULL with a reason in ERR if a pipe, dup or the thread fails
 * (nothing is left redirected then). */
ll_fdcap_t *ll_fdcap_new(const int *fds, const char *const *names, size_t n, ll_fdcap_sink_fn *sink,
                         void *ctx, char *err, size_t errlen);

/* Restore the original descriptors, hand over what is left in the pipes,
 * stop the reader.  Nulls *SELF_P; safe on NULL. */
void ll_fdcap_destroy(ll_fdcap_t **self_p);

/* A descriptor open on what captured fd number I pointed to before capture
 * (owned by SELF, valid until destroy), e.g. the terminal or log file behind
 * the original stderr.  -1 if I is out of range. */
int ll_fdcap_original(const ll_fdcap_t *self, size_t i);

/* Hand over everything written so far (see top).  C stdio buffers are the
 * caller's business (fflush(NULL) first). */
void ll_fdcap_sync(ll_fdcap_t *self);

int ll_fdcap_selftest(bool verbose);

#endif

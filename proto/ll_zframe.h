/* ll_zframe: the framing LooseLeaf's own processes speak on their unix
 * sockets (client <-> pool, pool <-> zygote, pool <-> worker, pool <->
 * broker, `looseleaf top` <-> broker): a 4-byte
 * big-endian length, then one compact JSON object.  A frame may carry one
 * file descriptor (SCM_RIGHTS) attached to its first byte.
 *
 * Blocking helpers (ll_zframe_send/recv) serve the zygote and the worker,
 * which are single-threaded and wait on one peer; the pool and the client use
 * a reader (ll_zreader_t) fed from a non-blocking fd in their poll loops.
 * Frames above LL_ZFRAME_MAX are refused (a bad peer, not a big cell). */
#ifndef LL_ZFRAME_H
#define LL_ZFRAME_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define LL_ZFRAME_MAX (256u << 20)

/* Send MSG (borrowed) as one frame; PASSFD >= 0 travels with it.  Retries on
 * EINTR; on a non-blocking FD whose peer is slow it waits (poll) for room
 * until the whole frame went, however long that takes: for a peer this
 * process cannot go on without (the pool's zygotes and workers).  Never for
 * a peer that may stop reading on purpose (the broker queues instead).
 * Returns 0, or -1 with errno. */
int ll_zframe_send(int fd, const json_t *msg, int passfd);

/* As ll_zframe_send, but gives up after TIMEOUT_MS (< 0: never) of waiting
 * for room: -1 with ETIMEDOUT.  Part of the frame may have gone then, so the
 * stream is broken: the caller closes FD. */
int ll_zframe_send_within(int fd, const json_t *msg, int passfd, int timeout_ms);

/* MSG as frame bytes (length + JSON), malloc'd, length in *LEN; NULL on
 * failure. */
char *ll_zframe_encode(const json_t *msg, size_t *len);

/* Receive one frame, blocking.  Returns a new reference, or NULL with errno
 * (0 = orderly EOF, EPROTO = bad frame, EINTR only if NOINTR is false).
 * A passed descriptor lands in *PASSFD (else -1); PASSFD may be NULL (a
 * passed fd is then closed). */
json_t *ll_zframe_recv(int fd, int *passfd, bool nointr);

typedef struct ll_zreader_t ll_zreader_t;

/* A reader of frames from FD (not owned), of at most LL_ZFRAME_MAX bytes. */
ll_zreader_t *ll_zreader_new(int fd);

/* A reader of frames of at most MAX bytes (1..LL_ZFRAME_MAX): a longer one
 * is bad (ll_zreader_pop), and the reader buffers at most one frame's worth
 * (MAX + 4 bytes), so a peer that sends faster than its frames are popped
 * costs no more memory (it waits in its socket). */
ll_zreader_t *ll_zreader_new_max(int fd, size_t max);
void ll_zreader_destroy(ll_zreader_t **self_p);

/* Read what FD has now (non-blocking fd), up to the reader's bound (the
 * rest is read once frames were popped: poll FD again).  Returns 1 if bytes
 * came, 0 if none (EAGAIN, or the buffer is full), -1 on EOF or error
 * (errno 0 = EOF). */
int ll_zreader_fill(ll_zreader_t *self);

/* Next complete frame (new reference) or NULL.  *BAD set on a malformed
 * frame (the peer should be dropped). */
json_t *ll_zreader_pop(ll_zreader_t *self, bool *bad);

/* This process's binary, to exec again (the pool from a kernel, zygotes from
 * the pool): EXEC_PATH is /proc/self/exe, the very inode that runs, even
 * after a rebuild replaced or removed the file on disk; ARGV0 is its path
 * (without readlink's " (deleted)" suffix), for argv[0].  Returns 0, or -1
 * with errno. */
int ll_zframe_self_exe(char *exec_path, size_t plen, char *argv0, size_t alen);

#endif

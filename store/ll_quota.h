/* ll_quota: a user's cap on checkpoint-store memory, counted across every
 * payload pool of that user on the host, so users sharing a host cannot
 * starve each other.  Each kernel has its own store and pool, so the cap
 * cannot be a pool size: the user's pools count the regions they hold in one
 * small shared file per user, the ledger, and an allocation that would take
 * the user past the cap fails.  Used by ll_pool (counting) and ll_store (the
 * error) in every process of the user's sessions, and by the host pool, which
 * writes the cap the slot broker gives it (hostd/API.md).  Thread-safe: every
 * word is atomic. */
#ifndef LL_QUOTA_H
#define LL_QUOTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LL_QUOTA_MAX_POOLS 256 /* pools counted at once (live sessions of one user) */

typedef struct ll_quota_t ll_quota_t;

/* Where a cap came from (it names the knob in the error). */
typedef enum {
    LL_QUOTA_SRC_NONE = 0,
    LL_QUOTA_SRC_HOSTD = 1, /* `looseleaf hostd --store-cap`, told by the broker */
    LL_QUOTA_SRC_ENV = 2,   /* LL_STORE_USER_CAP in a store's environment */
} ll_quota_src_t;

/* What an allocation over the cap met (ll_quota_take). */
typedef struct {
    uint64_t cap;  /* bytes the user may hold */
    uint64_t held; /* bytes the user's pools held before the allocation */
    int src;       /* ll_quota_src_t */
} ll_quota_over_t;

/* The ledger of this user: PATH, else $LL_STORE_LEDGER, else
 * /dev/shm/looseleaf-<uid>-quota (made 0600 when absent).  A file that is
 * not a regular file of this uid with no group or other access is refused
 * (another user may not feed us counts).  "off": no ledger (NULL, ERR
 * empty).  Returns a handle the caller destroys, or NULL with a reason. */
ll_quota_t *ll_quota_open(const char *path, char *err, size_t errlen);

/* Close the handle (a pool's count stops with the last process of it that
 * holds the ledger open); nulls *Q_P; safe on NULL. */
void ll_quota_destroy(ll_quota_t **q_p);

/* Count for pool POOL_ID from now on: joins the pool's entry (made when
 * none lives, or when its processes all died, with USED regions: what the
 * pool holds now).  An entry lives while a process holds it (an OFD lock:
 * it goes when the process does, however it ends) and, for a pool with a
 * file name PATH (NULL: none), while that file exists.  0, or -1 when the
 * ledger is full (then nothing is counted for this handle). */
int ll_quota_join(ll_quota_t *q, uint64_t pool_id, size_t used, const char *path);

/* N more regions for the joined pool: 0, or -1 when the user's pools would
 * then hold more than the cap (nothing taken; OVER says what was met).
 * Exact across processes: the count goes up first, then the total is
 * checked (two racing takes may both fail, never both pass the cap). */
int ll_quota_take(ll_quota_t *q, size_t n, ll_quota_over_t *over);

/* As ll_quota_take, for memory held ahead of use (a pool's reserve): it
 * may take the user's pools only to the cap less a quarter of it, so the
 * reserves of a user's many kernels never leave a save without room.
 * 0 or -1. */
#define LL_QUOTA_SPARE_FRAC 4
int ll_quota_take_spare(ll_quota_t *q, size_t n);

/* A save met the cap and waits for NEED more bytes: pools holding memory
 * ahead of use (reserves, freed space kept for the next save) give it back
 * for a while (ll_quota_pressed, the stores' idle hooks), and the sessions'
 * kept old versions give way to it (ll_quota_excess).  The waiting save
 * calls ll_quota_unpress with the same NEED once it is done. */
void ll_quota_press(ll_quota_t *q, uint64_t need);
void ll_quota_unpress(ll_quota_t *q, uint64_t need);
/* While a save that met the cap within WITHIN_MS waits: by how many bytes
 * the user's pools exceed what would let it through (what an idle owner
 * may still free for it); else 0. */
uint64_t ll_quota_excess(ll_quota_t *q, uint64_t within_ms);
/* When (an opaque nonzero stamp) a save last met the cap, if within
 * WITHIN_MS; else 0. */
uint64_t ll_quota_pressed(ll_quota_t *q, uint64_t within_ms);

/* N regions of the joined pool given back. */
void ll_quota_give(ll_quota_t *q, size_t n);

/* Bytes every live pool of the user holds. */
uint64_t ll_quota_held(ll_quota_t *q);

/* The cap (0: none) and where it came from. */
uint64_t ll_quota_cap(ll_quota_t *q, int *src);
void ll_quota_set_cap(ll_quota_t *q, uint64_t bytes, int src);

/* "256 MiB", "1.5 GiB", "512 KiB", "100 bytes" into BUF. */
const char *ll_quota_fmt_bytes(uint64_t n, char *buf, size_t len);

int ll_quota_selftest(bool verbose);

#endif

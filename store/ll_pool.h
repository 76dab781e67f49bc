/* ll_pool: the payload pool, a shared-memory file cut into 2 MiB regions.
 *
 * Every process of a session (kernel, workers, tests) opens the same pool
 * file and allocates, leases and reclaims regions through atomic words in
 * the file's header, so no lock is held across processes and a process
 * killed at any instant leaves nothing that a later reclamation cannot undo.
 * Which regions committed versions use is not known here: that is Redis's
 * business (ll_store); ll_pool_gc asks the caller.  Thread-safe: a mutex
 * guards this process's lease counts. */
#ifndef LL_POOL_H
#define LL_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/ll_quota.h"

#define LL_POOL_REGION_BYTES ((size_t) 2 << 20)
#define LL_POOL_MAX_PROCS    64 /* processes that may hold leases at once */

typedef struct ll_pool_t ll_pool_t;
typedef struct ll_pool_map_t ll_pool_map_t;

/* One region of a payload: its index in the pool and the generation it had
 * when the payload was written (a reused index has a higher generation). */
typedef struct {
    uint32_t idx;
    uint64_t gen;
    uint64_t hash; /* XXH3-64 of the region's payload bytes */
} ll_pool_region_t;

/* Error kinds, also used by ll_store. */
typedef enum {
    LL_POOL_OK = 0,
    LL_POOL_EIO = 1,   /* system call failed, bad file, ... */
    LL_POOL_EFULL = 2, /* no free region or no memory to back one */
    LL_POOL_EGONE = 3, /* a region was reclaimed (or reused) since */
    LL_POOL_EINVAL = 4,
    LL_POOL_EQUOTA = 5, /* the user's pools would hold more than the cap (ll_quota) */
} ll_pool_errkind_t;

/* Open the pool file PATH, creating it (0600) with room for POOL_BYTES when
 * it does not exist; an existing pool keeps its size.  PATH "memfd:hugetlb",
 * "memfd:thp" or "memfd:4k" creates a nameless pool that other processes
 * open through ll_pool_share_path.  Returns a handle the caller destroys
 * (ll_pool_destroy), or NULL with a reason in ERR. */
ll_pool_t *ll_pool_open(const char *path, size_t pool_bytes, char *err, size_t errlen);

/* Drop this handle; the pool lives on while a mapping made from it lives. */
void ll_pool_destroy(ll_pool_t **pool_p);

/* Remove the pool's file name (its memory goes once every process let go). */
int ll_pool_unlink(ll_pool_t *pool);

/* Remove the pool's file name now and share it as a memfd is shared
 * (/proc/<pid>/fd/<n>, ll_pool_share_path), so that its memory goes with the
 * last process that holds it, the creator among them, whatever kills them:
 * nothing is left in /dev/shm.  0, or -1 with errno. */
int ll_pool_make_nameless(ll_pool_t *pool);

/* Count this pool's regions in the user's ledger Q (ll_quota; NULL: none)
 * from now on: allocations fail with LL_POOL_EQUOTA past the user's cap.
 * Q stays the caller's and must outlive this handle's allocations. */
void ll_pool_set_quota(ll_pool_t *pool, ll_quota_t *q);

/* Allocate one region for writing, leased by this process; *ADDR is where
 * to write it.  Prefers free regions this process already prefaulted.  The
 * region is not backed here: the caller must ll_pool_back it before
 * writing, which several threads may do at once for distinct regions, so
 * backing (page faults at ~9 GB/s with 4 KiB pages) overlaps the copy
 * instead of preceding it.  Calls on one handle must not overlap (ll_store
 * serializes them).  Returns 0, or -1 with LL_POOL_EFULL (or LL_POOL_EQUOTA)
 * in *KIND and a reason in ERR. */
int ll_pool_alloc_unbacked(ll_pool_t *pool, ll_pool_region_t *reg, void **addr, int *kind,
                           char *err, size_t errlen);

/* Back and prefault region IDX in this process (no-op when done before);
 * safe on several threads for distinct regions.  0, or an errno (ENOSPC,
 * ENOMEM...: the region must not be written). */
int ll_pool_back(ll_pool_t *pool, uint32_t idx);

/* Return a region this process allocated and has not written or committed
 * to FREE (its lease stays until ll_pool_unlease). */
void ll_pool_free_unwritten(ll_pool_t *pool, const ll_pool_region_t *reg);

/* Back and prefault up to NREGIONS free regions in this process ahead of
 * use (at idle time), so a later save copies at memcpy speed.  Same rule
 * as ll_pool_alloc_unbacked: calls on one handle must not overlap.  Returns how many
 * were prefaulted (fewer when memory or free regions run out). */
size_t ll_pool_prefault(ll_pool_t *pool, size_t nregions);

/* Keep NREGIONS free regions backed and prefaulted in this process: a
 * thread of this process (started on first use) refills the reserve
 * whenever fewer are ready and the store is idle (no call for 100 ms, no
 * save in progress), so a save after idle time copies at memcpy speed.  Reserved regions stay FREE (any
 * process may allocate them; a full pool is still an error, never SIGBUS);
 * it stops at memory exhaustion silently.  0 stops refilling (what is
 * prefaulted stays).  Stopped by ll_pool_destroy.  0, or -1 when no thread
 * could be started (or in a fork child). */
int ll_pool_reserve(ll_pool_t *pool, size_t nregions);

/* HOLD true: a save is about to copy, the reserve must not compete for the
 * CPU (nests); false: done, refill once the store is idle. */
void ll_pool_reserve_hold(ll_pool_t *pool, bool hold);

/* The store is in use (a restore, a commit...): the reserve waits until it
 * has been quiet for a moment (100 ms) before it refills. */
void ll_pool_reserve_busy(ll_pool_t *pool);

/* Lease a region (keeps it from reclamation); fails with LL_POOL_EGONE when
 * it no longer holds generation REG->gen.  Returns 0 or -1. */
int ll_pool_lease(ll_pool_t *pool, const ll_pool_region_t *reg);
void ll_pool_unlease(ll_pool_t *pool, uint32_t idx);

/* Bump the commit epoch: call after a commit became visible and before its
 * writer's leases are released (see the reclamation protocol in ll_pool.c). */
void ll_pool_commit_done(ll_pool_t *pool);

/* Whether a commit landed or a lease was dropped since the last complete
 * reclamation (by any process): something may have become garbage. */
bool ll_pool_gc_due(ll_pool_t *pool);

/* Free regions whose memory is backed (reusable without growing the pool). */
size_t ll_pool_free_backed(ll_pool_t *pool);

/* Give back the memory of backed free regions beyond the lowest KEEP free
 * ones (top down; at least what the owner set with ll_pool_set_keep stays),
 * uncounting them in the user's ledger.  Returns how many were given back. */
size_t ll_pool_trim(ll_pool_t *pool, size_t keep);

/* The session's owner keeps NREGIONS free regions (its reserve): a trim by
 * any process (a worker reclaiming after its save) leaves them. */
void ll_pool_set_keep(ll_pool_t *pool, size_t nregions);

/* A commit of the session wrote BYTES: remember the most (shared by every
 * process of the pool; the reserve follows it). */
void ll_pool_note_save(ll_pool_t *pool, size_t bytes);
size_t ll_pool_save_bytes(ll_pool_t *pool);

/* Call FN(CTX) from this process's reserve thread (started if need be)
 * whenever the store has been idle a moment and the pool changed since the
 * last call (a commit, a dropped lease, a bigger save), and once at start.
 * FN runs without the reserve's lock and returns 0, or -1 to be called
 * again at the next chance (busy).  NULL stops it; it returns once a call
 * in progress ended. */
void ll_pool_set_idle(ll_pool_t *pool, int (*fn)(void *ctx), void *ctx);

/* Reclaim regions that no live process leases and that REFERENCED (called
 * once, after the candidates were chosen) does not mark: it fills MARK[idx]
 * with the generation a committed version uses, 0 for none.  Returns the
 * number freed, or -1 with a reason. */
typedef int (*ll_pool_refs_fn)(void *ctx, uint64_t *mark, size_t nregions);
int ll_pool_gc(ll_pool_t *pool, ll_pool_refs_fn referenced, void *ctx, char *err, size_t errlen);

/* Map NREG leased-or-leasable regions at consecutive addresses, NBYTES long,
 * read-only (or private copy-on-write when WRITABLE).  Leases them for the
 * mapping's life.  Returns a mapping the caller unmaps (ll_pool_unmap; it
 * keeps the pool's memory alive, so it may outlive POOL's handle), or NULL
 * with *KIND EGONE/EIO/EINVAL and a reason. */
ll_pool_map_t *ll_pool_map(ll_pool_t *pool, const ll_pool_region_t *regs, size_t nreg,
                           size_t nbytes, bool writable, int *kind, char *err, size_t errlen);
void *ll_pool_map_addr(ll_pool_map_t *map);
size_t ll_pool_map_len(ll_pool_map_t *map);
/* Unmap and release the leases; nulls *MAP_P; safe on NULL. */
void ll_pool_unmap(ll_pool_map_t **map_p);

typedef struct {
    const char *page_kind; /* "hugetlb", "thp" or "4k" */
    const char *path;
    size_t pool_bytes;
    size_t regions_total;
    size_t regions_used;       /* allocated, committed or not yet reclaimed */
    size_t regions_backed;     /* holding memory (counted in the user's ledger) */
    size_t regions_leased;     /* by this process */
    size_t regions_prefaulted; /* backed and prefaulted in this process */
    size_t reserve_target;     /* free prefaulted regions the reserve keeps */
    size_t reserve_ready;      /* free prefaulted regions now */
} ll_pool_stats_t;
void ll_pool_stats(ll_pool_t *pool, ll_pool_stats_t *out);

/* Of the regions this process prefaulted: how many are free, and how many
 * are allocated but unleased (reclaimable unless a commit uses them). */
void ll_pool_warm_counts(ll_pool_t *pool, size_t *free_warm, size_t *idle_warm);

/* "hugetlb", "thp" or "4k" (the handle's string, like ll_pool_share_path's:
 * valid while the handle lives). */
const char *ll_pool_page_kind(ll_pool_t *pool);

/* The commit epoch (moves with every commit of any process). */
uint64_t ll_pool_epoch(ll_pool_t *pool);

/* Number of regions (the pool's size limit in regions). */
size_t ll_pool_nregions(ll_pool_t *pool);

/* The pool's random identity (refs carry it, so a ref never resolves in a
 * pool recreated under the same name). */
uint64_t ll_pool_id(ll_pool_t *pool);

/* A path another process can open the same pool by: the file, or for a
 * memfd pool /proc/<pid>/fd/<n> (valid while this process lives). */
const char *ll_pool_share_path(ll_pool_t *pool);

#endif

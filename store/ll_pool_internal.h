/* ll_pool_internal: what the files of the payload pool share and nobody
 * else should see: the shared header's layout, the handle, and the calls
 * between ll_pool_pages.c (a region's memory: back, prefault, punch),
 * ll_pool_reserve.c (the reserve thread that keeps free regions
 * prefaulted), ll_pool.c (the pool: open, allocate, lease, map) and
 * ll_pool_reclaim.c (reclamation), each using only those before it.
 * See ll_pool.c's DESIGN for what the words mean and which rules keep them
 * consistent across processes. */
#ifndef LL_POOL_INTERNAL_H
#define LL_POOL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "store/ll_pool.h"

/* A region's state word: generation << 3 | backed << 2 | one of these.
 * BACKED: the region's memory is counted in the user's ledger (it is
 * backed, or about to be); only a trim clears it (ll_pool_reclaim.c). */
#define LL_POOL_ST_FREE      0u
#define LL_POOL_ST_ALLOC     1u
#define LL_POOL_ST_FREEING   2u
#define LL_POOL_ST_TRIM      3u /* FREE, its memory being given back */
#define LL_POOL_BACKED       4u
#define LL_POOL_ST(s)        ((unsigned) ((s) % 4u))
#define LL_POOL_GEN(s)       ((s) >> 3)
#define LL_POOL_IS_BACKED(s) ((s) / LL_POOL_BACKED % 2u != 0)
#define LL_POOL_MK(gen, backed, st) \
    ((uint64_t) (gen) << 3 | ((backed) ? LL_POOL_BACKED : 0u) | (uint64_t) (st))

/* The shared header at offset 0 of the pool file. */
typedef struct {
    char magic[8];         /* "LLPOOL03" once initialised (written last) */
    uint32_t region_bytes; /* LL_POOL_REGION_BYTES */
    uint32_t reserved;
    uint64_t nregions;            /* regions in the data area */
    uint64_t data_offset;         /* file offset of region 0 (region aligned) */
    char page_kind[16];           /* as chosen by the creator */
    uint64_t id;                  /* random, never 0: refs name the pool they point into */
    _Atomic uint64_t epoch;       /* bumped after every commit (see DESIGN) */
    _Atomic uint64_t released;    /* bumped whenever a process drops its last lease on a region */
    _Atomic uint64_t gc_epoch;    /* epoch and released as the last complete reclamation */
    _Atomic uint64_t gc_released; /* read them, before choosing its candidates */
    _Atomic uint64_t save_bytes;  /* most bytes one commit of the session wrote (the reserve) */
    _Atomic uint64_t keep;        /* free regions the session's owner keeps (its reserve): no
                                   * process's trim goes below it */
    _Atomic uint64_t allocs;      /* bumped at every allocation */
    _Atomic uint64_t gc_allocs;   /* allocs as the last complete reclamation read it */
    _Atomic uint64_t pending;     /* regions allocated, leased and not committed at the last
                                   * complete reclamation: versions read or written now, space
                                   * that comes back as they end (the reserve waits for it) */
    _Atomic uint64_t slots[LL_POOL_MAX_PROCS]; /* owner of each lease bit */
    /* followed by state[nregions], lease[nregions], trims[nregions] */
} ll_pool_hdr_t;

struct ll_pool_t {
    int fd;                      /* pool file */
    char *path;                  /* its name ("memfd:..." for a nameless one) */
    bool nameless;               /* a memfd, or a file unlinked by its owner: nothing to
                                 * unlink, reached as /proc/<pid>/fd/<n> */
    char *base;                  /* shared RW mapping of the whole file */
    size_t file_len;             /* length of that mapping */
    ll_pool_hdr_t *hdr;          /* == base */
    char *data;                  /* base + data_offset */
    size_t nregions;             /* copy of hdr->nregions */
    _Atomic uint64_t *state;     /* per-region state words */
    _Atomic uint64_t *lease;     /* per-region lease bitmaps */
    _Atomic uint64_t *trims;     /* per-region count of trims (memory given back) */
    ll_quota_t *quota;           /* the user's ledger (the store's), NULL: not counted */
    int slot;                    /* my slot, -1 once released */
    uint64_t me;                 /* my slot word */
    pid_t pid;                   /* process that opened this handle */
    uint32_t *counts;            /* my leases per region (process local) */
    _Atomic uint64_t *populated; /* trims[i] + 1 when I backed and prefaulted region i (valid
                                  * while no trim came since), 0 never */
    uint32_t *warm;              /* the populated regions, in the order they were */
    _Atomic size_t nwarm;        /* entries in warm (an entry is written before it counts) */
    size_t warm_cursor;          /* where the next warm search starts */
    pthread_mutex_t mu;          /* guards counts, my lease bits, populated/warm */
    _Atomic int refs;            /* this handle plus live mappings */
    char page_kind[16];          /* "hugetlb", "thp", "4k" */
    char share_path[64];         /* how other processes open a memfd pool */
    bool thp_advise;             /* madvise(MADV_HUGEPAGE), populate instead of fallocate */
    /* The reserve (see ll_pool_reserve): a thread of this process keeps
     * rtarget free regions prefaulted.  rmu guards the fields below. */
    pthread_mutex_t rmu;
    pthread_cond_t rcond;
    pthread_t rthread;
    bool rstarted;            /* rthread runs (in process pid) */
    bool rstop;               /* asked to end */
    bool rblocked;            /* backing failed or no free region left: wait for a kick */
    int rhold;                /* saves in progress: do not compete with their copy */
    size_t rtarget;           /* free prefaulted regions to keep */
    _Atomic uint64_t ractive; /* ms (monotonic) of the store's last call */
    /* The idle hook (ll_pool_set_idle): called by the reserve thread, without
     * rmu, once the store is idle and the pool changed since its last call. */
    int (*idle_fn)(void *ctx);
    void *idle_ctx;
    bool icalling;       /* idle_fn runs now (ll_pool_set_idle waits for it) */
    uint64_t iseen[4];   /* epoch, released, save_bytes, cap pressure at the last idle call */
    uint64_t rallocs;    /* hdr->allocs as the reserve thread last saw it... */
    uint64_t rallocs_ms; /* ...and since when (ms, monotonic) */
};

/* Whether this process's prefault of region I is still valid (no trim gave
 * its memory back since). */
bool ll_pool_populated(ll_pool_t *pool, uint32_t i);

/* Back region I with memory and prefault it in this process's mapping
 * (neither changes its bytes, so it is safe on a region someone else is
 * writing), populating STEP bytes per call (each call holds the process's
 * mmap lock for reading), and count it prefaulted.  A FREE region not yet
 * counted is counted in the user's ledger first (EDQUOT past the cap); a
 * region being trimmed is left alone (EAGAIN).  0 or an errno. */
int ll_pool_touch(ll_pool_t *pool, uint32_t i, size_t step);

/* The reserve's part of a handle's life (ll_pool_reserve.c): init at open
 * (before the handle is shared), stop (joins the thread; no-op in a fork
 * child) before the last unref, fini when the handle's memory goes. */
void ll_pool_reserve_init(ll_pool_t *pool);
void ll_pool_reserve_stop(ll_pool_t *pool);
void ll_pool_reserve_fini(ll_pool_t *pool);

/* Take one lease count on IDX (the bit is set on the first). */
void ll_pool_lease_bit(ll_pool_t *pool, uint32_t idx);

/* Empty the slots of dead processes: their lease bits go, then the slot. */
void ll_pool_clean_dead_slots(ll_pool_t *pool);

/* Give region I's memory back to the system: punch it out of the pool
 * file (every process's mapping of it goes with it) and move the region's
 * trim count on, so that a prefault any process made of it no longer
 * counts.  The caller holds the region (ALLOC of its own, or TRIM).  0, or
 * -1 with errno. */
int ll_pool_punch(ll_pool_t *pool, uint32_t i);

/* Free regions this process has prefaulted (what the next save finds warm). */
size_t ll_pool_free_warm(ll_pool_t *pool);

#endif

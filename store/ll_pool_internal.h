/* ll_pool_internal: what the files of the payload pool share and nobody
 * else should see: the shared header's layout, the handle, and the calls
 * between ll_pool.c (the pool: open, allocate, lease, reclaim, map) and
 * ll_pool_reserve.c (the reserve thread that keeps free regions prefaulted).
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

/* A region's state word: generation << 2 | one of these. */
#define LL_POOL_ST_FREE    0u
#define LL_POOL_ST_ALLOC   1u
#define LL_POOL_ST_FREEING 2u

/* The shared header at offset 0 of the pool file. */
typedef struct {
    char magic[8];         /* "LLPOOL02" once initialised (written last) */
    uint32_t region_bytes; /* LL_POOL_REGION_BYTES */
    uint32_t reserved;
    uint64_t nregions;       /* regions in the data area */
    uint64_t data_offset;    /* file offset of region 0 (region aligned) */
    char page_kind[16];      /* as chosen by the creator */
    uint64_t id;             /* random, never 0: refs name the pool they point into */
    _Atomic uint64_t epoch;  /* bumped after every commit (see DESIGN) */
    _Atomic uint64_t cursor; /* next-fit start for allocation */
    _Atomic uint64_t slots[LL_POOL_MAX_PROCS]; /* owner of each lease bit */
    /* followed by state[nregions], lease[nregions] */
} ll_pool_hdr_t;

struct ll_pool_t {
    int fd;                     /* pool file */
    char *path;                 /* its name ("memfd:..." for a nameless one) */
    bool nameless;              /* a memfd, or a file unlinked by its owner: nothing to
                                 * unlink, reached as /proc/<pid>/fd/<n> */
    char *base;                 /* shared RW mapping of the whole file */
    size_t file_len;            /* length of that mapping */
    ll_pool_hdr_t *hdr;         /* == base */
    char *data;                 /* base + data_offset */
    size_t nregions;            /* copy of hdr->nregions */
    _Atomic uint64_t *state;    /* per-region state words */
    _Atomic uint64_t *lease;    /* per-region lease bitmaps */
    ll_quota_t *quota;          /* the user's ledger (the store's), NULL: not counted */
    int slot;                   /* my slot, -1 once released */
    uint64_t me;                /* my slot word */
    pid_t pid;                  /* process that opened this handle */
    uint32_t *counts;           /* my leases per region (process local) */
    _Atomic uint8_t *populated; /* region backed and prefaulted in my mapping */
    uint32_t *warm;             /* the populated regions, in the order they were */
    _Atomic size_t nwarm;       /* entries in warm (an entry is written before it counts) */
    size_t warm_cursor;         /* where the next warm search starts */
    pthread_mutex_t mu;         /* guards counts, my lease bits, populated/warm */
    _Atomic int refs;           /* this handle plus live mappings */
    char page_kind[16];         /* "hugetlb", "thp", "4k" */
    char share_path[64];        /* how other processes open a memfd pool */
    bool thp_advise;            /* madvise(MADV_HUGEPAGE), populate instead of fallocate */
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
};

/* Back region I with memory and prefault it in this process's mapping
 * (neither changes its bytes, so it is safe on a region someone else is
 * writing), populating STEP bytes per call (each call holds the process's
 * mmap lock for reading), and count it prefaulted.  0 or an errno. */
int ll_pool_touch(ll_pool_t *pool, uint32_t i, size_t step);

/* The reserve's part of a handle's life (ll_pool_reserve.c): init at open
 * (before the handle is shared), stop (joins the thread; no-op in a fork
 * child) before the last unref, fini when the handle's memory goes. */
void ll_pool_reserve_init(ll_pool_t *pool);
void ll_pool_reserve_stop(ll_pool_t *pool);
void ll_pool_reserve_fini(ll_pool_t *pool);

/* Free regions this process has prefaulted (what the next save finds warm). */
size_t ll_pool_free_warm(ll_pool_t *pool);

#endif

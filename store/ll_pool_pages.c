/* ll_pool_pages: a pool region's memory (see ll_pool.c's DESIGN, "Page
 * kinds"): backing a region (posix_fallocate, or MADV_POPULATE_WRITE with
 * shmem THP in "advise" mode) and prefaulting it in this process's mapping,
 * counted in the user's ledger first; whether this process's prefault is
 * still valid; punching a region's memory back out of the file.  Below
 * everything else of the pool: allocation and mapping (ll_pool.c), the
 * reserve thread (ll_pool_reserve.c) and reclamation (ll_pool_reclaim.c)
 * back and give back regions through these.  Runs on whatever thread
 * calls it (several copy threads back distinct regions at once). */
#include "store/ll_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_mman.h"
#include "store/ll_pool_internal.h"

/* Prefaulting (see ll_pool_internal.h for ll_pool_touch's contract). */
bool ll_pool_populated(ll_pool_t *pool, uint32_t i)
{
    uint64_t p = atomic_load(&pool->populated[i]);
    return p != 0 && p == atomic_load(&pool->trims[i]) + 1;
}

/* Count FREE region I in the user's ledger (mark it BACKED) before backing
 * it.  0 (counted now or before), EDQUOT past the cap, EAGAIN when it is
 * not FREE any more (allocated, being trimmed: leave it). */
static int s_count_free(ll_pool_t *pool, uint32_t i)
{
    for (;;) {
        uint64_t s = atomic_load(&pool->state[i]);
        if (LL_POOL_IS_BACKED(s))
            return LL_POOL_ST(s) == LL_POOL_ST_TRIM ? EAGAIN : 0;
        if (LL_POOL_ST(s) != LL_POOL_ST_FREE)
            return EAGAIN; /* (an ALLOC region is always counted) */
        if (ll_quota_take_spare(pool->quota, 1) != 0)
            return EDQUOT; /* (a prefault leaves part of the cap to saves) */
        if (atomic_compare_exchange_strong(&pool->state[i], &s, s | LL_POOL_BACKED))
            return 0;
        ll_quota_give(pool->quota, 1);
    }
}

int ll_pool_touch(ll_pool_t *pool, uint32_t i, size_t step)
{
    char *p = pool->data + (size_t) i * LL_POOL_REGION_BYTES;
    uint64_t trims = atomic_load(&pool->trims[i]);
    int rc = s_count_free(pool, i);
    if (rc != 0)
        return rc;
    if (!pool->thp_advise)
        rc = posix_fallocate(pool->fd,
                             (off_t) (pool->hdr->data_offset + (size_t) i * LL_POOL_REGION_BYTES),
                             (off_t) LL_POOL_REGION_BYTES);
    for (size_t off = 0; rc == 0 && off < LL_POOL_REGION_BYTES; off += step)
        if (madvise(p + off, step, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
            rc = errno;
    if (rc != 0)
        return rc;
    /* ll_pool_back runs this on several copy threads at once (distinct
     * regions): the warm list is shared bookkeeping.  A trim that came
     * meanwhile (only of a FREE region) may have given the memory back:
     * then this prefault does not count (the next user backs it again). */
    pthread_mutex_lock(&pool->mu);
    if (atomic_load(&pool->trims[i]) == trims) {
        if (atomic_load(&pool->populated[i]) == 0) {
            size_t k = atomic_load(&pool->nwarm);
            pool->warm[k] = i;
            atomic_store(&pool->nwarm, k + 1);
        }
        atomic_store(&pool->populated[i], trims + 1);
    }
    pthread_mutex_unlock(&pool->mu);
    return 0;
}

static int s_touch(ll_pool_t *pool, uint32_t i)
{
    return ll_pool_touch(pool, i, LL_POOL_REGION_BYTES);
}

int ll_pool_back(ll_pool_t *pool, uint32_t idx)
{
    if (idx >= pool->nregions)
        return EINVAL;
    return ll_pool_populated(pool, idx) ? 0 : s_touch(pool, idx);
}

int ll_pool_punch(ll_pool_t *pool, uint32_t i)
{
    atomic_fetch_add(&pool->trims[i], 1);
    off_t off = (off_t) (pool->hdr->data_offset + (size_t) i * LL_POOL_REGION_BYTES);
    return fallocate(pool->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
                     (off_t) LL_POOL_REGION_BYTES);
}

size_t ll_pool_prefault(ll_pool_t *pool, size_t nregions)
{
    size_t done = 0;
    for (size_t i = 0; i < pool->nregions && done < nregions; i++) {
        if (ll_pool_populated(pool, (uint32_t) i) ||
            LL_POOL_ST(atomic_load(&pool->state[i])) != LL_POOL_ST_FREE)
            continue;
        int rc = s_touch(pool, (uint32_t) i);
        if (rc == EAGAIN)
            continue;
        if (rc != 0)
            break; /* out of memory, or the user's cap: the allocation will say so */
        done++;
    }
    return done;
}

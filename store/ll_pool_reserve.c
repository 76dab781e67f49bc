/* ll_pool_reserve: the pool's reserve, a thread of each process that uses a
 * pool (ll_pool_reserve starts it) which keeps free regions backed and
 * prefaulted in this process ahead of saves (see ll_pool.h).  The thread
 * runs s_reserve_main; the other functions run on the store's callers'
 * threads.  rmu guards the reserve's fields of the handle (rtarget, rhold,
 * rblocked, rstop, rstarted); ractive is atomic (set on every store call).
 *
 * Its waits are timed on CLOCK_MONOTONIC (the condition is made so in
 * ll_pool_reserve_init), so a wall-clock step neither stalls nor spins it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_pool_internal.h"

#define S_RESERVE_IDLE_MS 100                  /* store quiet this long: refill the reserve */
#define S_RESERVE_STEP    ((size_t) 256 << 10) /* bytes populated per mmap-lock hold */

void ll_pool_reserve_init(ll_pool_t *pool)
{
    pthread_mutex_init(&pool->rmu, NULL);
    /* The reserve thread's timed waits count on the monotonic clock (a wall
     * clock set back would stall its refill, set forward spin it). */
    pthread_condattr_t cattr;
    pthread_condattr_init(&cattr);
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    pthread_cond_init(&pool->rcond, &cattr);
    pthread_condattr_destroy(&cattr);
}

void ll_pool_reserve_fini(ll_pool_t *pool)
{
    /* In a fork child the condition variable may count the parent's
     * reserve thread as a waiter that will never leave: glibc's destroy
     * would wait for it forever.  The child's copy just goes with the memory. */
    if (getpid() == pool->pid || pool->pid == 0) {
        pthread_mutex_destroy(&pool->rmu);
        pthread_cond_destroy(&pool->rcond);
    }
}

size_t ll_pool_free_warm(ll_pool_t *pool)
{
    size_t nwarm = atomic_load(&pool->nwarm), c = 0;
    for (size_t k = 0; k < nwarm; k++) {
        uint32_t i = pool->warm[k];
        c += LL_POOL_ST(atomic_load(&pool->state[i])) == LL_POOL_ST_FREE &&
             ll_pool_populated(pool, i);
    }
    return c;
}

#define S_FRESH_QUIET_MS 1000 /* no allocation this long: no save in flight (non-owners) */

/* Whether the reserve may take fresh memory now (rmu held): not while a
 * save may be in flight, since once it commits, what it superseded comes
 * back.  The owner (who reclaims when idle) knows: no allocation since its
 * last complete reclamation.  Others: no allocation for a second. */
static bool s_fresh_ok(ll_pool_t *pool)
{
    uint64_t allocs = atomic_load(&pool->hdr->allocs), now = (uint64_t) ll_clock_ms();
    if (pool->idle_fn)
        return allocs == atomic_load(&pool->hdr->gc_allocs);
    if (allocs != pool->rallocs) {
        pool->rallocs = allocs;
        pool->rallocs_ms = now;
    }
    return now - pool->rallocs_ms >= S_FRESH_QUIET_MS;
}

/* The next free region to prefault for the reserve, or UINT32_MAX when the
 * lowest WANT free regions are prefaulted in this process already.  The
 * lowest, because that is where any process's next allocation looks (after
 * its own prefaulted regions) and what trimming keeps: a worker saving into
 * the kernel's pool then finds regions whose pages the kernel's reserve
 * backed (on hugetlb its mapping only needs one entry per 2 MiB), not
 * fresh ones.  Fresh memory (a region not yet backed) is taken only while
 * the regions the last reclamation found held but uncommitted (a
 * superseded version a reader still maps, a save in flight: space that
 * comes back when they end) do not make up the difference, so the reserve
 * never grows the pool for space a reclamation is about to give back. */
static uint32_t s_unbacked_free(ll_pool_t *pool, size_t want)
{
    size_t n = pool->nregions, seen = 0, pending = atomic_load(&pool->hdr->pending);
    if (!s_fresh_ok(pool))
        pending = want; /* a save may be in flight: what it supersedes comes back */
    for (size_t i = 0; i < n && seen < want; i++) {
        uint64_t s = atomic_load(&pool->state[i]);
        if (LL_POOL_ST(s) != LL_POOL_ST_FREE)
            continue;
        if (!ll_pool_populated(pool, (uint32_t) i)) {
            if (LL_POOL_IS_BACKED(s) || seen + pending < want)
                return (uint32_t) i;
            continue; /* (a backed one further up may still be prefaulted) */
        }
        seen++;
    }
    return UINT32_MAX;
}

/* Whether the idle hook has something new to look at: a commit, a dropped
 * lease or a bigger save since its last call (rmu held). */
static bool s_idle_due(ll_pool_t *pool, uint64_t now[4])
{
    now[0] = atomic_load(&pool->hdr->epoch);
    now[1] = atomic_load(&pool->hdr->released);
    now[2] = atomic_load(&pool->hdr->save_bytes);
    /* (a save of the user that met the cap: give back what is held ahead
     * of use; and again once that is over, to grow the reserve back) */
    now[3] = ll_quota_pressed(pool->quota, 30000);
    return pool->idle_fn && memcmp(now, pool->iseen, sizeof pool->iseen) != 0;
}

/* The reserve thread: while fewer than rtarget free regions are prefaulted,
 * no save is copying and the store has been idle for S_RESERVE_IDLE_MS,
 * prefault one more region (~1 ms with 4 KiB pages).  Between cells the
 * kernel is idle while the user types: that is when this runs.
 *
 * Normal priority on purpose, not SCHED_IDLE or a high nice value:
 * MADV_POPULATE_WRITE holds the process's mmap lock for reading, and a
 * starved holder would stall every mmap/munmap of the process's other
 * threads (a restore, numpy's large allocations) for as long as it waits
 * for CPU, up to seconds on a loaded machine.  Populating 256 KiB per call
 * keeps each hold to ~0.1 ms.
 *
 * Touching a region does not change its bytes and the region stays FREE,
 * so allocation, the pool-full error and reclamation are as without it; a
 * region another process (or this one) allocates meanwhile is merely
 * prefaulted for its writer. */
static void *s_reserve_main(void *arg)
{
    ll_pool_t *pool = arg;
    pthread_mutex_lock(&pool->rmu);
    while (!pool->rstop) {
        uint32_t i = UINT32_MAX;
        uint64_t now = (uint64_t) ll_clock_ms(), last = atomic_load(&pool->ractive);
        uint64_t quiet = now > last ? now - last : 0; /* (LAST may be set after NOW was read) */
        bool idle = quiet >= S_RESERVE_IDLE_MS;
        uint64_t now_seen[4];
        if (pool->rhold == 0 && idle && s_idle_due(pool, now_seen)) {
            /* Reclaim (and resize, trim) first: what it frees is what the
             * reserve then needs not take fresh. */
            int (*fn)(void *) = pool->idle_fn;
            void *ctx = pool->idle_ctx;
            pool->icalling = true;
            pthread_mutex_unlock(&pool->rmu);
            int rc = fn(ctx);
            pthread_mutex_lock(&pool->rmu);
            pool->icalling = false;
            pthread_cond_broadcast(&pool->rcond);
            if (rc == 0)
                memcpy(pool->iseen, now_seen, sizeof now_seen);
            pool->rblocked = false; /* regions may have been freed */
            if (rc != 0) {
                struct timespec until = ll_clock_deadline(S_RESERVE_IDLE_MS);
                pthread_cond_timedwait(&pool->rcond, &pool->rmu, &until);
            }
            continue;
        }
        if (pool->rhold == 0 && idle && !pool->rblocked && pool->rtarget > 0) {
            i = s_unbacked_free(pool, pool->rtarget);
            if (i == UINT32_MAX)
                pool->rblocked = true; /* the next rtarget free regions are prefaulted */
        }
        if (i == UINT32_MAX) {
            /* Wait for the store to go quiet, for a kick, or a second:
             * another process may have taken our prefaulted regions, or
             * freed some, without telling us. */
            uint64_t wait_ms = 1000;
            if (!idle && pool->rhold == 0 && (!pool->rblocked || pool->idle_fn))
                wait_ms = S_RESERVE_IDLE_MS - quiet;
            else if (pool->idle_fn)
                wait_ms = 250; /* another process's commit or release tells us nothing */
            struct timespec until = ll_clock_deadline((double) wait_ms);
            if (pthread_cond_timedwait(&pool->rcond, &pool->rmu, &until) == ETIMEDOUT &&
                pool->rblocked && pool->rtarget > 0)
                pool->rblocked = s_unbacked_free(pool, pool->rtarget) == UINT32_MAX;
            continue;
        }
        pthread_mutex_unlock(&pool->rmu);
        /* (Huge pages: one fault per region, nothing to split.) */
        size_t step = strcmp(pool->page_kind, "4k") == 0 ? S_RESERVE_STEP : LL_POOL_REGION_BYTES;
        int rc = ll_pool_touch(pool, i, step);
        pthread_mutex_lock(&pool->rmu);
        if (rc != 0 && rc != EAGAIN) {
            /* Out of memory (e.g. /dev/shm full) or the user's cap: not an
             * error here, the allocation that needs the memory will say so.
             * Wait for a kick. */
            ll_debug("store", "pool reserve: cannot back region %u: %s", i, strerror(rc));
            pool->rblocked = true;
        }
    }
    pthread_mutex_unlock(&pool->rmu);
    return NULL;
}

/* Start the thread unless it runs (rmu held).  0, or an errno. */
static int s_start(ll_pool_t *pool)
{
    int rc = 0;
    if (!pool->rstarted && !pool->rstop) {
        /* Signals stay with the process's other threads (the kernel's
         * SIGINT handling must never run on this one). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = pthread_create(&pool->rthread, NULL, s_reserve_main, pool);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc == 0)
            pool->rstarted = true;
        else
            ll_warn("store", "pool reserve: cannot start its thread: %s", strerror(rc));
    }
    return rc;
}

int ll_pool_reserve(ll_pool_t *pool, size_t nregions)
{
    if (getpid() != pool->pid)
        return -1;
    if (nregions > pool->nregions)
        nregions = pool->nregions;
    int rc = 0;
    pthread_mutex_lock(&pool->rmu);
    pool->rtarget = nregions;
    pool->rblocked = false;
    if (nregions > 0)
        rc = s_start(pool);
    pthread_cond_signal(&pool->rcond);
    pthread_mutex_unlock(&pool->rmu);
    return rc == 0 ? 0 : -1;
}

void ll_pool_set_idle(ll_pool_t *pool, int (*fn)(void *ctx), void *ctx)
{
    if (getpid() != pool->pid)
        return;
    pthread_mutex_lock(&pool->rmu);
    while (pool->icalling && pool->rstarted && !pthread_equal(pthread_self(), pool->rthread))
        pthread_cond_wait(&pool->rcond, &pool->rmu);
    pool->idle_fn = fn;
    pool->idle_ctx = ctx;
    /* Due at once (the values it has seen cannot all be these). */
    pool->iseen[0] = atomic_load(&pool->hdr->epoch) - 1;
    if (fn)
        s_start(pool);
    pthread_cond_signal(&pool->rcond);
    pthread_mutex_unlock(&pool->rmu);
}

void ll_pool_reserve_busy(ll_pool_t *pool)
{
    atomic_store(&pool->ractive, (uint64_t) ll_clock_ms());
}

void ll_pool_reserve_hold(ll_pool_t *pool, bool hold)
{
    ll_pool_reserve_busy(pool);
    pthread_mutex_lock(&pool->rmu);
    if (hold) {
        pool->rhold++;
    } else if (pool->rhold > 0 && --pool->rhold == 0) {
        pool->rblocked = false; /* regions may have been freed meanwhile */
        pthread_cond_signal(&pool->rcond);
    }
    pthread_mutex_unlock(&pool->rmu);
}

void ll_pool_reserve_stop(ll_pool_t *pool)
{
    if (getpid() != pool->pid)
        return; /* a fork child: the thread exists only in the parent */
    pthread_mutex_lock(&pool->rmu);
    bool started = pool->rstarted;
    pool->rstop = true;
    pool->rstarted = false;
    pthread_cond_signal(&pool->rcond);
    pthread_mutex_unlock(&pool->rmu);
    if (started)
        pthread_join(pool->rthread, NULL);
}

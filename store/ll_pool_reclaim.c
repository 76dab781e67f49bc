/* ll_pool_reclaim: reclamation of the payload pool (which regions may be
 * freed, and when) and giving their memory back (trim), with their
 * self-test.  Runs in every process of a session, on whatever thread calls
 * it: the store's callers, and the session owner's reserve thread (the
 * store's idle hook).  See ll_pool.c's DESIGN for the words (state, lease,
 * generation, epoch) and the Dekker pattern between leaser and reclaimer.
 *
 * THE RULE.  The store is the only copy of a user's variables
 * between GPU cells, so a region is freed only when (a) no committed
 * version refers to it (Redis's ll:S:prefs, read after the candidates were
 * chosen; a commit meanwhile moves the epoch and the reclaimer gives up;
 * versions the session's history keeps count as committed: ll:S:hprefs,
 * ll_history.c)
 * and (b) no live process holds a lease on it.  Every reader leases before
 * it reads and holds the lease while it reads: a worker restoring or a
 * prefetch (ll_pool_map, for as long as the objects built on the mapping
 * live), the kernel refreshing (the same), a put sharing a base region, a
 * commit in flight, a save's uncommitted payloads.  A reader that fetched
 * refs of a version superseded and freed before it leased gets EGONE and
 * fetches again (the Python layer does); it never reads reused bytes,
 * since the generation moved.  A dead process's leases are dropped
 * (ll_pool_clean_dead_slots) and so stop protecting anything.
 *
 * WHEN.  Within that rule, as early as possible, not when the pool is
 * full: the header counts commits (epoch) and dropped leases (released); a
 * reclamation records both as it read them before choosing candidates
 * (only when it completed), and while either moved since, one is due
 * (ll_pool_gc_due).  Then the session's owner reclaims as soon as its
 * store is idle (ll_pool_set_idle, on the reserve thread), and any put
 * that would otherwise take fresh memory reclaims first (ll_store_put.c).
 * So a superseded version lives until its last reader lets go.
 *
 * MEMORY.  A freed region stays backed: the next save reuses it at memcpy
 * speed, and allocation takes backed free regions before fresh ones.
 * BACKED in the state word says the region's memory is counted in the
 * user's ledger (ll_quota): set when a fresh region is allocated or
 * prefaulted (the ledger refusing it is the user's cap), cleared only by a
 * trim, which gives back the memory of free regions beyond what the
 * reserve keeps: set my lease bit, CAS FREE(g)+BACKED -> TRIM(g), punch the
 * region out of the file, FREE(g) unbacked.  A trimmer that dies midway
 * leaves TRIM with no lease bit once its slot is cleaned: reclamation
 * turns it back into FREE(g)+BACKED (still counted; the next trim settles
 * it).  Each punch moves the region's trim count on, and a process's
 * record that it prefaulted a region holds only for the count it saw, so
 * nobody writes into a punched region believing it backed.  (A prefault
 * racing a trim of the same free region may back it again uncounted; it is
 * counted when next allocated.)  So what a session holds, reserve
 * included, is what the ledger counts.
 *
 * PENDING.  A complete reclamation also counts the regions held but not
 * committed (a superseded version a reader still maps, a save in flight):
 * space that comes back when they end.  The reserve does not take fresh
 * memory for what that space will cover (ll_pool_reserve.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_pool_internal.h"
#include "base/ll_check.h"

void ll_pool_note_save(ll_pool_t *pool, size_t bytes)
{
    uint64_t cur = atomic_load(&pool->hdr->save_bytes);
    while (bytes > cur && !atomic_compare_exchange_weak(&pool->hdr->save_bytes, &cur, bytes))
        ;
}

void ll_pool_set_keep(ll_pool_t *pool, size_t nregions)
{
    atomic_store(&pool->hdr->keep, nregions);
}

size_t ll_pool_save_bytes(ll_pool_t *pool)
{
    return (size_t) atomic_load(&pool->hdr->save_bytes);
}

bool ll_pool_gc_due(ll_pool_t *pool)
{
    return atomic_load(&pool->hdr->epoch) != atomic_load(&pool->hdr->gc_epoch) ||
           atomic_load(&pool->hdr->released) != atomic_load(&pool->hdr->gc_released);
}

size_t ll_pool_free_backed(ll_pool_t *pool)
{
    size_t c = 0;
    for (size_t i = 0; i < pool->nregions; i++) {
        uint64_t s = atomic_load(&pool->state[i]);
        c += LL_POOL_ST(s) == LL_POOL_ST_FREE && LL_POOL_IS_BACKED(s);
    }
    return c;
}

int ll_pool_gc(ll_pool_t *pool, ll_pool_refs_fn referenced, void *ctx, char *err, size_t errlen)
{
    size_t n = pool->nregions;
    ll_pool_clean_dead_slots(pool);
    /* What this reclamation will have seen, read before its candidates. */
    uint64_t epoch = atomic_load(&pool->hdr->epoch);
    uint64_t released = atomic_load(&pool->hdr->released);
    uint64_t allocs = atomic_load(&pool->hdr->allocs);
    uint32_t *cand = malloc(n * sizeof *cand);
    uint64_t *candst = malloc(n * sizeof *candst);
    uint64_t *mark = calloc(n, sizeof *mark);
    size_t ncand = 0;
    int freed = -1;
    bool complete = true;
    if (!cand || !candst || !mark) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    size_t nalloc = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = atomic_load(&pool->state[i]);
        nalloc += LL_POOL_ST(s) == LL_POOL_ST_ALLOC;
        if (LL_POOL_ST(s) == LL_POOL_ST_TRIM && atomic_load(&pool->lease[i]) == 0) {
            /* A trimmer holds its lease bit while it trims: this one died
             * (its slot was cleaned).  The memory may or may not be gone:
             * keep it counted, the next trim settles it. */
            uint64_t f = LL_POOL_MK(LL_POOL_GEN(s), 1, LL_POOL_ST_FREE);
            atomic_compare_exchange_strong(&pool->state[i], &s, f);
            continue;
        }
        if (LL_POOL_ST(s) == LL_POOL_ST_ALLOC && atomic_load(&pool->lease[i]) == 0) {
            cand[ncand] = (uint32_t) i;
            candst[ncand++] = s;
        }
    }
    freed = 0;
    if (nalloc == 0) {
        atomic_store(&pool->hdr->pending, 0);
        goto out;
    }
    /* Only now ask which regions committed versions use (see DESIGN). */
    if (referenced(ctx, mark, n) != 0) {
        snprintf(err, errlen, "cannot read the committed payload references");
        freed = -1;
        goto out;
    }
    /* Held but not committed: a superseded version a reader still maps, a
     * save in flight.  Either gives space back when it ends. */
    size_t pending = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t s = atomic_load(&pool->state[i]);
        pending += LL_POOL_ST(s) == LL_POOL_ST_ALLOC && mark[i] != LL_POOL_GEN(s) &&
                   atomic_load(&pool->lease[i]) != 0;
    }
    atomic_store(&pool->hdr->pending, pending);
    for (size_t c = 0; c < ncand; c++) {
        uint32_t i = cand[c];
        uint64_t s = candst[c], gen = LL_POOL_GEN(s);
        if (mark[i] == gen)
            continue;
        uint64_t freeing = LL_POOL_MK(gen, 1, LL_POOL_ST_FREEING);
        if (!atomic_compare_exchange_strong(&pool->state[i], &s, freeing))
            continue;
        /* CAS, not store, out of FREEING: a leaser that waited too long for
         * us (we were descheduled) may have taken the region back to ALLOC. */
        if (atomic_load(&pool->lease[i]) != 0 || atomic_load(&pool->hdr->epoch) != epoch) {
            atomic_compare_exchange_strong(&pool->state[i], &freeing,
                                           LL_POOL_MK(gen, 1, LL_POOL_ST_ALLOC));
            if (atomic_load(&pool->hdr->epoch) != epoch) {
                complete = false;
                break; /* a commit landed: our reference set is stale */
            }
            continue;
        }
        /* Still backed and counted: the next save reuses it, or a trim
         * gives its memory back. */
        if (atomic_compare_exchange_strong(&pool->state[i], &freeing,
                                           LL_POOL_MK(gen, 1, LL_POOL_ST_FREE)))
            freed++;
    }
    ll_debug("store", "pool gc: %zu candidates, %d freed", ncand, freed);
out:
    if (freed >= 0 && complete) {
        atomic_store(&pool->hdr->gc_epoch, epoch);
        atomic_store(&pool->hdr->gc_released, released);
        atomic_store(&pool->hdr->gc_allocs, allocs);
    }
    free(cand);
    free(candst);
    free(mark);
    return freed;
}

size_t ll_pool_trim(ll_pool_t *pool, size_t keep)
{
    size_t n = pool->nregions, nfree = 0, trimmed = 0;
    if (keep < atomic_load(&pool->hdr->keep))
        keep = (size_t) atomic_load(&pool->hdr->keep); /* the owner's reserve stays */
    /* Keep the lowest KEEP free regions (where allocation and the reserve
     * look first); give back the memory of the backed free ones above. */
    size_t cut = n;
    for (size_t i = 0; i < n && nfree < keep; i++)
        if (LL_POOL_ST(atomic_load(&pool->state[i])) == LL_POOL_ST_FREE && ++nfree == keep)
            cut = i + 1;
    if (keep == 0)
        cut = 0;
    for (size_t i = n; i-- > cut;) {
        uint64_t s = atomic_load(&pool->state[i]);
        if (LL_POOL_ST(s) != LL_POOL_ST_FREE || !LL_POOL_IS_BACKED(s))
            continue;
        /* My lease bit first: a trim whose process dies midway is then
         * recognised (ll_pool_gc) and undone. */
        ll_pool_lease_bit(pool, (uint32_t) i);
        uint64_t trim = LL_POOL_MK(LL_POOL_GEN(s), 1, LL_POOL_ST_TRIM);
        if (atomic_compare_exchange_strong(&pool->state[i], &s, trim)) {
            bool gone = ll_pool_punch(pool, (uint32_t) i) == 0;
            atomic_store(&pool->state[i], LL_POOL_MK(LL_POOL_GEN(s), !gone, LL_POOL_ST_FREE));
            if (gone) {
                ll_quota_give(pool->quota, 1);
                trimmed++;
            }
        }
        /* (not ll_pool_unlease: a trim frees nothing to reclaim) */
        pthread_mutex_lock(&pool->mu);
        if (pool->counts[i] > 0 && --pool->counts[i] == 0)
            atomic_fetch_and(&pool->lease[i], ~(UINT64_C(1) << pool->slot));
        pthread_mutex_unlock(&pool->mu);
    }
    if (trimmed)
        ll_debug("store", "pool trim: gave back %zu regions (kept %zu free)", trimmed, keep);
    return trimmed;
}

/* ---- self-test (no Redis needed) -------------------------------------- */

static uint64_t s_test_mark_gen[8];

static int s_test_refs(void *ctx, uint64_t *mark, size_t nregions)
{
    for (size_t i = 0; i < nregions && i < 8; i++)
        mark[i] = s_test_mark_gen[i];
    return 0;
}

/* Bytes of memory the pool file at PATH holds. */
static long long s_test_blocks(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long) sb.st_blocks * 512 : -1;
}

/* Reclamation, memory and the ledger: a freed region stays
 * backed and counted and is reused before fresh memory; a trim gives the
 * memory of free regions beyond what is kept back to the system and the
 * ledger, voids prefaults of them, and a trimmer that died is undone; the
 * counters say when a reclamation is due; held-but-uncommitted regions are
 * reported pending; a put that fails before writing holds nothing. */
int ll_pool_reclaim_selftest(bool verbose)
{
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/ll-pool-reclaim-selftest-%d.pool", (int) getpid());
    const size_t R = LL_POOL_REGION_BYTES;
    char err[256], lpath[64];
    int kind;
    void *a;
    ll_pool_t *pool = NULL, *other = NULL;
    ll_quota_t *q = NULL, *q2 = NULL;
    snprintf(lpath, sizeof lpath, "/tmp/ll-pool-selftest-%d.ledger", (int) getpid());
    unlink(lpath);
    unlink(path);
    q = ll_quota_open(lpath, err, sizeof err);
    pool = ll_pool_open(path, 8 * R, err, sizeof err);
    S_REQUIRE(q && pool, fail);
    ll_pool_set_quota(pool, q);
    long long base = s_test_blocks(path); /* the header */
    S_REQUIRE(base >= 0 && ll_quota_held(q) == 0, fail);
    /* Three fresh regions written: counted as they are taken. */
    ll_pool_region_t r[8];
    for (int i = 0; i < 3; i++) {
        S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[i], &a, &kind, err, sizeof err) == 0, fail);
        S_REQUIRE(r[i].idx == (uint32_t) i, fail); /* lowest first */
        S_REQUIRE(ll_pool_back(pool, r[i].idx) == 0, fail);
        memset(a, 'x', R);
    }
    S_REQUIRE(ll_quota_held(q) == 3 * R && s_test_blocks(path) == base + 3 * (long long) R, fail);
    /* Region 1 is committed; 0 and 2 superseded; 2 still read. */
    for (int i = 0; i < 3; i++)
        ll_pool_unlease(pool, r[i].idx);
    S_REQUIRE(ll_pool_lease(pool, &r[2]) == 0, fail);
    S_REQUIRE(ll_pool_gc_due(pool), fail);
    memset(s_test_mark_gen, 0, sizeof s_test_mark_gen);
    s_test_mark_gen[r[1].idx] = r[1].gen;
    S_REQUIRE(ll_pool_gc(pool, s_test_refs, NULL, err, sizeof err) == 1, fail);      /* 0 only */
    S_REQUIRE(!ll_pool_gc_due(pool) && atomic_load(&pool->hdr->pending) == 1, fail); /* 2 */
    /* Freed, yet backed and counted: the next allocation reuses it (even
     * from another process, which never prefaulted it) before any fresh. */
    S_REQUIRE(ll_quota_held(q) == 3 * R && ll_pool_free_backed(pool) == 1, fail);
    other = ll_pool_open(path, 0, err, sizeof err);
    q2 = ll_quota_open(lpath, err, sizeof err); /* (a handle joins one pool) */
    S_REQUIRE(other && q2, fail);
    ll_pool_set_quota(other, q2);
    S_REQUIRE(ll_pool_alloc_unbacked(other, &r[3], &a, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(r[3].idx == 0 && ll_quota_held(q) == 3 * R, fail);
    /* The reader lets go: due again; the superseded region goes. */
    ll_pool_unlease(pool, r[2].idx);
    S_REQUIRE(ll_pool_gc_due(pool), fail);
    S_REQUIRE(ll_pool_gc(pool, s_test_refs, NULL, err, sizeof err) == 1, fail);
    S_REQUIRE(atomic_load(&pool->hdr->pending) == 1, fail); /* the other's uncommitted region 0 */
    /* A put that fails before writing gives its fresh region back whole:
     * counted while taken, uncounted and unbacked after. */
    S_REQUIRE(ll_pool_alloc_unbacked(other, &r[4], &a, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(r[4].idx == 2, fail); /* the backed free one, before fresh region 3 */
    S_REQUIRE(ll_pool_alloc_unbacked(other, &r[5], &a, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(r[5].idx == 3 && ll_quota_held(q) == 4 * R, fail);
    ll_pool_free_unwritten(other, &r[5]);
    ll_pool_unlease(other, r[5].idx);
    S_REQUIRE(ll_quota_held(q) == 3 * R && s_test_blocks(path) == base + 3 * (long long) R, fail);
    ll_pool_free_unwritten(other, &r[4]); /* never written by OTHER: punched too */
    ll_pool_unlease(other, r[4].idx);
    S_REQUIRE(ll_quota_held(q) == 2 * R && s_test_blocks(path) == base + 2 * (long long) R, fail);
    ll_pool_free_unwritten(other, &r[3]);
    ll_pool_unlease(other, r[3].idx);
    ll_pool_destroy(&other);
    ll_quota_destroy(&q2);
    /* Prefault two free regions here (counted), then trim keeping one:
     * the memory of the top one goes back, its prefault is void. */
    S_REQUIRE(ll_pool_prefault(pool, 2) == 2, fail);
    S_REQUIRE(ll_pool_populated(pool, 0) && ll_pool_populated(pool, 2), fail);
    S_REQUIRE(ll_quota_held(q) == 3 * R, fail);
    S_REQUIRE(ll_pool_trim(pool, 1) == 1, fail);
    S_REQUIRE(ll_pool_populated(pool, 0) && !ll_pool_populated(pool, 2), fail);
    S_REQUIRE(ll_quota_held(q) == 2 * R && s_test_blocks(path) == base + 2 * (long long) R, fail);
    /* A writer taking the trimmed region backs it again (not trusting the
     * void prefault); then everything free goes. */
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[6], &a, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(r[6].idx == 0, fail); /* still prefaulted here */
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[7], &a, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(r[7].idx == 2 && ll_pool_back(pool, 2) == 0 && ll_pool_populated(pool, 2), fail);
    S_REQUIRE(ll_quota_held(q) == 3 * R && s_test_blocks(path) == base + 3 * (long long) R, fail);
    ll_pool_free_unwritten(pool, &r[6]);
    ll_pool_free_unwritten(pool, &r[7]);
    ll_pool_unlease(pool, r[6].idx);
    ll_pool_unlease(pool, r[7].idx);
    ll_pool_set_keep(pool, 8); /* the owner's reserve: nobody's trim takes it */
    S_REQUIRE(ll_pool_trim(pool, 0) == 0, fail);
    ll_pool_set_keep(pool, 0);
    S_REQUIRE(ll_pool_trim(pool, 0) == 2, fail);
    S_REQUIRE(ll_quota_held(q) == R && s_test_blocks(path) == base + (long long) R,
              fail); /* region 1 */
    /* A trimmer killed midway (TRIM, its slot cleaned): reclamation undoes
     * it, the region counted as backed until the next trim settles it. */
    S_REQUIRE(ll_quota_take(q, 1, NULL) == 0, fail); /* (it was counted when backed) */
    atomic_store(&pool->state[4], LL_POOL_MK(9, 1, LL_POOL_ST_TRIM));
    S_REQUIRE(ll_pool_gc(pool, s_test_refs, NULL, err, sizeof err) == 0, fail);
    S_REQUIRE(atomic_load(&pool->state[4]) == LL_POOL_MK(9, 1, LL_POOL_ST_FREE), fail);
    /* The user's cap: a fresh region past it is refused; prefaults leave a
     * quarter of it to saves. */
    ll_quota_set_cap(q, 3 * R, LL_QUOTA_SRC_ENV);
    S_REQUIRE(ll_pool_trim(pool, 0) == 1 && ll_quota_held(q) == R, fail);
    S_REQUIRE(ll_pool_prefault(pool, 8) == 1 && ll_quota_held(q) == 2 * R, fail); /* 2 of 2.25 */
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[0], &a, &kind, err, sizeof err) == 0,
              fail); /* warm */
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[2], &a, &kind, err, sizeof err) == 0,
              fail); /* fresh */
    S_REQUIRE(ll_quota_held(q) == 3 * R, fail);
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[3], &a, &kind, err, sizeof err) == -1 &&
                  kind == LL_POOL_EQUOTA,
              fail);
    ll_pool_unlink(pool);
    ll_pool_destroy(&pool);
    ll_quota_destroy(&q);
    unlink(lpath);
    return 0;
fail:
    ll_pool_destroy(&other);
    ll_pool_destroy(&pool);
    ll_quota_destroy(&q);
    ll_quota_destroy(&q2);
    unlink(lpath);
    unlink(path);
    return 1;
}

/* ll_store_put: writing payloads into the pool (put), giving back an
 * uncommitted one (discard) and mapping one for reading (map).  Runs on
 * the caller's thread under the store's mutex; a large put's copy and
 * hashing run on up to S_MAX_THREADS threads of its own.
 *
 * A put writes new regions (leased by this process until a commit lists
 * the ref, see ll_store_ref.c), and with a base shares each region whose
 * hash is unchanged.  Copies and hashes of large payloads run on up to 4
 * threads: each thread backs a fresh region (ll_pool_back) right before it
 * copies into it, unless this process prefaulted it already (the reserve,
 * ll_pool_reserve.c, does so between saves, and allocation prefers those
 * regions), so the copy runs at memcpy speed and a second thread helps
 * (MEASURED.md: 15 -> 28 GB/s); each 64 KiB piece is hashed right after it
 * is copied, while it is still in cache. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_hash.h"
#include "store/ll_store_internal.h"

#define S_PARALLEL_MIN ((size_t) 32 << 20) /* below this one thread copies */
#define S_MAX_THREADS  4
#define S_SAMPLE_MIN   16 /* candidate regions: below this, always hash first */
#define S_SAMPLES      4  /* candidates hashed to choose copy-first */
#define S_GC_MIN_GAIN  8  /* regions: reclaim before a put when it may save this many faults */

/* ---- parallel copy/hash ---------------------------------------------- */

typedef struct {
    void (*fn)(void *ctx, size_t i);
    void *ctx;
    size_t n;
    _Atomic size_t next;
} s_par_t;

static void *s_par_worker(void *arg)
{
    s_par_t *p = arg;
    for (size_t i; (i = atomic_fetch_add(&p->next, 1)) < p->n;)
        p->fn(p->ctx, i);
    return NULL;
}

/* Run FN(CTX, i) for i < N, on several threads when BYTES is large. */
static void s_parallel(size_t n, size_t bytes, void (*fn)(void *, size_t), void *ctx)
{
    s_par_t p = {fn, ctx, n, 0};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads =
        bytes >= S_PARALLEL_MIN && n > 1 ? (int) (ncpu < S_MAX_THREADS ? ncpu : S_MAX_THREADS) : 1;
    pthread_t th[S_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nthreads; t++)
        if (pthread_create(&th[started], NULL, s_par_worker, &p) == 0)
            started++;
    s_par_worker(&p);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
}

typedef struct {
    const char *src;
    size_t len;
    ll_pool_region_t *regs;       /* the new payload's regions */
    const ll_pool_region_t *base; /* base regions (hash compared), or NULL */
    char *reuse;                  /* per region: 1 when shared with base */
    char *cand;                   /* per region: base region leased, compare */
    void **dst;                   /* per region: where to copy (new ones) */
    ll_pool_t *pool;              /* backs new regions right before their copy */
    int *backerr;                 /* per region: errno of a failed backing */
} s_put_t;

static size_t s_chunk(size_t len, size_t i)
{
    size_t off = i * LL_STORE_R;
    return len - off < LL_STORE_R ? len - off : LL_STORE_R;
}

static void s_hash_cmp(void *ctx, size_t i)
{
    s_put_t *p = ctx;
    if (!p->cand[i])
        return;
    uint64_t h = ll_hash(p->src + i * LL_STORE_R, s_chunk(p->len, i));
    if (h == p->base[i].hash)
        p->reuse[i] = 1;
}

static void s_copy_hash(void *ctx, size_t i)
{
    s_put_t *p = ctx;
    if (p->reuse[i])
        return;
    int rc = ll_pool_back(p->pool, p->regs[i].idx);
    if (rc != 0) {
        p->backerr[i] = rc;
        return;
    }
    p->regs[i].hash = ll_hash_copy(p->dst[i], p->src + i * LL_STORE_R, s_chunk(p->len, i));
}

/* Give back fresh region I of a put (allocated, not yet committed): its
 * bytes may be half written, which no reader can see. */
static void s_put_free_new(s_put_t *p, size_t i)
{
    if (!p->dst[i])
        return;
    ll_pool_free_unwritten(p->pool, &p->regs[i]);
    ll_pool_unlease(p->pool, p->regs[i].idx);
    p->dst[i] = NULL;
}

/* ---- put / discard / map ----------------------------------------------- */

char *ll_store_put(ll_store_t *st, const void *data, size_t len, const char *base_ref,
                   const uint8_t *dirty, size_t *written)
{
    if (ll_store_enter(st) != 0)
        return NULL;
    size_t n = (len + LL_STORE_R - 1) / LL_STORE_R, bnb = 0, bn = 0, m = n ? n : 1;
    ll_pool_region_t *base = NULL;
    char *ref = NULL;
    s_put_t p = {.src = data, .len = len, .pool = st->pool};
    p.regs = calloc(m, sizeof *p.regs);
    p.reuse = calloc(m, 1);
    p.cand = calloc(m, 1);
    p.dst = calloc(m, sizeof *p.dst);
    p.backerr = calloc(m, sizeof *p.backerr);
    uint8_t *bl = calloc(m, 1);           /* base region i leased by this put */
    ll_pool_reserve_hold(st->pool, true); /* the copy gets the CPUs, not the reserve */
    uint32_t *held = malloc(m * sizeof *held);
    size_t *cidx = malloc(m * sizeof *cidx); /* candidate indices, for sampling */
    size_t nwritten = 0;
    bool done = false; /* leases handed to the pending list */
    if (!p.regs || !p.reuse || !p.cand || !p.dst || !p.backerr || !bl || !held || !cidx) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    uint64_t base_pool = 0;
    if (base_ref && ll_store_ref_parse(base_ref, &base_pool, &bnb, &base, &bn) != 0) {
        ll_store_fail(st, LL_STORE_EINVAL, "base is not a payload ref: %.80s", base_ref);
        goto out;
    }
    if (base_ref && base_pool != ll_pool_id(st->pool))
        bn = 0; /* a base in a pool that no longer exists shares nothing */
    if (n > ll_pool_nregions(st->pool)) {
        ll_store_fail(st, LL_STORE_EFULL,
                      "payload pool full: a payload of %zu bytes is larger than the "
                      "whole pool (%zu bytes)",
                      len, ll_pool_nregions(st->pool) * LL_STORE_R);
        goto out;
    }
    if (dirty && (!base_ref || bnb != len)) {
        ll_store_fail(st, LL_STORE_EINVAL, "dirty regions need a base payload of the same length");
        goto out;
    }
    p.base = base;
    /* Lease the base regions that could be shared: same index, same length.
     * One that was reclaimed meanwhile is simply written anew.  A region the
     * caller says is clean is shared without hashing. */
    size_t ncand = 0;
    for (size_t i = 0; i < n && i < bn; i++) {
        if (s_chunk(len, i) != s_chunk(bnb, i))
            continue;
        if (ll_pool_lease(st->pool, &base[i]) != 0)
            continue;
        bl[i] = 1;
        if (dirty && !dirty[i]) {
            p.reuse[i] = 1;
        } else {
            p.cand[i] = 1;
            cidx[ncand++] = i;
        }
    }
    double ts0 = ll_clock_ms(), ts1, ts2, ts3;
    /* Hashing every candidate before copying the changed ones costs a
     * second pass over memory (~40% of a save when everything changed).  So
     * hash a few candidates spread over the payload first: when none of them
     * is unchanged, assume a rewrite and copy every candidate, hashing as it
     * copies, and share the (rare) region that turns out unchanged afterwards,
     * giving its fresh copy back.  Otherwise hash first, copy what changed. */
    bool copy_first = false;
    if (ncand >= S_SAMPLE_MIN) {
        size_t same = 0;
        for (size_t s = 0; s < S_SAMPLES; s++) {
            size_t i = cidx[s * ncand / S_SAMPLES];
            p.cand[i] = 0;
            if (ll_hash(p.src + i * LL_STORE_R, s_chunk(len, i)) == base[i].hash) {
                p.reuse[i] = 1;
                same++;
            } else {
                ll_pool_unlease(st->pool, base[i].idx);
                bl[i] = 0;
            }
        }
        copy_first = same == 0;
    }
hash_first:
    if (!copy_first) {
        size_t to_hash = 0;
        for (size_t i = 0; i < n; i++)
            to_hash += p.cand[i] ? s_chunk(len, i) : 0;
        if (to_hash)
            s_parallel(n, to_hash, s_hash_cmp, &p);
        for (size_t i = 0; i < n; i++) {
            if (p.cand[i] && !p.reuse[i]) {
                ll_pool_unlease(st->pool, base[i].idx);
                bl[i] = 0;
            }
            p.cand[i] = 0;
        }
    }
    ts1 = ll_clock_ms();
    /* Allocate the regions to write; a full pool first tries reclamation.
     * So does a put that would otherwise first-touch fresh regions while
     * prefaulted ones may have become garbage (a commit happened since the
     * last reclamation), when that pays: first touch of a region costs
     * about 1 ms with 4 KiB pages (MEASURED.md; ~10x less with huge pages),
     * a reclamation about 1 us per variable it reads from Redis.  Counted
     * in variables, not measured in time, so the choice does not flip with
     * the machine's load.  The reserve's prefaulted regions do not count as
     * free here: they are kept for new data, and garbage reclaimed now saves
     * refilling them (and memory). */
    bool tried_gc = false;
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += !p.reuse[i];
    if (need > 0 && ll_pool_epoch(st->pool) != st->gc_epoch) {
        size_t free_warm, idle_warm;
        ll_pool_warm_counts(st->pool, &free_warm, &idle_warm);
        free_warm = free_warm > st->reserve_regions ? free_warm - st->reserve_regions : 0;
        size_t gain = need > free_warm ? need - free_warm : 0;
        if (gain > idle_warm)
            gain = idle_warm;
        size_t vars_per_region = strcmp(ll_pool_page_kind(st->pool), "4k") == 0 ? 1000 : 100;
        if (gain >= S_GC_MIN_GAIN && gain * vars_per_region >= st->gc_vars + 64) {
            tried_gc = true;
            if (ll_store_gc_locked(st) < 0)
                ll_debug("store", "%s", st->err); /* the put goes on without it */
            st->err[0] = 0;
            st->errkind = LL_STORE_OK;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (p.reuse[i])
            continue;
        int kind;
        char err[512];
        while (ll_pool_alloc_unbacked(st->pool, &p.regs[i], &p.dst[i], &kind, err, sizeof err) !=
               0) {
            p.dst[i] = NULL;
            if (kind == LL_POOL_EFULL && !tried_gc) {
                tried_gc = true;
                if (ll_store_gc_locked(st) > 0)
                    continue;
            }
            if (kind == LL_POOL_EFULL && copy_first) {
                /* Copying first needs room for the unchanged regions too:
                 * give back what we took and find out what changed. */
                for (size_t j = 0; j < i; j++)
                    s_put_free_new(&p, j);
                nwritten = 0;
                copy_first = false;
                goto hash_first;
            }
            ll_store_fail(st, kind == LL_POOL_EFULL ? LL_STORE_EFULL : LL_STORE_EIO,
                          "%s (payload of %zu bytes)", err, len);
            goto out;
        }
        nwritten += s_chunk(len, i);
    }
    ts2 = ll_clock_ms();
    /* Fresh regions are backed inside the copy, region by region on each
     * copy thread (MADV_POPULATE_WRITE, then the copy while the region is
     * still in the TLB): on 4 KiB pages the faults, not the copy, dominate a
     * first save, and this spreads them over the threads instead of paying
     * them on this one before the copy starts. */
    if (nwritten)
        s_parallel(n, nwritten, s_copy_hash, &p);
    ts3 = ll_clock_ms();
    for (size_t i = 0; i < n; i++) {
        if (!p.backerr[i])
            continue;
        bool huge = strcmp(ll_pool_page_kind(st->pool), "hugetlb") == 0;
        ll_store_fail(
            st, LL_STORE_EFULL,
            "payload pool full: cannot back a 2 MiB region of the pool: %s "
            "(payload of %zu bytes)%s",
            strerror(p.backerr[i]), len,
            huge ? "; no more huge pages (HugePages_Free, vm.nr_overcommit_hugepages, free "
                   "memory)"
                 : "");
        goto out;
    }
    /* Copied first: an unchanged region is shared after all, its copy given back. */
    size_t late_same = 0;
    for (size_t i = 0; i < n; i++) {
        if (!p.cand[i])
            continue;
        p.cand[i] = 0;
        if (p.regs[i].hash == base[i].hash) {
            s_put_free_new(&p, i);
            nwritten -= s_chunk(len, i);
            p.reuse[i] = 1;
            late_same++;
        } else {
            ll_pool_unlease(st->pool, base[i].idx);
            bl[i] = 0;
        }
    }
    ll_debug("store",
             "put %zu bytes: compare %.2f ms (%s), allocate %.2f ms, copy %.2f ms "
             "(%zu bytes, %zu regions unchanged after all)",
             len, ts1 - ts0, copy_first ? "copy first" : "hash first", ts2 - ts1, ts3 - ts2,
             nwritten, late_same);
    for (size_t i = 0; i < n; i++) {
        if (p.reuse[i])
            p.regs[i] = base[i];
        held[i] = p.regs[i].idx;
    }
    ref = ll_store_ref_format(ll_pool_id(st->pool), len, p.regs, n);
    char *ref_copy = ref ? strdup(ref) : NULL;
    if (!ref_copy) {
        free(ref);
        ref = NULL;
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    /* If this exact payload is already pending (same regions, all shared),
     * the new hold simply stacks on the old one. */
    ll_store_pending_add(st, ref_copy, held, n);
    held = NULL;
    done = true;
    st->puts++;
    st->bytes_written += nwritten;
    st->bytes_shared += len - nwritten;
    *written = nwritten;
    ll_store_fault("after_payload");
out:
    if (!done && bl && p.dst) {
        /* Failed: give back every lease this put took and every fresh
         * region it allocated (unwritten as far as any commit knows). */
        for (size_t i = 0; i < n; i++) {
            if (bl[i])
                ll_pool_unlease(st->pool, base[i].idx);
            s_put_free_new(&p, i);
        }
    }
    free(held);
    free(cidx);
    free(bl);
    free(base);
    free(p.regs);
    free(p.reuse);
    free(p.cand);
    free(p.dst);
    free(p.backerr);
    if (ref && nwritten > st->largest_put) {
        st->largest_put = nwritten;
        ll_store_reserve_update(st);
    }
    ll_pool_reserve_hold(st->pool, false);
    ll_store_leave(st);
    return ref;
}

int ll_store_discard(ll_store_t *st, const char *ref)
{
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = ll_store_pending_release(st, ref)
                 ? 0
                 : ll_store_fail(st, LL_STORE_EINVAL, "payload ref is not pending in this process");
    ll_store_leave(st);
    return rc;
}

ll_pool_map_t *ll_store_map(ll_store_t *st, const char *ref, bool writable)
{
    if (ll_store_enter(st) != 0)
        return NULL;
    size_t nb, n;
    uint64_t pool_id;
    ll_pool_region_t *regs;
    ll_pool_map_t *map = NULL;
    if (ll_store_ref_parse(ref, &pool_id, &nb, &regs, &n) != 0) {
        ll_store_fail(st, LL_STORE_EINVAL, "not a payload ref: %.80s", ref);
        goto out;
    }
    if (pool_id != ll_pool_id(st->pool)) {
        free(regs);
        ll_store_fail(st, LL_STORE_EGONE,
                      "payload is in another pool (the session's pool was recreated)");
        goto out;
    }
    int kind;
    char err[512];
    map = ll_pool_map(st->pool, regs, n, nb, writable, &kind, err, sizeof err);
    if (!map)
        ll_store_fail(st,
                      kind == LL_POOL_EGONE    ? LL_STORE_EGONE
                      : kind == LL_POOL_EINVAL ? LL_STORE_EINVAL
                                               : LL_STORE_EIO,
                      "%s", err);
    free(regs);
out:
    ll_store_leave(st);
    return map;
}

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
#include <pwd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_hash.h"
#include "store/ll_history.h"
#include "store/ll_store_internal.h"

#define S_PARALLEL_MIN ((size_t) 32 << 20) /* below this one thread copies */
#define S_MAX_THREADS  4
#define S_SAMPLE_MIN   16 /* candidate regions: below this, always hash first */
#define S_SAMPLES      4  /* candidates hashed to choose copy-first */

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

/* One put: what its copy/hash threads read (the first block), and its own
 * state, touched only by the thread that runs the put. */
typedef struct {
    const char *src;
    size_t len;
    ll_pool_region_t *regs; /* the new payload's regions */
    ll_pool_region_t *base; /* base regions (hash compared; owned), or NULL */
    char *reuse;            /* per region: 1 when shared with base */
    char *cand;             /* per region: base region leased, compare */
    void **dst;             /* per region: where to copy (new ones) */
    ll_pool_t *pool;        /* backs new regions right before their copy */
    int *backerr;           /* per region: errno of a failed backing */

    ll_store_t *st;
    size_t n;           /* regions of the payload */
    size_t bn, bnb;     /* regions and bytes of the base (bn 0: nothing to share) */
    uint8_t *bl;        /* per region: base region leased by this put */
    uint32_t *held;     /* the payload's region indices, for the pending list */
    size_t *cidx;       /* candidate indices, for sampling */
    size_t ncand;       /* entries in cidx */
    bool copy_first;    /* copy every candidate, compare hashes after */
    bool tried_gc;      /* this allocation round reclaimed already */
    bool tried_history; /* the history's old versions were dropped for this put */
    bool waited;        /* waited for the user's other pools to give memory back */
    size_t nwritten;    /* bytes copied into fresh regions */
    bool done;          /* leases handed to the pending list */
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

/* Give back base region I, leased as a candidate that turned out changed. */
static void s_put_unlease_base(s_put_t *p, size_t i)
{
    ll_pool_unlease(p->pool, p->base[i].idx);
    p->bl[i] = 0;
}

/* ---- the decisions (pure) --------------------------------------------- */

/* Whether to reclaim before allocating NEED regions: when the backed free
 * regions (FREE_BACKED, reused before any fresh one) do not cover them and
 * a commit or a reader letting go (DUE) may have made garbage since the
 * last reclamation.  Memory first: a save takes fresh memory only when
 * nothing superseded can be reclaimed for it, so a long session's memory
 * stays near what its live variables need. */
static bool s_gc_first(size_t need, size_t free_backed, bool due)
{
    return due && need > free_backed;
}

/* ---- the phases of a put ---------------------------------------------- */

/* The put's tables for N regions.  0, or -1 (out of memory; what was
 * allocated is freed by s_put_end). */
static int s_put_init(s_put_t *p)
{
    size_t m = p->n ? p->n : 1;
    p->regs = calloc(m, sizeof *p->regs);
    p->reuse = calloc(m, 1);
    p->cand = calloc(m, 1);
    p->dst = calloc(m, sizeof *p->dst);
    p->backerr = calloc(m, sizeof *p->backerr);
    p->bl = calloc(m, 1);
    p->held = malloc(m * sizeof *p->held);
    p->cidx = malloc(m * sizeof *p->cidx);
    return p->regs && p->reuse && p->cand && p->dst && p->backerr && p->bl && p->held && p->cidx
               ? 0
               : -1;
}

/* Check the arguments and parse the base.  A base in a pool that no
 * longer exists shares nothing.  0, or -1 with the reason recorded. */
static int s_put_check(s_put_t *p, const char *base_ref, const uint8_t *dirty)
{
    ll_store_t *st = p->st;
    uint64_t base_pool = 0;
    if (base_ref && ll_store_ref_parse(base_ref, &base_pool, &p->bnb, &p->base, &p->bn) != 0)
        return ll_store_fail(st, LL_STORE_EINVAL, "base is not a payload ref: %.80s", base_ref);
    if (base_ref && base_pool != ll_pool_id(st->pool))
        p->bn = 0;
    if (p->n > ll_pool_nregions(st->pool))
        return ll_store_fail(st, LL_STORE_EFULL,
                             "payload pool full: a payload of %zu bytes is larger than the "
                             "whole pool (%zu bytes)",
                             p->len, ll_pool_nregions(st->pool) * LL_STORE_R);
    if (dirty && (!base_ref || p->bnb != p->len))
        return ll_store_fail(st, LL_STORE_EINVAL,
                             "dirty regions need a base payload of the same length");
    return 0;
}

/* Lease the base regions that could be shared: same index, same length.
 * One that was reclaimed meanwhile is simply written anew.  A region the
 * caller says is clean (DIRTY says so) is shared without hashing; the
 * others become candidates, to be compared by hash. */
static void s_put_lease_base(s_put_t *p, const uint8_t *dirty)
{
    for (size_t i = 0; i < p->n && i < p->bn; i++) {
        if (s_chunk(p->len, i) != s_chunk(p->bnb, i))
            continue;
        if (ll_pool_lease(p->pool, &p->base[i]) != 0)
            continue;
        p->bl[i] = 1;
        if (dirty && !dirty[i]) {
            p->reuse[i] = 1;
        } else {
            p->cand[i] = 1;
            p->cidx[p->ncand++] = i;
        }
    }
}

/* Hashing every candidate before copying the changed ones costs a second
 * pass over memory (~40% of a save when everything changed).  So hash a
 * few candidates spread over the payload first: when none of them is
 * unchanged, assume a rewrite and copy every candidate, hashing as it
 * copies, and share the (rare) region that turns out unchanged afterwards,
 * giving its fresh copy back (s_put_settle).  Otherwise hash first, copy
 * what changed.  Returns whether to copy first. */
static bool s_put_sample(s_put_t *p)
{
    if (p->ncand < S_SAMPLE_MIN)
        return false;
    size_t same = 0;
    for (size_t s = 0; s < S_SAMPLES; s++) {
        size_t i = p->cidx[s * p->ncand / S_SAMPLES];
        p->cand[i] = 0;
        if (ll_hash(p->src + i * LL_STORE_R, s_chunk(p->len, i)) == p->base[i].hash) {
            p->reuse[i] = 1;
            same++;
        } else {
            s_put_unlease_base(p, i);
        }
    }
    return same == 0;
}

/* Hash every remaining candidate; share the unchanged ones, give back the
 * leases of the others.  No candidate is left. */
static void s_put_hash_first(s_put_t *p)
{
    size_t to_hash = 0;
    for (size_t i = 0; i < p->n; i++)
        to_hash += p->cand[i] ? s_chunk(p->len, i) : 0;
    if (to_hash)
        s_parallel(p->n, to_hash, s_hash_cmp, p);
    for (size_t i = 0; i < p->n; i++) {
        if (p->cand[i] && !p->reuse[i])
            s_put_unlease_base(p, i);
        p->cand[i] = 0;
    }
}

/* Before allocating: reclaim when s_gc_first says so.  A failed
 * reclamation is logged and forgotten (the put goes on without it).
 * Starts an allocation round. */
static void s_put_gc_first(s_put_t *p)
{
    ll_store_t *st = p->st;
    p->tried_gc = false;
    size_t need = 0;
    for (size_t i = 0; i < p->n; i++)
        need += !p->reuse[i];
    if (need == 0 || !s_gc_first(need, ll_pool_free_backed(st->pool), ll_pool_gc_due(st->pool)))
        return;
    p->tried_gc = true;
    if (ll_store_gc_locked(st) < 0)
        ll_debug("store", "%s", st->err);
    st->err[0] = 0;
    st->errkind = LL_STORE_OK;
}

/* Regions of the put still to allocate from region I on. */
static size_t s_put_more(const s_put_t *p, size_t i)
{
    size_t more = 0;
    for (size_t j = i; j < p->n; j++)
        more += !p->reuse[j];
    return more;
}

/* The user's pools would hold more than the cap with the regions of this
 * put still to allocate (from I on): the error names the user, the cap and
 * its knob, what the put needs and what the user holds apart from it. */
static int s_put_quota_fail(s_put_t *p, size_t i)
{
    ll_store_t *st = p->st;
    size_t more = 0, mine = 0;
    for (size_t j = 0; j < p->n; j++) {
        more += !p->reuse[j];
        mine += j < i && !p->reuse[j];
    }
    int src;
    uint64_t cap = ll_quota_cap(st->quota, &src), held = ll_quota_held(st->quota);
    held = held > mine * LL_STORE_R ? held - mine * LL_STORE_R : 0;
    char user[64], bcap[32], blen[32], bmore[32], bheld[32];
    struct passwd pw, *res = NULL;
    char pwbuf[1024];
    if (getpwuid_r(geteuid(), &pw, pwbuf, sizeof pwbuf, &res) == 0 && res)
        snprintf(user, sizeof user, "%s", res->pw_name);
    else
        snprintf(user, sizeof user, "%d", (int) geteuid());
    return ll_store_fail(st, LL_STORE_EQUOTA,
                         "user %s may hold %s in the checkpoint store (%s); a payload of %s "
                         "needs %s more, %s held; delete variables or ask the administrator",
                         user, ll_quota_fmt_bytes(cap, bcap, sizeof bcap),
                         src == LL_QUOTA_SRC_ENV ? "LL_STORE_USER_CAP"
                                                 : "looseleaf hostd --store-cap",
                         ll_quota_fmt_bytes(p->len, blen, sizeof blen),
                         ll_quota_fmt_bytes(more * LL_STORE_R, bmore, sizeof bmore),
                         ll_quota_fmt_bytes(held, bheld, sizeof bheld));
}

#define S_ROOM_WAIT_MS 3000 /* a save at the cap waits this long for other pools' reserves */

/* The user's cap refused region I of this put: tell the user's pools
 * (ll_quota_press: their owners give back what they hold ahead of use and
 * drop the old versions their history keeps, on their idle threads, see
 * ll_store.c's s_idle) and wait up to S_ROOM_WAIT_MS for the room the rest
 * of the put needs.  Whether it came. */
static bool s_put_wait_room(s_put_t *p, size_t i)
{
    ll_store_t *st = p->st;
    uint64_t cap = ll_quota_cap(st->quota, NULL);
    uint64_t more = (uint64_t) s_put_more(p, i) * LL_STORE_R;
    if (cap == 0 || more > cap)
        return false;
    ll_quota_press(st->quota, more); /* (the other sessions' history gives way to it too) */
    ll_store_reserve_update(st);     /* (ours too) */
    ll_pool_trim(st->pool, 0);
    bool room = false;
    for (double until = ll_clock_ms() + S_ROOM_WAIT_MS; !room && ll_clock_ms() < until;) {
        room = ll_quota_held(st->quota) + more <= cap;
        if (!room)
            usleep(20000);
    }
    ll_quota_unpress(st->quota, more);
    return room;
}

/* Allocate every region to write; a full pool (or one over the user's
 * cap) first tries reclamation (once per round).  0; 1 when copying first found no room for the
 * unchanged regions too: everything taken is given back, copy_first is
 * off, and the caller hashes first and tries again; -1 with the reason
 * recorded. */
static int s_put_alloc(s_put_t *p)
{
    ll_store_t *st = p->st;
    for (size_t i = 0; i < p->n; i++) {
        if (p->reuse[i])
            continue;
        int kind;
        char err[512];
        while (ll_pool_alloc_unbacked(st->pool, &p->regs[i], &p->dst[i], &kind, err, sizeof err) !=
               0) {
            p->dst[i] = NULL;
            bool room = kind == LL_POOL_EFULL || kind == LL_POOL_EQUOTA;
            if (room && !p->tried_gc) {
                p->tried_gc = true;
                if (ll_store_gc_locked(st) > 0)
                    continue;
            }
            /* Old versions the history keeps give way to a save
             * (ll_history.c), the oldest first and only as many as the rest
             * of this put needs: what they held is reclaimed into this pool's
             * free regions, which the put then takes without counting them
             * against the user's cap again (they are counted while backed). */
            if (room && !p->tried_history) {
                p->tried_history = true;
                if (ll_history_relieve(st, s_put_more(p, i),
                                       kind == LL_POOL_EQUOTA ? "cap" : "pool") > 0 &&
                    ll_store_gc_locked(st) > 0)
                    continue;
            }
            if (room && p->copy_first) {
                for (size_t j = 0; j < i; j++)
                    s_put_free_new(p, j);
                p->nwritten = 0;
                p->copy_first = false;
                return 1;
            }
            if (kind == LL_POOL_EQUOTA && !p->waited && s_put_wait_room(p, i)) {
                p->waited = true;
                continue;
            }
            if (kind == LL_POOL_EQUOTA)
                return s_put_quota_fail(p, i);
            return ll_store_fail(st, kind == LL_POOL_EFULL ? LL_STORE_EFULL : LL_STORE_EIO,
                                 "%s (payload of %zu bytes)", err, p->len);
        }
        p->nwritten += s_chunk(p->len, i);
    }
    return 0;
}

/* After the copy: a region that could not be backed (no memory, no more
 * huge pages) makes the put fail as a full pool.  0 or -1. */
static int s_put_check_backing(s_put_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        if (!p->backerr[i])
            continue;
        bool huge = strcmp(ll_pool_page_kind(p->pool), "hugetlb") == 0;
        return ll_store_fail(
            p->st, LL_STORE_EFULL,
            "payload pool full: cannot back a 2 MiB region of the pool: %s "
            "(payload of %zu bytes)%s",
            strerror(p->backerr[i]), p->len,
            huge ? "; no more huge pages (HugePages_Free, vm.nr_overcommit_hugepages, free "
                   "memory)"
                 : "");
    }
    return 0;
}

/* After the copy: regions that could not be backed (the host's memory or the
 * pool's tmpfs ran out, while the pool still had regions) may be backed once
 * the history's old versions give their memory back, the oldest first, as
 * many as hold that many regions: dropped, reclaimed, and their memory
 * trimmed, then the copy into those regions is tried again.  Whatever is
 * still unbacked then fails the put (s_put_check_backing). */
static void s_put_retry_backing(s_put_t *p)
{
    ll_store_t *st = p->st;
    size_t failed = 0;
    for (size_t i = 0; i < p->n; i++)
        failed += p->backerr[i] != 0;
    if (!failed || p->tried_history)
        return;
    p->tried_history = true;
    if (ll_history_relieve(st, failed, "pool") <= 0 || ll_store_gc_locked(st) <= 0) {
        st->err[0] = 0;
        st->errkind = LL_STORE_OK;
        return;
    }
    ll_pool_trim(st->pool, 0); /* (what was reclaimed goes back to the host) */
    size_t bytes = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->backerr[i]) {
            p->backerr[i] = 0;
            s_copy_hash(p, i); /* (one thread: a few regions, the host short of memory) */
            bytes += s_chunk(p->len, i);
        }
    ll_debug("store", "put: backed %zu bytes again after the history gave way", bytes);
}

/* Copied first: a candidate whose fresh copy hashes as its base region is
 * shared after all, its copy given back.  Returns how many were. */
static size_t s_put_settle(s_put_t *p)
{
    size_t late_same = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!p->cand[i])
            continue;
        p->cand[i] = 0;
        if (p->regs[i].hash == p->base[i].hash) {
            s_put_free_new(p, i);
            p->nwritten -= s_chunk(p->len, i);
            p->reuse[i] = 1;
            late_same++;
        } else {
            s_put_unlease_base(p, i);
        }
    }
    return late_same;
}

/* The payload's ref (malloc'd, the caller's), held as pending with every
 * lease this put kept; or NULL (out of memory, nothing handed over). */
static char *s_put_finish(s_put_t *p)
{
    ll_store_t *st = p->st;
    for (size_t i = 0; i < p->n; i++) {
        if (p->reuse[i])
            p->regs[i] = p->base[i];
        p->held[i] = p->regs[i].idx;
    }
    char *ref = ll_store_ref_format(ll_pool_id(st->pool), p->len, p->regs, p->n);
    char *ref_copy = ref ? strdup(ref) : NULL;
    if (!ref_copy) {
        free(ref);
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        return NULL;
    }
    /* If this exact payload is already pending (same regions, all shared),
     * the new hold simply stacks on the old one. */
    ll_store_pending_add(st, ref_copy, p->held, p->n);
    p->held = NULL;
    p->done = true;
    st->puts++;
    st->bytes_written += p->nwritten;
    st->save_written += p->nwritten;
    st->bytes_shared += p->len - p->nwritten;
    return ref;
}

/* Free the put's tables; a put that failed first gives back every lease
 * it took and every fresh region it allocated (unwritten as far as any
 * commit knows). */
static void s_put_end(s_put_t *p)
{
    if (!p->done && p->bl && p->dst) {
        for (size_t i = 0; i < p->n; i++) {
            if (p->bl[i])
                ll_pool_unlease(p->pool, p->base[i].idx);
            s_put_free_new(p, i);
        }
    }
    free(p->held);
    free(p->cidx);
    free(p->bl);
    free(p->base);
    free(p->regs);
    free(p->reuse);
    free(p->cand);
    free(p->dst);
    free(p->backerr);
}

/* ---- put / discard / map ----------------------------------------------- */

char *ll_store_put(ll_store_t *st, const void *data, size_t len, const char *base_ref,
                   const uint8_t *dirty, size_t *written)
{
    if (ll_store_enter(st) != 0)
        return NULL;
    s_put_t p = {.src = data, .len = len, .pool = st->pool, .st = st};
    p.n = (len + LL_STORE_R - 1) / LL_STORE_R;
    char *ref = NULL;
    ll_pool_reserve_hold(st->pool, true); /* the copy gets the CPUs, not the reserve */
    if (s_put_init(&p) != 0) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    if (s_put_check(&p, base_ref, dirty) != 0)
        goto out;
    s_put_lease_base(&p, dirty);
    double ts0 = ll_clock_ms(), ts1, ts2, ts3;
    p.copy_first = s_put_sample(&p);
    for (;;) {
        if (!p.copy_first)
            s_put_hash_first(&p);
        ts1 = ll_clock_ms();
        s_put_gc_first(&p);
        int rc = s_put_alloc(&p);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
    }
    ts2 = ll_clock_ms();
    /* Fresh regions are backed inside the copy, region by region on each
     * copy thread (MADV_POPULATE_WRITE, then the copy while the region is
     * still in the TLB): on 4 KiB pages the faults, not the copy, dominate a
     * first save, and this spreads them over the threads instead of paying
     * them on this one before the copy starts. */
    if (p.nwritten)
        s_parallel(p.n, p.nwritten, s_copy_hash, &p);
    ts3 = ll_clock_ms();
    s_put_retry_backing(&p);
    if (s_put_check_backing(&p) != 0)
        goto out;
    size_t late_same = s_put_settle(&p);
    ll_debug("store",
             "put %zu bytes: compare %.2f ms (%s), allocate %.2f ms, copy %.2f ms "
             "(%zu bytes, %zu regions unchanged after all)",
             len, ts1 - ts0, p.copy_first ? "copy first" : "hash first", ts2 - ts1, ts3 - ts2,
             p.nwritten, late_same);
    ref = s_put_finish(&p);
    if (!ref)
        goto out;
    *written = p.nwritten;
    ll_store_fault("after_payload");
out:
    s_put_end(&p);
    if (ref && p.nwritten > st->largest_put) {
        st->largest_put = p.nwritten;
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

/* ---- a payload written in pieces ---------------------------------------- */

/* A put whose bytes come in pieces (ll_store.h, ll_store_writer_*): its
 * regions are allocated (and the base's leased) at the start, filled by
 * each write on the put's copy threads, compared with the base's and
 * settled at the finish, exactly as a put that copies first. */
struct ll_store_writer {
    s_put_t p;     /* the put */
    uint8_t *need; /* per region: 1 the caller must write it, 2 written, 0 shared with the base */
    size_t nneed;  /* regions still to write */
};

/* One write: the regions IDX[k] of the payload are at SRC + k * R. */
typedef struct {
    s_put_t *p;
    const size_t *idx;
    const char *src;
} s_piece_t;

static void s_copy_piece(void *ctx, size_t k)
{
    s_piece_t *c = ctx;
    s_put_t *p = c->p;
    size_t i = c->idx[k];
    int rc = ll_pool_back(p->pool, p->regs[i].idx);
    if (rc != 0) {
        p->backerr[i] = rc;
        return;
    }
    p->regs[i].hash = ll_hash_copy(p->dst[i], c->src + k * LL_STORE_R, s_chunk(p->len, i));
}

/* Free W's tables; regions its put has not handed over (a finish) are
 * given back. */
static void s_writer_free(ll_store_writer_t *w)
{
    s_put_end(&w->p);
    free(w->need);
    free(w);
}

ll_store_writer_t *ll_store_writer_begin(ll_store_t *st, size_t len, const char *base_ref,
                                         const uint8_t *dirty)
{
    if (ll_store_enter(st) != 0)
        return NULL;
    ll_store_writer_t *w = calloc(1, sizeof *w);
    if (!w) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    w->p = (s_put_t){.len = len, .pool = st->pool, .st = st};
    w->p.n = (len + LL_STORE_R - 1) / LL_STORE_R;
    w->need = calloc(w->p.n ? w->p.n : 1, 1);
    if (!w->need || s_put_init(&w->p) != 0) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto fail;
    }
    if (s_put_check(&w->p, base_ref, dirty) != 0)
        goto fail;
    s_put_lease_base(&w->p, dirty);
    s_put_gc_first(&w->p);
    if (s_put_alloc(&w->p) != 0)
        goto fail;
    for (size_t i = 0; i < w->p.n; i++)
        if (!w->p.reuse[i]) {
            w->need[i] = 1;
            w->nneed++;
        }
    goto out;
fail:
    s_writer_free(w);
    w = NULL;
out:
    ll_store_leave(st);
    return w;
}

size_t ll_store_writer_needed(const ll_store_writer_t *w, size_t *idx)
{
    size_t k = 0;
    for (size_t i = 0; i < w->p.n; i++)
        if (w->need[i] == 1) {
            if (idx)
                idx[k] = i;
            k++;
        }
    return k;
}

int ll_store_writer_write(ll_store_writer_t *w, const size_t *idx, size_t n, const void *src,
                          size_t srclen)
{
    ll_store_t *st = w->p.st;
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = -1;
    size_t k = 0, bytes = 0;
    for (; k < n; k++) {
        size_t i = idx[k];
        if (i >= w->p.n || w->need[i] != 1) {
            ll_store_fail(st, LL_STORE_EINVAL,
                          "region %zu is not one this payload still needs written", i);
            break;
        }
        if (k * LL_STORE_R + s_chunk(w->p.len, i) > srclen) {
            ll_store_fail(st, LL_STORE_EINVAL,
                          "a buffer of %zu bytes holds no region %zu at piece %zu", srclen, i, k);
            break;
        }
        w->need[i] = 2;
        bytes += s_chunk(w->p.len, i);
    }
    if (k < n) {
        while (k-- > 0)
            w->need[idx[k]] = 1; /* nothing written */
        goto out;
    }
    s_piece_t c = {&w->p, idx, src};
    ll_pool_reserve_hold(st->pool, true);
    s_parallel(n, bytes, s_copy_piece, &c);
    ll_pool_reserve_hold(st->pool, false);
    w->nneed -= n;
    rc = s_put_check_backing(&w->p);
out:
    ll_store_leave(st);
    return rc;
}

char *ll_store_writer_finish(ll_store_writer_t **w_p, size_t *written)
{
    ll_store_writer_t *w = *w_p;
    *w_p = NULL;
    ll_store_t *st = w->p.st;
    if (ll_store_enter(st) != 0) {
        free(w->need);
        free(w); /* another process's store: nothing of it to give back here */
        return NULL;
    }
    char *ref = NULL;
    if (w->nneed) {
        ll_store_fail(st, LL_STORE_EINVAL, "%zu region(s) of the payload were never written",
                      w->nneed);
        goto out;
    }
    if (s_put_check_backing(&w->p) != 0)
        goto out;
    size_t late_same = s_put_settle(&w->p);
    ref = s_put_finish(&w->p);
    if (!ref)
        goto out;
    *written = w->p.nwritten;
    ll_debug("store", "put %zu bytes in pieces: %zu copied, %zu regions unchanged after all",
             w->p.len, w->p.nwritten, late_same);
    ll_store_fault("after_payload");
out:
    s_writer_free(w);
    ll_store_leave(st);
    return ref;
}

void ll_store_writer_abort(ll_store_writer_t **w_p)
{
    ll_store_writer_t *w = *w_p;
    if (!w)
        return;
    *w_p = NULL;
    if (ll_store_enter(w->p.st) != 0) {
        free(w->need);
        free(w);
        return;
    }
    ll_store_t *st = w->p.st;
    s_writer_free(w);
    ll_store_leave(st);
}

/* ---- self-test: the put's decisions, scripted ----------------------- */

int ll_store_put_selftest(bool verbose)
{
    const size_t R = LL_STORE_R;
    /* Region lengths of a payload: full regions, then the tail. */
    if (s_chunk(2 * R + 100, 0) != R || s_chunk(2 * R + 100, 1) != R ||
        s_chunk(2 * R + 100, 2) != 100 || s_chunk(R, 0) != R)
        return 1;
    /* Reclaim before allocating, or not. */
    struct {
        size_t need, free_backed;
        bool due, want;
    } cases[] = {
        {0, 0, true, false},   /* nothing to allocate */
        {20, 0, true, true},   /* fresh memory, and garbage may exist */
        {20, 0, false, false}, /* nothing changed since the last reclamation */
        {20, 20, true, false}, /* reclaimed space covers it */
        {21, 20, true, true},  /* one region short */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bool got = s_gc_first(cases[c].need, cases[c].free_backed, cases[c].due);
        if (got != cases[c].want) {
            fprintf(stderr, "ll_store_put selftest: reclaim-first case %zu: got %d\n", c, got);
            return 1;
        }
    }
    if (verbose)
        printf("(%zu reclaim-first cases) ", sizeof cases / sizeof cases[0]);
    return 0;
}

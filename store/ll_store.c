/* ll_store: per-variable checkpoints in Redis plus the payload pool (see
 * ll_store.h).  Runs in the kernel, in workers and in tests, on whatever
 * thread calls it; one mutex serializes calls on a store.
 *
 * DESIGN
 * ------
 * Keys of session S (S is [A-Za-z0-9._-]+ so keys cannot collide):
 *   ll:S:seq         the newest commit number; every commit WATCHes it
 *   ll:S:ver         hash name -> version of every committed variable
 *   ll:S:v:NAME      hash ver, blob, prefs (JSON list), refs (JSON list), cell
 *   ll:S:prefs       hash name -> prefs of every variable that has payloads:
 *                    the one read reclamation needs (HVALS), kept by commits
 *   ll:S:c:N         the commit record of commit N: cell, token, writes, deletes
 *   ll:S:pool        "<path> <id>" of the session's payload pool
 * A commit is WATCH seq, GET seq (and the base versions), then one
 * MULTI ... EXEC that writes every entry, the version hash, seq and the
 * commit record: all of a cell or nothing, and a concurrent commit makes
 * EXEC fail and us retry.  Versions are commit numbers, so a name's version
 * only moves forward even across delete and re-create.  If the connection
 * breaks after EXEC was sent we cannot know whether it ran (Redis may even
 * run it after we reconnected): every later attempt first looks for the
 * commit record's random token at that commit number, so a cell lands
 * exactly once.  fetch reads all
 * names in one MULTI/EXEC, so a reader sees a cell's writes all or none.
 *
 * A payload ref names the pool regions of one payload and their XXH3
 * hashes: "P1/<pool id>/<nbytes>/<idx>.<gen>.<hash>,..." (hex); the pool id
 * keeps a ref from resolving in a pool recreated under the same name.  A
 * put writes new
 * regions (leased by this process until a commit lists the ref, so neither a
 * reclaimer nor a crash of another process can lose them), and with a base
 * shares each region whose hash is unchanged.  Refs in a commit are leased
 * while it runs: a ref whose region was reclaimed (its generation moved) is
 * refused instead of committed.  A crash of the saving process before EXEC
 * leaves only unreferenced regions, which reclamation frees once the dead
 * process's leases are dropped; committed data is untouched.
 *
 * Reclamation (ll_pool_gc) runs when an allocation finds the pool full, before
 * a put that would first-touch fresh regions (when that pays) and on request;
 * the regions committed versions use are read from ll:S:prefs.
 *
 * Copies and hashes of large payloads run on up to 4 threads: page faults
 * are paid at allocation (prefaulted regions, and a process reuses the ones
 * it already prefaulted first), so the copy runs at memcpy speed and a
 * second thread helps (MEASURED.md: 15 -> 28 GB/s); each 64 KiB piece is
 * hashed right after it is copied, while it is still in cache. */
#include "store/ll_store.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/ll_log.h"
#include "store/ll_hash.h"
#include "store/ll_pagekind.h"
#include "store/ll_redis.h"
#include "base/ll_clock.h"

#define S_R                   LL_POOL_REGION_BYTES
#define S_PENDING_BUCKETS     4096
#define S_PARALLEL_MIN        ((size_t) 32 << 20) /* below this one thread copies */
#define S_MAX_THREADS         4
#define S_COMMIT_RECORDS_KEPT 1000
#define S_SAMPLE_MIN          16 /* candidate regions: below this, always hash first */
#define S_SAMPLES             4  /* candidates hashed to choose copy-first */
#define S_GC_MIN_GAIN         8 /* regions: reclaim before a put when it may save this many faults */

/* An uncommitted payload this process holds (its regions leased). */
typedef struct s_pending {
    struct s_pending *next;
    char *ref;
    uint32_t *idx; /* one lease count per entry */
    size_t n;
} s_pending_t;

struct ll_store_t {
    pthread_mutex_t mu; /* serializes calls */
    pid_t pid;          /* the process that opened it */
    char *runtime_dir;
    char *session;
    char *prefix; /* "ll:<session>:" */
    ll_redis_t *redis;
    bool redis_owned; /* we started the private server */
    ll_pool_t *pool;
    s_pending_t *pending[S_PENDING_BUCKETS];
    size_t npending;
    char err[768]; /* last failure */
    int errkind;
    uint64_t bytes_written, bytes_shared, puts, commits, gc_runs, reclaimed;
    uint64_t gc_epoch;      /* commit epoch when this store last reclaimed */
    long long reserve_opt;  /* as ll_store_opts_t.reserve_bytes */
    size_t largest_put;     /* bytes the largest put wrote (default reserve policy) */
    size_t reserve_regions; /* what the pool's reserve was asked to keep */
    size_t gc_vars;         /* variables that reclamation read from Redis */
};

/* ---- small helpers -------------------------------------------------- */

static int s_fail(ll_store_t *st, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int s_fail(ll_store_t *st, int kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
    st->errkind = kind;
    return -1;
}

static int s_redis_fail(ll_store_t *st, const char *what)
{
    return s_fail(st, LL_STORE_EIO, "%s: %s", what, ll_redis_errstr(st->redis));
}

static bool s_fault_is(const char *step)
{
    const char *f = getenv("LL_STORE_FAULT");
    return f && strcmp(f, step) == 0;
}

/* Fault injection: SIGKILL ourselves when LL_STORE_FAULT names STEP. */
static void s_fault(const char *step)
{
    const char *f = getenv("LL_STORE_FAULT");
    if (f && strcmp(f, step) == 0) {
        ll_warn("store", "LL_STORE_FAULT=%s: killing this process", step);
        raise(SIGKILL);
    }
}

static char *s_key(ll_store_t *st, const char *a, const char *b)
{
    size_t n = strlen(st->prefix) + strlen(a) + (b ? strlen(b) : 0) + 1;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%s%s%s", st->prefix, a, b ? b : "");
    return k;
}

static uint64_t s_str_hash(const char *s)
{
    return XXH3_64bits(s, strlen(s));
}

static bool s_session_ok(const char *s)
{
    if (!*s || strlen(s) > 200)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* ---- payload refs --------------------------------------------------- */

/* Parse REF into its pool id, *NBYTES and a malloc'd region array.  0 or -1. */
static int s_ref_parse(const char *ref, uint64_t *pool_id, size_t *nbytes, ll_pool_region_t **regs,
                       size_t *nreg)
{
    *regs = NULL;
    *nreg = 0;
    if (strncmp(ref, "P1/", 3) != 0)
        return -1;
    const char *p = ref + 3;
    char *end;
    errno = 0;
    unsigned long long id = strtoull(p, &end, 16);
    if (errno || end == p || *end != '/' || id == 0)
        return -1;
    *pool_id = id;
    p = end + 1;
    errno = 0;
    unsigned long long nb = strtoull(p, &end, 16);
    if (errno || end == p || *end != '/')
        return -1;
    p = end + 1;
    size_t n = (size_t) ((nb + S_R - 1) / S_R);
    if (n > UINT32_MAX)
        return -1;
    ll_pool_region_t *r = malloc((n ? n : 1) * sizeof *r);
    if (!r)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned long long v[3];
        for (int k = 0; k < 3; k++) {
            if (*p < '0' || (*p > '9' && *p < 'a') || *p > 'f')
                goto bad;
            errno = 0;
            v[k] = strtoull(p, &end, 16);
            if (errno || end == p)
                goto bad;
            p = end;
            char want = k < 2 ? '.' : (i + 1 < n ? ',' : 0);
            if (*p != want)
                goto bad;
            if (want)
                p++;
        }
        if (v[0] > UINT32_MAX || v[1] == 0 || v[1] >= (UINT64_C(1) << 62))
            goto bad;
        r[i].idx = (uint32_t) v[0];
        r[i].gen = v[1];
        r[i].hash = v[2];
    }
    if (*p)
        goto bad;
    *nbytes = (size_t) nb;
    *regs = r;
    *nreg = n;
    return 0;
bad:
    free(r);
    return -1;
}

static char *s_ref_format(uint64_t pool_id, size_t nbytes, const ll_pool_region_t *regs, size_t n)
{
    size_t cap = 64 + n * 44;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    size_t len = (size_t) snprintf(s, cap, "P1/%llx/%zx/", (unsigned long long) pool_id, nbytes);
    for (size_t i = 0; i < n; i++)
        len += (size_t) snprintf(s + len, cap - len, "%s%x.%llx.%llx", i ? "," : "",
                                 (unsigned) regs[i].idx, (unsigned long long) regs[i].gen,
                                 (unsigned long long) regs[i].hash);
    return s;
}

long long ll_store_ref_nbytes(const char *ref)
{
    size_t nb, n;
    uint64_t id;
    ll_pool_region_t *r;
    if (!ref || s_ref_parse(ref, &id, &nb, &r, &n) != 0)
        return -1;
    free(r);
    return (long long) nb;
}

/* ---- pending (uncommitted) payloads ---------------------------------- */

static void s_pending_add(ll_store_t *st, char *ref_copy, uint32_t *idx, size_t n)
{
    s_pending_t *p = malloc(sizeof *p);
    if (!p) { /* keep the leases: they die with the process */
        free(ref_copy);
        free(idx);
        return;
    }
    size_t b = s_str_hash(ref_copy) % S_PENDING_BUCKETS;
    p->ref = ref_copy;
    p->idx = idx;
    p->n = n;
    p->next = st->pending[b];
    st->pending[b] = p;
    st->npending++;
}

/* Release the pending payload REF; false when there is none. */
static bool s_pending_release(ll_store_t *st, const char *ref)
{
    size_t b = s_str_hash(ref) % S_PENDING_BUCKETS;
    for (s_pending_t **pp = &st->pending[b]; *pp; pp = &(*pp)->next) {
        s_pending_t *p = *pp;
        if (strcmp(p->ref, ref) != 0)
            continue;
        *pp = p->next;
        for (size_t i = 0; i < p->n; i++)
            ll_pool_unlease(st->pool, p->idx[i]);
        free(p->ref);
        free(p->idx);
        free(p);
        st->npending--;
        return true;
    }
    return false;
}

static void s_pending_release_all(ll_store_t *st)
{
    for (size_t b = 0; b < S_PENDING_BUCKETS; b++)
        while (st->pending[b])
            s_pending_release(st, st->pending[b]->ref);
}

/* ---- open / close ----------------------------------------------------- */

static size_t s_default_pool_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t half = pages > 0 && psz > 0 ? (size_t) pages * (size_t) psz / 2 : (size_t) 4 << 30;
    size_t cap = (size_t) 16 << 30;
    return half < cap ? half : cap;
}

int ll_store_page_kind_choice(size_t pool_bytes, bool owner, char kind[16], char *why,
                              size_t whylen)
{
    ll_pagekind_host_t h;
    ll_pagekind_host_read(NULL, &h);
    if (pool_bytes == 0)
        pool_bytes = s_default_pool_bytes();
    ll_pagekind_choice_t c;
    if (ll_pagekind_choose(&h, pool_bytes, owner, getenv("LL_STORE_PAGE_KIND"), &c, why, whylen) !=
        0)
        return -1;
    snprintf(kind, 16, "%s", c.name);
    return 0;
}

/* Find or create the session's pool.  Redis records "<path> <id>" under
 * ll:S:pool so that every process of the session opens the same pool (a
 * memfd pool by its owner's /proc/<pid>/fd/<n>).  A recorded pool that is
 * gone (owner dead, file removed) is replaced, and since refs carry the pool
 * id, the old payloads then read as gone rather than as someone else's
 * bytes.  WANT is the caller's explicit pool_path (NULL for the default
 * DEFAULT_PATH).  0, or -1 with a reason in ERR. */
static int s_attach_pool(ll_store_t *st, const char *want, const char *default_path,
                         const char *fallback_path, size_t pool_bytes, char *err, size_t errlen)
{
    char *key = s_key(st, "pool", NULL);
    int rc = -1;
    if (!key) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int attempt = 0; attempt < 10 && rc != 0; attempt++) {
        ll_pool_t *pool = NULL;
        redisReply *r = ll_redis_cmdf(st->redis, "WATCH %s", key);
        if (r)
            freeReplyObject(r);
        unsigned long watched_on = ll_redis_reconnects(st->redis);
        r = r ? ll_redis_cmdf(st->redis, "GET %s", key) : NULL;
        if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)) {
            snprintf(err, errlen, "cannot read the session's pool from Redis: %s",
                     r && r->type == REDIS_REPLY_ERROR ? r->str : ll_redis_errstr(st->redis));
            if (r)
                freeReplyObject(r);
            break;
        }
        char rec_path[1024] = "";
        unsigned long long rec_id = 0;
        if (r->type == REDIS_REPLY_STRING && sscanf(r->str, "%1023s %llx", rec_path, &rec_id) != 2)
            rec_path[0] = 0;
        freeReplyObject(r);
        if (rec_path[0]) {
            if (want && strncmp(want, "memfd:", 6) != 0 && strcmp(want, rec_path) != 0) {
                snprintf(err, errlen, "session %s already uses pool %s, not %s", st->session,
                         rec_path, want);
                break;
            }
            char e2[512];
            pool = ll_pool_open(rec_path, pool_bytes, e2, sizeof e2);
            if (pool && ll_pool_id(pool) == rec_id) {
                st->pool = pool;
                rc = 0;
                break;
            }
            if (!pool && strncmp(rec_path, "/proc/", 6) != 0) {
                snprintf(err, errlen, "%s", e2);
                break;
            }
            ll_warn("store", "session %s: pool %s is gone (%s); payloads saved in it are lost",
                    st->session, rec_path, pool ? "recreated" : e2);
        }
        if (!pool) {
            const char *path = want ? want : default_path;
            if (!want && fallback_path && s_fault_is("hugetlb_fail"))
                snprintf(err, errlen,
                         "cannot reserve the header of pool %s: No space left on "
                         "device (LL_STORE_FAULT=hugetlb_fail)",
                         path);
            else
                pool = ll_pool_open(path, pool_bytes, err, errlen);
            /* Huge pages counted as available may still not come (memory
             * too fragmented for 2 MiB blocks, another pool took them first):
             * a pool on 4 KiB pages is slower, not wrong. */
            if (!pool && !want && fallback_path) {
                ll_warn("store", "session %s: no huge-page pool (%s); using 4 KiB pages in %s",
                        st->session, err, fallback_path);
                err[0] = 0;
                pool = ll_pool_open(fallback_path, pool_bytes, err, errlen);
            }
            if (!pool)
                break;
        }
        char value[1100];
        snprintf(value, sizeof value, "%s %llx", ll_pool_share_path(pool),
                 (unsigned long long) ll_pool_id(pool));
        redisReply *m = NULL;
        if (ll_redis_reconnects(st->redis) == watched_on) {
            ll_redis_argv_t a = {0};
            int bad = ll_redis_arg(&a, "MULTI") || ll_redis_send(st->redis, &a) ||
                      ll_redis_arg(&a, "SET") || ll_redis_arg(&a, key) || ll_redis_arg(&a, value) ||
                      ll_redis_send(st->redis, &a) || ll_redis_arg(&a, "EXEC") ||
                      ll_redis_send(st->redis, &a);
            ll_redis_argv_free(&a);
            if (!bad && ll_redis_drain(st->redis, 2) == 0)
                m = ll_redis_reply(st->redis);
            if (bad)
                ll_redis_reset(st->redis); /* drop a half-queued transaction */
        }
        if (m && m->type == REDIS_REPLY_ARRAY) {
            st->pool = pool;
            rc = 0;
        } else {
            ll_pool_destroy(&pool); /* another process recorded its pool first */
        }
        if (m)
            freeReplyObject(m);
    }
    if (rc != 0 && !err[0])
        snprintf(err, errlen, "cannot agree on the session's pool in Redis: %s",
                 ll_redis_errstr(st->redis));
    redisReply *u = ll_redis_connected(st->redis) ? ll_redis_cmdf(st->redis, "UNWATCH") : NULL;
    if (u)
        freeReplyObject(u);
    free(key);
    return rc;
}

/* Tell the pool's reserve how much free space to keep prefaulted, by the
 * store's reserve option (see ll_store.h). */
static void s_reserve_update(ll_store_t *st)
{
    size_t want = 0;
    if (st->reserve_opt > 0) {
        want = (size_t) st->reserve_opt;
    } else if (st->reserve_opt == LL_STORE_RESERVE_DEFAULT) {
        size_t cap = ll_pool_nregions(st->pool) * S_R / 2;
        if (cap > LL_STORE_RESERVE_MAX)
            cap = LL_STORE_RESERVE_MAX;
        want = st->largest_put;
        if (st->redis_owned && want < LL_STORE_RESERVE_OWNER_MIN)
            want = LL_STORE_RESERVE_OWNER_MIN;
        if (want > cap)
            want = cap;
    }
    size_t nreg = want / S_R + (want % S_R != 0);
    st->reserve_regions = nreg;
    ll_pool_reserve(st->pool, nreg); /* starts its thread only for nreg > 0 */
}

ll_store_t *ll_store_open(const char *runtime_dir, const char *session, const ll_store_opts_t *opts,
                          char *err, size_t errlen)
{
    ll_store_opts_t none = {0};
    if (!opts)
        opts = &none;
    if (!runtime_dir || !*runtime_dir) {
        snprintf(err, errlen, "runtime_dir is empty");
        return NULL;
    }
    if (!session || !s_session_ok(session)) {
        snprintf(err, errlen, "session id must be 1-200 characters of [A-Za-z0-9._-], not '%s'",
                 session ? session : "(null)");
        return NULL;
    }
    ll_store_t *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&st->mu, NULL);
    st->pid = getpid();
    st->runtime_dir = strdup(runtime_dir);
    st->session = strdup(session);
    size_t pl = strlen(session) + 8;
    st->prefix = malloc(pl);
    char *url = NULL, *pool_path = NULL, *fallback = NULL;
    if (!st->runtime_dir || !st->session || !st->prefix) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(st->prefix, pl, "ll:%s:", session);

    if (opts->redis_url && *opts->redis_url) {
        url = strdup(opts->redis_url);
    } else {
        char *sock = ll_redis_start(runtime_dir, &st->redis_owned, err, errlen);
        if (!sock)
            goto fail;
        size_t n = strlen(sock) + 8;
        url = malloc(n);
        if (url)
            snprintf(url, n, "unix://%s", sock);
        free(sock);
    }
    if (!url) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    st->redis = ll_redis_connect(url, err, errlen);
    if (!st->redis)
        goto fail;

    size_t pool_bytes = opts->pool_bytes ? opts->pool_bytes : s_default_pool_bytes();
    const char *want = opts->pool_path && *opts->pool_path ? opts->pool_path : NULL;
    ll_pagekind_host_t host;
    ll_pagekind_host_read(NULL, &host);
    char why[768];
    ll_pagekind_choice_t kind;
    ll_pagekind_choose(&host, pool_bytes, st->redis_owned, getenv("LL_STORE_PAGE_KIND"), &kind, why,
                       sizeof why);
    if (kind.place == LL_PAGEKIND_NONE && !kind.forced) {
        snprintf(err, errlen, "%s", why); /* a bad LL_STORE_PAGE_KIND */
        goto fail;
    }
    /* A forced kind this process cannot make matters only if it has to
     * make the pool (a worker opens the kernel's). */
    pool_path = kind.place == LL_PAGEKIND_NONE
                    ? strdup("")
                    : ll_pagekind_path(kind.place, &host, runtime_dir, session);
    fallback =
        kind.fallback ? ll_pagekind_path(LL_PAGEKIND_SHM_FILE, &host, runtime_dir, session) : NULL;
    if (!pool_path || (kind.fallback && !fallback)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    ll_debug("store", "session %s: a new pool would be %s", session, why);
    if (s_attach_pool(st, want, pool_path, fallback, pool_bytes, err, errlen) != 0) {
        if (kind.place == LL_PAGEKIND_NONE && strstr(err, "pool path is empty"))
            snprintf(err, errlen, "%s", why);
        goto fail;
    }
    st->reserve_opt = opts->reserve_bytes;
    s_reserve_update(st);
    free(url);
    free(pool_path);
    free(fallback);
    return st;
fail:
    free(url);
    free(pool_path);
    free(fallback);
    ll_store_destroy(&st);
    return NULL;
}

void ll_store_destroy(ll_store_t **store_p)
{
    if (!store_p || !*store_p)
        return;
    ll_store_t *st = *store_p;
    if (st->pool && getpid() == st->pid)
        s_pending_release_all(st);
    ll_pool_destroy(&st->pool);
    ll_redis_destroy(&st->redis);
    if (st->redis_owned && getpid() == st->pid) {
        char err[256];
        if (ll_redis_stop(st->runtime_dir, err, sizeof err) < 0)
            ll_warn("store", "%s", err);
    }
    free(st->runtime_dir);
    free(st->session);
    free(st->prefix);
    pthread_mutex_destroy(&st->mu);
    free(st);
    *store_p = NULL;
}

const char *ll_store_errstr(ll_store_t *st)
{
    return st->err;
}

int ll_store_errkind(ll_store_t *st)
{
    return st->errkind;
}

/* Lock and check the store is usable here.  0, or -1 (unlocked). */
static int s_enter(ll_store_t *st)
{
    pthread_mutex_lock(&st->mu);
    st->errkind = LL_STORE_OK;
    st->err[0] = 0;
    if (getpid() != st->pid) {
        s_fail(st, LL_STORE_EIO, "this store was opened by process %d; open a new one after fork",
               (int) st->pid);
        pthread_mutex_unlock(&st->mu);
        return -1;
    }
    if (st->pool)
        ll_pool_reserve_busy(st->pool); /* the reserve refills once we are idle */
    return 0;
}

static void s_leave(ll_store_t *st)
{
    pthread_mutex_unlock(&st->mu);
}

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
    size_t off = i * S_R;
    return len - off < S_R ? len - off : S_R;
}

static void s_hash_cmp(void *ctx, size_t i)
{
    s_put_t *p = ctx;
    if (!p->cand[i])
        return;
    uint64_t h = ll_hash(p->src + i * S_R, s_chunk(p->len, i));
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
    p->regs[i].hash = ll_hash_copy(p->dst[i], p->src + i * S_R, s_chunk(p->len, i));
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

static int s_gc_locked(ll_store_t *st);

char *ll_store_put(ll_store_t *st, const void *data, size_t len, const char *base_ref,
                   const uint8_t *dirty, size_t *written)
{
    if (s_enter(st) != 0)
        return NULL;
    size_t n = (len + S_R - 1) / S_R, bnb = 0, bn = 0, m = n ? n : 1;
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
        s_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    uint64_t base_pool = 0;
    if (base_ref && s_ref_parse(base_ref, &base_pool, &bnb, &base, &bn) != 0) {
        s_fail(st, LL_STORE_EINVAL, "base is not a payload ref: %.80s", base_ref);
        goto out;
    }
    if (base_ref && base_pool != ll_pool_id(st->pool))
        bn = 0; /* a base in a pool that no longer exists shares nothing */
    if (n > ll_pool_nregions(st->pool)) {
        s_fail(st, LL_STORE_EFULL,
               "payload pool full: a payload of %zu bytes is larger than the "
               "whole pool (%zu bytes)",
               len, ll_pool_nregions(st->pool) * S_R);
        goto out;
    }
    if (dirty && (!base_ref || bnb != len)) {
        s_fail(st, LL_STORE_EINVAL, "dirty regions need a base payload of the same length");
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
            if (ll_hash(p.src + i * S_R, s_chunk(len, i)) == base[i].hash) {
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
            if (s_gc_locked(st) < 0)
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
                if (s_gc_locked(st) > 0)
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
            s_fail(st, kind == LL_POOL_EFULL ? LL_STORE_EFULL : LL_STORE_EIO,
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
        s_fail(st, LL_STORE_EFULL,
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
    ref = s_ref_format(ll_pool_id(st->pool), len, p.regs, n);
    char *ref_copy = ref ? strdup(ref) : NULL;
    if (!ref_copy) {
        free(ref);
        ref = NULL;
        s_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    /* If this exact payload is already pending (same regions, all shared),
     * the new hold simply stacks on the old one. */
    s_pending_add(st, ref_copy, held, n);
    held = NULL;
    done = true;
    st->puts++;
    st->bytes_written += nwritten;
    st->bytes_shared += len - nwritten;
    *written = nwritten;
    s_fault("after_payload");
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
        s_reserve_update(st);
    }
    ll_pool_reserve_hold(st->pool, false);
    s_leave(st);
    return ref;
}

int ll_store_discard(ll_store_t *st, const char *ref)
{
    if (s_enter(st) != 0)
        return -1;
    int rc = s_pending_release(st, ref)
                 ? 0
                 : s_fail(st, LL_STORE_EINVAL, "payload ref is not pending in this process");
    s_leave(st);
    return rc;
}

ll_pool_map_t *ll_store_map(ll_store_t *st, const char *ref, bool writable)
{
    if (s_enter(st) != 0)
        return NULL;
    size_t nb, n;
    uint64_t pool_id;
    ll_pool_region_t *regs;
    ll_pool_map_t *map = NULL;
    if (s_ref_parse(ref, &pool_id, &nb, &regs, &n) != 0) {
        s_fail(st, LL_STORE_EINVAL, "not a payload ref: %.80s", ref);
        goto out;
    }
    if (pool_id != ll_pool_id(st->pool)) {
        free(regs);
        s_fail(st, LL_STORE_EGONE, "payload is in another pool (the session's pool was recreated)");
        goto out;
    }
    int kind;
    char err[512];
    map = ll_pool_map(st->pool, regs, n, nb, writable, &kind, err, sizeof err);
    if (!map)
        s_fail(st,
               kind == LL_POOL_EGONE    ? LL_STORE_EGONE
               : kind == LL_POOL_EINVAL ? LL_STORE_EINVAL
                                        : LL_STORE_EIO,
               "%s", err);
    free(regs);
out:
    s_leave(st);
    return map;
}

/* ---- JSON lists ---------------------------------------------------- */

static char *s_json_list(const char *const *items, size_t n)
{
    json_t *a = json_array();
    if (!a)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_string(items[i]);
        if (!s || json_array_append_new(a, s) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    char *out = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return out;
}

/* Parse a JSON list of strings into a malloc'd array.  0 or -1. */
static int s_json_parse_list(const char *text, size_t len, char ***items, size_t *n)
{
    *items = NULL;
    *n = 0;
    json_error_t e;
    json_t *a = json_loadb(text, len, 0, &e);
    if (!a || !json_is_array(a)) {
        json_decref(a);
        return -1;
    }
    size_t cnt = json_array_size(a);
    char **out = calloc(cnt ? cnt : 1, sizeof *out);
    if (!out) {
        json_decref(a);
        return -1;
    }
    for (size_t i = 0; i < cnt; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (!s || !(out[i] = strdup(s))) {
            for (size_t k = 0; k < i; k++)
                free(out[k]);
            free(out);
            json_decref(a);
            return -1;
        }
    }
    json_decref(a);
    *items = out;
    *n = cnt;
    return 0;
}

/* ---- commit ---------------------------------------------------------- */

int ll_store_commit(ll_store_t *st, const char *cell_id, const ll_store_write_t *writes,
                    size_t nwrites, const char *const *deletes, size_t ndeletes,
                    const ll_store_base_t *bases, size_t nbases, uint64_t *version)
{
    if (s_enter(st) != 0)
        return -1;
    int rc = -1;
    char **prefs_json = calloc(nwrites + 1, sizeof *prefs_json);
    char **refs_json = calloc(nwrites + 1, sizeof *refs_json);
    char **vkeys = calloc(nwrites + ndeletes + 1, sizeof *vkeys);
    uint32_t *leased = NULL;
    size_t nleased = 0, cap_leased = 0;
    ll_redis_argv_t a = {0};
    char *k_seq = s_key(st, "seq", NULL), *k_ver = s_key(st, "ver", NULL);
    char *k_prefs = s_key(st, "prefs", NULL);
    char *writes_json = NULL, *deletes_json = NULL;
    const char **names = calloc(nwrites + 1, sizeof *names);
    if (!prefs_json || !refs_json || !vkeys || !k_seq || !k_ver || !k_prefs || !names) {
        s_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    if (!cell_id)
        cell_id = "";
    /* Check the arguments and lease every region the commit will refer to,
     * so none can be reclaimed between here and EXEC. */
    for (size_t i = 0; i < nwrites; i++) {
        const ll_store_write_t *w = &writes[i];
        if (!w->name || !*w->name) {
            s_fail(st, LL_STORE_EINVAL, "empty variable name");
            goto out;
        }
        for (size_t j = 0; j < ndeletes; j++)
            if (strcmp(deletes[j], w->name) == 0) {
                s_fail(st, LL_STORE_EINVAL, "'%s' is both written and deleted", w->name);
                goto out;
            }
        for (size_t j = 0; j < i; j++)
            if (nwrites < 64 && strcmp(writes[j].name, w->name) == 0) {
                s_fail(st, LL_STORE_EINVAL, "'%s' is written twice", w->name);
                goto out;
            }
        for (size_t j = 0; j < w->nprefs; j++) {
            size_t nb, n;
            uint64_t pool_id;
            ll_pool_region_t *regs;
            if (s_ref_parse(w->prefs[j], &pool_id, &nb, &regs, &n) != 0) {
                s_fail(st, LL_STORE_EINVAL, "'%s': not a payload ref: %.80s", w->name, w->prefs[j]);
                goto out;
            }
            if (pool_id != ll_pool_id(st->pool)) {
                free(regs);
                s_fail(st, LL_STORE_EGONE,
                       "'%s': payload is in another pool (the session's pool was recreated)",
                       w->name);
                goto out;
            }
            if (nleased + n > cap_leased) {
                cap_leased = (nleased + n) * 2 + 16;
                uint32_t *l = realloc(leased, cap_leased * sizeof *l);
                if (!l) {
                    free(regs);
                    s_fail(st, LL_STORE_EIO, "out of memory");
                    goto out;
                }
                leased = l;
            }
            for (size_t k = 0; k < n; k++) {
                if (ll_pool_lease(st->pool, &regs[k]) != 0) {
                    s_fail(st, LL_STORE_EGONE,
                           "'%s': payload region %u was reclaimed; its version is gone "
                           "(re-save the payload)",
                           w->name, (unsigned) regs[k].idx);
                    free(regs);
                    goto out;
                }
                leased[nleased++] = regs[k].idx;
            }
            free(regs);
        }
        prefs_json[i] = s_json_list(w->prefs, w->nprefs);
        refs_json[i] = s_json_list(w->refs, w->nrefs);
        vkeys[i] = s_key(st, "v:", w->name);
        names[i] = w->name;
        if (!prefs_json[i] || !refs_json[i] || !vkeys[i]) {
            s_fail(st, LL_STORE_EINVAL, "'%s': names and refs must be valid UTF-8 text", w->name);
            goto out;
        }
    }
    for (size_t j = 0; j < ndeletes; j++) {
        if (!deletes[j] || !*deletes[j] || !(vkeys[nwrites + j] = s_key(st, "v:", deletes[j]))) {
            s_fail(st, LL_STORE_EINVAL, "bad name to delete");
            goto out;
        }
    }
    writes_json = s_json_list(names, nwrites);
    deletes_json = s_json_list(deletes, ndeletes);
    if (!writes_json || !deletes_json) {
        s_fail(st, LL_STORE_EINVAL, "names must be valid UTF-8 text");
        goto out;
    }
    unsigned char rnd[16];
    char token[40];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t) sizeof rnd)
        for (size_t i = 0; i < sizeof rnd; i++)
            rnd[i] = (unsigned char) (rand() ^ getpid());
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(token + 2 * i, 3, "%02x", rnd[i]);

    /* Commit numbers at which an EXEC of ours may have run although its
     * reply was lost with the connection.  Redis may even run it after we
     * reconnected, so every later attempt first looks for our token there. */
    uint64_t lost[8];
    int nlost = 0;
    bool landed = false;
    for (int attempt = 0;; attempt++) {
        if (attempt == 200) {
            s_fail(st, LL_STORE_EIO, "commit kept conflicting with other commits; gave up");
            goto out;
        }
        if (ll_redis_ensure(st->redis) != 0) {
            s_redis_fail(st, "commit failed");
            goto out;
        }
        for (int i = 0; i < nlost && !landed; i++) {
            char lbuf[32];
            snprintf(lbuf, sizeof lbuf, "%llu", (unsigned long long) lost[i]);
            char *k = s_key(st, "c:", lbuf);
            redisReply *t = k ? ll_redis_cmdf(st->redis, "HGET %s token", k) : NULL;
            if (t && t->type == REDIS_REPLY_STRING && strcmp(t->str, token) == 0) {
                landed = true;
                *version = lost[i];
                ll_info("store", "commit %llu ran although its reply was lost",
                        (unsigned long long) lost[i]);
            }
            if (t)
                freeReplyObject(t);
            free(k);
        }
        if (landed)
            break;
        redisReply *r = ll_redis_cmdf(st->redis, "WATCH %s", k_seq);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            if (r)
                freeReplyObject(r);
            s_redis_fail(st, "commit failed (WATCH)");
            goto out;
        }
        freeReplyObject(r);
        /* A reconnect after WATCH would silently drop it: start over. */
        unsigned long watched_on = ll_redis_reconnects(st->redis);
        r = ll_redis_cmdf(st->redis, "GET %s", k_seq);
        if (!r) {
            s_redis_fail(st, "commit failed (GET)");
            goto out;
        }
        uint64_t cur = ll_redis_u64(r);
        freeReplyObject(r);
        if (nbases > 0) {
            if (ll_redis_arg(&a, "HMGET") || ll_redis_arg(&a, k_ver))
                goto oom;
            for (size_t i = 0; i < nbases; i++)
                if (ll_redis_arg(&a, bases[i].name))
                    goto oom;
            r = ll_redis_cmd(st->redis, a.argc, a.argv, a.lens);
            a.argc = 0;
            if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != nbases) {
                if (r)
                    freeReplyObject(r);
                s_redis_fail(st, "commit failed (HMGET)");
                goto out;
            }
            for (size_t i = 0; i < nbases; i++) {
                uint64_t have = ll_redis_u64(r->element[i]);
                if (have != bases[i].version) {
                    s_fail(st, LL_STORE_ECONFLICT,
                           "'%s' is at version %llu, not %llu as the commit expected",
                           bases[i].name, (unsigned long long) have,
                           (unsigned long long) bases[i].version);
                    freeReplyObject(r);
                    r = ll_redis_cmdf(st->redis, "UNWATCH");
                    if (r)
                        freeReplyObject(r);
                    goto out;
                }
            }
            freeReplyObject(r);
        }
        if (ll_redis_reconnects(st->redis) != watched_on)
            continue;
        uint64_t next = cur + 1;
        char vbuf[32], oldc[64];
        snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long) next);
        char *k_commit = s_key(st, "c:", vbuf);
        char *k_old = NULL;
        if (next > S_COMMIT_RECORDS_KEPT) {
            snprintf(oldc, sizeof oldc, "%llu",
                     (unsigned long long) (next - S_COMMIT_RECORDS_KEPT));
            k_old = s_key(st, "c:", oldc);
        }
        if (!k_commit || (next > S_COMMIT_RECORDS_KEPT && !k_old)) {
            free(k_commit);
            free(k_old);
            goto oom;
        }
        /* The transaction, pipelined: nothing reaches Redis before EXEC is
         * queued except what hiredis flushes early (harmless: MULTI holds it). */
        int sent = 0, bad = 0;
        bad |= ll_redis_arg(&a, "MULTI") || ll_redis_send(st->redis, &a);
        sent++;
        for (size_t i = 0; i < nwrites && !bad; i++) {
            const ll_store_write_t *w = &writes[i];
            bad |= ll_redis_arg(&a, "DEL") || ll_redis_arg(&a, vkeys[i]) ||
                   ll_redis_send(st->redis, &a);
            bad |= ll_redis_arg(&a, "HSET") || ll_redis_arg(&a, vkeys[i]) ||
                   ll_redis_arg(&a, "ver") || ll_redis_arg(&a, vbuf) || ll_redis_arg(&a, "blob") ||
                   ll_redis_argn(&a, w->blob ? w->blob : "", w->blob ? w->bloblen : 0) ||
                   ll_redis_arg(&a, "prefs") || ll_redis_arg(&a, prefs_json[i]) ||
                   ll_redis_arg(&a, "refs") || ll_redis_arg(&a, refs_json[i]) ||
                   ll_redis_arg(&a, "cell") || ll_redis_arg(&a, cell_id) ||
                   ll_redis_send(st->redis, &a);
            sent += 2;
        }
        if (nwrites && !bad) {
            bad |= ll_redis_arg(&a, "HSET") || ll_redis_arg(&a, k_ver);
            for (size_t i = 0; i < nwrites && !bad; i++)
                bad |= ll_redis_arg(&a, writes[i].name) || ll_redis_arg(&a, vbuf);
            bad |= ll_redis_send(st->redis, &a);
            sent++;
            /* The payload index: what reclamation reads (one HVALS). */
            size_t with = 0;
            for (size_t i = 0; i < nwrites; i++)
                with += writes[i].nprefs > 0;
            if (with && !bad) {
                bad |= ll_redis_arg(&a, "HSET") || ll_redis_arg(&a, k_prefs);
                for (size_t i = 0; i < nwrites && !bad; i++)
                    if (writes[i].nprefs)
                        bad |= ll_redis_arg(&a, writes[i].name) || ll_redis_arg(&a, prefs_json[i]);
                bad |= ll_redis_send(st->redis, &a);
                sent++;
            }
            if (with < nwrites && !bad) {
                bad |= ll_redis_arg(&a, "HDEL") || ll_redis_arg(&a, k_prefs);
                for (size_t i = 0; i < nwrites && !bad; i++)
                    if (!writes[i].nprefs)
                        bad |= ll_redis_arg(&a, writes[i].name);
                bad |= ll_redis_send(st->redis, &a);
                sent++;
            }
        }
        if (ndeletes && !bad) {
            bad |= ll_redis_arg(&a, "DEL");
            for (size_t j = 0; j < ndeletes && !bad; j++)
                bad |= ll_redis_arg(&a, vkeys[nwrites + j]);
            bad |= ll_redis_send(st->redis, &a);
            bad |= ll_redis_arg(&a, "HDEL") || ll_redis_arg(&a, k_ver);
            for (size_t j = 0; j < ndeletes && !bad; j++)
                bad |= ll_redis_arg(&a, deletes[j]);
            bad |= ll_redis_send(st->redis, &a);
            bad |= ll_redis_arg(&a, "HDEL") || ll_redis_arg(&a, k_prefs);
            for (size_t j = 0; j < ndeletes && !bad; j++)
                bad |= ll_redis_arg(&a, deletes[j]);
            bad |= ll_redis_send(st->redis, &a);
            sent += 3;
        }
        bad |= ll_redis_arg(&a, "SET") || ll_redis_arg(&a, k_seq) || ll_redis_arg(&a, vbuf) ||
               ll_redis_send(st->redis, &a);
        bad |= ll_redis_arg(&a, "HSET") || ll_redis_arg(&a, k_commit) || ll_redis_arg(&a, "cell") ||
               ll_redis_arg(&a, cell_id) || ll_redis_arg(&a, "token") || ll_redis_arg(&a, token) ||
               ll_redis_arg(&a, "writes") || ll_redis_arg(&a, writes_json) ||
               ll_redis_arg(&a, "deletes") || ll_redis_arg(&a, deletes_json) ||
               ll_redis_send(st->redis, &a);
        sent += 2;
        if (k_old && !bad) {
            bad |=
                ll_redis_arg(&a, "DEL") || ll_redis_arg(&a, k_old) || ll_redis_send(st->redis, &a);
            sent++;
        }
        free(k_old);
        if (!bad)
            s_fault("before_commit");
        bad |= ll_redis_arg(&a, "EXEC") || ll_redis_send(st->redis, &a);
        a.argc = 0;
        if (!bad && s_fault_is("drop_after_exec"))
            ll_redis_fault_drop(st->redis);
        redisReply *exec = NULL;
        if (!bad && ll_redis_drain(st->redis, sent) == 0)
            exec = ll_redis_reply(st->redis);
        if (exec && s_fault_is("lose_exec_reply")) { /* it ran; pretend we never heard */
            freeReplyObject(exec);
            exec = NULL;
            ll_redis_reset(st->redis);
        }
        if (!exec) {
            /* The connection broke: did EXEC run?  The commit record says
             * (checked at the top of the next attempt). */
            free(k_commit);
            if (bad) {
                /* Nothing was sent, but half a transaction may sit in the
                 * output buffer: throw the connection away, then retry. */
                ll_redis_reset(st->redis);
                continue;
            }
            if (nlost == (int) (sizeof lost / sizeof lost[0])) {
                s_fail(st, LL_STORE_EIO, "commit failed: the connection to Redis keeps breaking");
                goto out;
            }
            lost[nlost++] = next;
            continue;
        }
        free(k_commit);
        if (exec->type == REDIS_REPLY_NIL) { /* another commit won the race */
            freeReplyObject(exec);
            continue;
        }
        if (exec->type != REDIS_REPLY_ARRAY) {
            s_fail(st, LL_STORE_EIO, "commit failed: Redis said %s",
                   exec->type == REDIS_REPLY_ERROR ? exec->str : "something unexpected");
            freeReplyObject(exec);
            goto out;
        }
        for (size_t i = 0; i < exec->elements; i++)
            if (exec->element[i]->type == REDIS_REPLY_ERROR) {
                /* MULTI/EXEC does not roll back; an error here means Redis
                 * refused a command (e.g. out of memory) */
                s_fail(st, LL_STORE_EIO, "commit failed inside the transaction: %s",
                       exec->element[i]->str);
                freeReplyObject(exec);
                goto out;
            }
        freeReplyObject(exec);
        *version = next;
        break;
    }
    s_fault("after_commit");
    st->commits++;
    /* Order matters (ll_pool.c DESIGN): epoch first, then drop leases. */
    ll_pool_commit_done(st->pool);
    for (size_t i = 0; i < nwrites; i++)
        for (size_t j = 0; j < writes[i].nprefs; j++)
            s_pending_release(st, writes[i].prefs[j]);
    rc = 0;
    goto out;
oom:
    s_fail(st, LL_STORE_EIO, "out of memory");
out:
    if (rc != 0 && st->redis && ll_redis_connected(st->redis)) {
        /* Leave no WATCH behind on a connection we reuse (a broken one
         * took its WATCH with it: no need to wait for a reconnect). */
        redisReply *r = ll_redis_cmdf(st->redis, "UNWATCH");
        if (r)
            freeReplyObject(r);
    }
    for (size_t i = 0; i < nleased; i++)
        ll_pool_unlease(st->pool, leased[i]);
    free(leased);
    for (size_t i = 0; i < nwrites + ndeletes && vkeys; i++)
        free(vkeys[i]);
    for (size_t i = 0; i < nwrites; i++) {
        if (prefs_json)
            free(prefs_json[i]);
        if (refs_json)
            free(refs_json[i]);
    }
    free(vkeys);
    free(prefs_json);
    free(refs_json);
    free(names);
    free(writes_json);
    free(deletes_json);
    ll_redis_argv_free(&a);
    free(k_seq);
    free(k_ver);
    free(k_prefs);
    s_leave(st);
    return rc;
}

/* ---- reads ---------------------------------------------------------- */

void ll_store_entries_free(ll_store_entry_t *e, size_t n)
{
    if (!e)
        return;
    for (size_t i = 0; i < n; i++) {
        free(e[i].name);
        free(e[i].blob);
        for (size_t k = 0; k < e[i].nprefs; k++)
            free(e[i].prefs[k]);
        free(e[i].prefs);
        for (size_t k = 0; k < e[i].nrefs; k++)
            free(e[i].refs[k]);
        free(e[i].refs);
    }
    free(e);
}

/* One atomic read of NAMES: the EXEC reply (array of HMGET arrays). */
static redisReply *s_fetch_raw(ll_store_t *st, const char *const *names, size_t n)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (ll_redis_ensure(st->redis) != 0)
            return NULL;
        ll_redis_argv_t a = {0};
        int bad = ll_redis_arg(&a, "MULTI") || ll_redis_send(st->redis, &a);
        for (size_t i = 0; i < n && !bad; i++) {
            char *k = s_key(st, "v:", names[i]);
            bad |= !k || ll_redis_arg(&a, "HMGET") || ll_redis_arg(&a, k) ||
                   ll_redis_arg(&a, "ver") || ll_redis_arg(&a, "blob") ||
                   ll_redis_arg(&a, "prefs") || ll_redis_arg(&a, "refs") ||
                   ll_redis_send(st->redis, &a);
            free(k);
        }
        bad |= ll_redis_arg(&a, "EXEC") || ll_redis_send(st->redis, &a);
        ll_redis_argv_free(&a);
        redisReply *exec = NULL;
        if (!bad && ll_redis_drain(st->redis, (int) n + 1) == 0)
            exec = ll_redis_reply(st->redis);
        if (exec)
            return exec;
        if (bad)
            ll_redis_reset(st->redis); /* drop a half-queued transaction */
    }
    return NULL;
}

int ll_store_fetch(ll_store_t *st, const char *const *names, size_t nnames,
                   ll_store_entry_t **entries, size_t *nentries)
{
    *entries = NULL;
    *nentries = 0;
    if (s_enter(st) != 0)
        return -1;
    int rc = -1;
    ll_store_entry_t *out = calloc(nnames ? nnames : 1, sizeof *out);
    size_t nout = 0;
    redisReply *exec = NULL;
    if (!out) {
        s_fail(st, LL_STORE_EIO, "out of memory");
        goto done;
    }
    if (nnames == 0) {
        rc = 0;
        goto done;
    }
    exec = s_fetch_raw(st, names, nnames);
    if (!exec) {
        s_redis_fail(st, "fetch failed");
        goto done;
    }
    if (exec->type != REDIS_REPLY_ARRAY || exec->elements != nnames) {
        s_fail(st, LL_STORE_EIO, "fetch failed: Redis said %s",
               exec->type == REDIS_REPLY_ERROR ? exec->str : "something unexpected");
        goto done;
    }
    for (size_t i = 0; i < nnames; i++) {
        redisReply *e = exec->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 4 ||
            e->element[0]->type != REDIS_REPLY_STRING)
            continue; /* not committed */
        ll_store_entry_t *o = &out[nout];
        o->version = ll_redis_u64(e->element[0]);
        o->name = strdup(names[i]);
        redisReply *b = e->element[1], *pr = e->element[2], *rf = e->element[3];
        if (b->type != REDIS_REPLY_STRING || pr->type != REDIS_REPLY_STRING ||
            rf->type != REDIS_REPLY_STRING || !o->name) {
            nout++;
            s_fail(st, LL_STORE_EIO, "entry '%s' is damaged in Redis", names[i]);
            goto done;
        }
        o->blob = malloc(b->len ? b->len : 1);
        if (o->blob)
            memcpy(o->blob, b->str, b->len);
        o->bloblen = b->len;
        nout++;
        if (!o->blob || s_json_parse_list(pr->str, pr->len, &o->prefs, &o->nprefs) != 0 ||
            s_json_parse_list(rf->str, rf->len, &o->refs, &o->nrefs) != 0) {
            s_fail(st, LL_STORE_EIO, "entry '%s' is damaged in Redis", names[i]);
            goto done;
        }
    }
    rc = 0;
done:
    if (exec)
        freeReplyObject(exec);
    if (rc == 0) {
        *entries = out;
        *nentries = nout;
    } else {
        ll_store_entries_free(out, nout);
    }
    s_leave(st);
    return rc;
}

int ll_store_versions(ll_store_t *st, char ***names, uint64_t **versions, size_t *n)
{
    *names = NULL;
    *versions = NULL;
    *n = 0;
    if (s_enter(st) != 0)
        return -1;
    int rc = -1;
    char *k = s_key(st, "ver", NULL);
    redisReply *r = k ? ll_redis_cmdf(st->redis, "HGETALL %s", k) : NULL;
    free(k);
    if (!r) {
        s_redis_fail(st, "versions failed");
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2) {
        s_fail(st, LL_STORE_EIO, "versions failed: Redis said %s",
               r->type == REDIS_REPLY_ERROR ? r->str : "something unexpected");
        goto out;
    }
    size_t m = r->elements / 2;
    *names = calloc(m ? m : 1, sizeof **names);
    *versions = calloc(m ? m : 1, sizeof **versions);
    if (!*names || !*versions) {
        s_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m; i++) {
        (*names)[i] = strndup(r->element[2 * i]->str, r->element[2 * i]->len);
        (*versions)[i] = ll_redis_u64(r->element[2 * i + 1]);
        *n = i + 1;
        if (!(*names)[i]) {
            s_fail(st, LL_STORE_EIO, "out of memory");
            goto out;
        }
    }
    rc = 0;
out:
    if (r)
        freeReplyObject(r);
    if (rc != 0) {
        for (size_t i = 0; i < *n; i++)
            free((*names)[i]);
        free(*names);
        free(*versions);
        *names = NULL;
        *versions = NULL;
        *n = 0;
    }
    s_leave(st);
    return rc;
}

int ll_store_last_commit(ll_store_t *st, uint64_t *version, char **cell_id)
{
    *version = 0;
    *cell_id = NULL;
    if (s_enter(st) != 0)
        return -1;
    int rc = -1;
    char *k = s_key(st, "seq", NULL);
    redisReply *r = k ? ll_redis_cmdf(st->redis, "GET %s", k) : NULL;
    free(k);
    if (!r) {
        s_redis_fail(st, "last_commit failed");
        goto out;
    }
    *version = ll_redis_u64(r);
    freeReplyObject(r);
    if (*version) {
        char vbuf[32];
        snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long) *version);
        k = s_key(st, "c:", vbuf);
        r = k ? ll_redis_cmdf(st->redis, "HGET %s cell", k) : NULL;
        free(k);
        if (!r) {
            s_redis_fail(st, "last_commit failed");
            goto out;
        }
        if (r->type == REDIS_REPLY_STRING)
            *cell_id = strndup(r->str, r->len);
        freeReplyObject(r);
    }
    rc = 0;
out:
    s_leave(st);
    return rc;
}

/* ---- reclamation ----------------------------------------------------- */

/* ll_pool_refs_fn: mark the regions every committed entry refers to. */
static int s_mark_refs(void *ctx, uint64_t *mark, size_t nregions)
{
    ll_store_t *st = ctx;
    char *k = s_key(st, "prefs", NULL);
    redisReply *vals = k ? ll_redis_cmdf(st->redis, "HVALS %s", k) : NULL;
    free(k);
    if (!vals || vals->type != REDIS_REPLY_ARRAY) {
        if (vals)
            freeReplyObject(vals);
        return -1;
    }
    st->gc_vars = vals->elements;
    for (size_t i = 0; i < vals->elements; i++) {
        redisReply *r = vals->element[i];
        char **prefs;
        size_t np;
        if (r->type != REDIS_REPLY_STRING || s_json_parse_list(r->str, r->len, &prefs, &np) != 0)
            continue;
        for (size_t j = 0; j < np; j++) {
            size_t nb, n;
            uint64_t pool_id;
            ll_pool_region_t *regs;
            if (s_ref_parse(prefs[j], &pool_id, &nb, &regs, &n) == 0) {
                for (size_t q = 0; q < n && pool_id == ll_pool_id(st->pool); q++)
                    if (regs[q].idx < nregions)
                        mark[regs[q].idx] = regs[q].gen;
                free(regs);
            }
            free(prefs[j]);
        }
        free(prefs);
    }
    freeReplyObject(vals);
    return 0;
}

static int s_gc_locked(ll_store_t *st)
{
    char err[256];
    if (ll_redis_ensure(st->redis) != 0)
        return s_redis_fail(st, "reclamation failed");
    uint64_t epoch = ll_pool_epoch(st->pool);
    int freed = ll_pool_gc(st->pool, s_mark_refs, st, err, sizeof err);
    st->gc_epoch = epoch;
    st->gc_runs++;
    if (freed < 0)
        return s_fail(st, LL_STORE_EIO, "reclamation failed: %s (%s)", err,
                      ll_redis_errstr(st->redis));
    st->reclaimed += (uint64_t) freed;
    return freed;
}

int ll_store_set_reserve(ll_store_t *st, long long nbytes)
{
    if (s_enter(st) != 0)
        return -1;
    st->reserve_opt = nbytes;
    s_reserve_update(st);
    s_leave(st);
    return 0;
}

long long ll_store_prefault(ll_store_t *st, size_t nbytes)
{
    if (s_enter(st) != 0)
        return -1;
    size_t n = ll_pool_prefault(st->pool, (nbytes + S_R - 1) / S_R);
    s_leave(st);
    return (long long) (n * S_R);
}

int ll_store_gc(ll_store_t *st)
{
    if (s_enter(st) != 0)
        return -1;
    int rc = s_gc_locked(st);
    s_leave(st);
    return rc;
}

int ll_store_delete_session(ll_store_t *st)
{
    if (s_enter(st) != 0)
        return -1;
    int rc = -1;
    /* Session ids are [A-Za-z0-9._-]: nothing to escape in the pattern. */
    char *pattern = s_key(st, "*", NULL);
    char cursor[32] = "0";
    if (!pattern) {
        s_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    do {
        redisReply *r = ll_redis_cmdf(st->redis, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            if (r)
                freeReplyObject(r);
            s_redis_fail(st, "delete_session failed");
            goto out;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        if (keys->elements > 0) {
            ll_redis_argv_t a = {0};
            int bad = ll_redis_arg(&a, "UNLINK");
            for (size_t i = 0; i < keys->elements && !bad; i++)
                bad |= ll_redis_argn(&a, keys->element[i]->str, keys->element[i]->len);
            redisReply *d = bad ? NULL : ll_redis_cmd(st->redis, a.argc, a.argv, a.lens);
            ll_redis_argv_free(&a);
            if (!d) {
                freeReplyObject(r);
                s_redis_fail(st, "delete_session failed");
                goto out;
            }
            freeReplyObject(d);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    s_pending_release_all(st);
    if (ll_pool_unlink(st->pool) != 0) {
        s_fail(st, LL_STORE_EIO, "cannot remove the pool file: %s", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    free(pattern);
    s_leave(st);
    return rc;
}

void ll_store_stats(ll_store_t *st, ll_store_stats_t *out)
{
    pthread_mutex_lock(&st->mu);
    memset(out, 0, sizeof *out);
    ll_pool_stats(st->pool, &out->pool);
    out->bytes_written = st->bytes_written;
    out->bytes_shared = st->bytes_shared;
    out->puts = st->puts;
    out->commits = st->commits;
    out->gc_runs = st->gc_runs;
    out->regions_reclaimed = st->reclaimed;
    out->redis_reconnects = ll_redis_reconnects(st->redis);
    out->pending = st->npending;
    out->redis_url = ll_redis_url(st->redis);
    out->redis_owned = st->redis_owned;
    pthread_mutex_unlock(&st->mu);
}

/* ---- self-test (starts its own redis-server) ------------------------- */

#define S_CHECK(cond)                                                                         \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "ll_store selftest: %s:%d: %s failed (%s)\n", __FILE__, __LINE__, \
                    #cond, st ? st->err : "");                                                \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)

int ll_store_selftest(bool verbose)
{
    char dir[] = "/tmp/ll-store-selftest-XXXXXX", err[512];
    ll_store_t *st = NULL;
    ll_store_entry_t *e = NULL;
    size_t ne = 0;
    char *ref1 = NULL, *ref2 = NULL;
    ll_pool_map_t *map = NULL;
    int rc = 1;
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ll_store selftest: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char pool_path[128];
    snprintf(pool_path, sizeof pool_path, "/dev/shm/ll-store-selftest-%d.pool", (int) getpid());
    ll_store_opts_t opts = {.pool_bytes = 8 * S_R, .pool_path = pool_path};
    st = ll_store_open(dir, "bad session!", &opts, err, sizeof err);
    S_CHECK(!st && strstr(err, "session id"));
    st = ll_store_open(dir, "selftest", &opts, err, sizeof err);
    if (!st)
        fprintf(stderr, "ll_store selftest: open: %s\n", err);
    S_CHECK(st);
    S_CHECK(st->redis_owned);
    /* A 3-region payload, then the same with one byte changed in region 1. */
    size_t len = 2 * S_R + 100, written;
    char *buf = malloc(len);
    S_CHECK(buf);
    for (size_t i = 0; i < len; i++)
        buf[i] = (char) (i * 7);
    ref1 = ll_store_put(st, buf, len, NULL, NULL, &written);
    S_CHECK(ref1 && written == len && ll_store_ref_nbytes(ref1) == (long long) len);
    buf[S_R + 5] ^= 1;
    ref2 = ll_store_put(st, buf, len, ref1, NULL, &written);
    S_CHECK(ref2 && written == S_R);
    S_CHECK(ll_store_put(st, buf, len, "P1/zz", NULL, &written) == NULL &&
            st->errkind == LL_STORE_EINVAL);
    const char *prefs[] = {ref2};
    const char *refs[] = {"y"};
    ll_store_write_t w[2] = {
        {.name = "x",
         .blob = "blob-x",
         .bloblen = 6,
         .prefs = prefs,
         .nprefs = 1,
         .refs = refs,
         .nrefs = 1},
        {.name = "y", .blob = "", .bloblen = 0},
    };
    uint64_t v1 = 0, v2 = 0;
    S_CHECK(ll_store_commit(st, "cell-1", w, 2, NULL, 0, NULL, 0, &v1) == 0 && v1 == 1);
    S_CHECK(ll_store_discard(st, ref1) == 0); /* never committed */
    /* A stale base version is a conflict and writes nothing. */
    ll_store_base_t stale = {"x", 0};
    S_CHECK(ll_store_commit(st, "cell-2", w, 1, NULL, 0, &stale, 1, &v2) == -1 &&
            st->errkind == LL_STORE_ECONFLICT);
    const char *del[] = {"y"};
    ll_store_base_t ok = {"x", v1};
    S_CHECK(ll_store_commit(st, "cell-2", w, 1, del, 1, &ok, 1, &v2) == 0 && v2 == 2);
    const char *names[] = {"x", "y", "nope"};
    S_CHECK(ll_store_fetch(st, names, 3, &e, &ne) == 0 && ne == 1);
    S_CHECK(strcmp(e[0].name, "x") == 0 && e[0].version == 2 && e[0].bloblen == 6 &&
            memcmp(e[0].blob, "blob-x", 6) == 0 && e[0].nprefs == 1 &&
            strcmp(e[0].prefs[0], ref2) == 0 && e[0].nrefs == 1 && strcmp(e[0].refs[0], "y") == 0);
    map = ll_store_map(st, e[0].prefs[0], false);
    S_CHECK(map && ll_pool_map_len(map) == len && memcmp(ll_pool_map_addr(map), buf, len) == 0);
    ll_pool_unmap(&map);
    /* ref1's own region 1 is garbage now; reclamation finds exactly it. */
    S_CHECK(ll_store_gc(st) == 1);
    uint64_t lv;
    char *cell;
    S_CHECK(ll_store_last_commit(st, &lv, &cell) == 0 && lv == 2 && cell &&
            strcmp(cell, "cell-2") == 0);
    free(cell);
    S_CHECK(ll_store_delete_session(st) == 0);
    free(buf);
    if (verbose)
        printf("(redis in %s) ", dir);
    rc = 0;
fail:
    ll_store_entries_free(e, ne);
    ll_pool_unmap(&map);
    free(ref1);
    free(ref2);
    ll_store_destroy(&st); /* stops the redis-server it started */
    unlink(pool_path);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "ll_store selftest: could not remove %s\n", dir);
    return rc;
}

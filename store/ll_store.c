/* ll_store: per-variable checkpoints in Redis plus the payload pool (see
 * ll_store.h): opening a session's store (Redis, the pool), closing it,
 * reclamation and the store's own bookkeeping.
 * Runs in the kernel, in workers and in tests, on whatever thread calls it;
 * one mutex serializes calls on a store.
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
 * A cell's variables are committed atomically and read back whole
 * (ll_store_commit.c); their payloads are written to the pool first, held
 * by this process until a commit lists them (ll_store_put.c), and named by
 * payload refs (ll_store_ref.c).  A crash of the saving process before
 * EXEC leaves only unreferenced regions, which reclamation frees once the
 * dead process's leases are dropped; committed data is untouched.
 *
 * Reclamation (ll_pool_gc; the rule of when a version may go is at the top
 * of ll_pool_reclaim.c) runs as soon as something may have become garbage:
 * in the session's owner (the kernel) on its pool's reserve thread once the
 * store is idle (s_idle: after any process's commit or a reader letting go
 * of a version), before a put that would otherwise take fresh memory, when
 * an allocation finds the pool full, and on request; the regions committed
 * versions use are read from ll:S:prefs.  The owner then gives back the
 * memory of free space beyond its reserve (ll_pool_trim).
 *
 * Files, lowest first (each uses only those before it): payload refs,
 * ll_store_ref.c; a call's frame (errors, keys, the lock), ll_store_call.c;
 * kept versions, ll_history.c; this one; ll_store_put.c; ll_store_commit.c; the
 * end-to-end self-test, ll_store_selftest.c.  What they share,
 * ll_store_internal.h; the page kind of a new pool, ll_pagekind.c; the
 * pool itself, ll_pool.c; Redis, ll_redis.c. */
#include "store/ll_store.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_history.h"
#include "store/ll_pagekind.h"
#include "store/ll_redis.h"
#include "store/ll_store_internal.h"

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

/* ---- open / close ----------------------------------------------------- */

int ll_store_parse_bytes(const char *text, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *text == '-')
        return -1;
    int shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    case 't':
    case 'T':
        shift = 40;
        end++;
        break;
    }
    if (shift && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end || (shift && v > (~0ULL >> shift)))
        return -1;
    *out = (size_t) (v << shift);
    return 0;
}

/* The pool's size when the caller gives none: LL_STORE_POOL_BYTES, else
 * half of RAM, at most 16 GiB (a bad LL_STORE_POOL_BYTES: the default;
 * ll_store_open refuses it). */
static size_t s_default_pool_bytes(void)
{
    const char *knob = getenv("LL_STORE_POOL_BYTES");
    size_t n;
    if (knob && *knob && ll_store_parse_bytes(knob, &n) == 0 && n >= 2 * LL_STORE_R)
        return n;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t half = pages > 0 && psz > 0 ? (size_t) pages * (size_t) psz / 2 : (size_t) 4 << 30;
    size_t cap = (size_t) 16 << 30;
    return half < cap ? half : cap;
}

/* The size of a new pool of this store into *OUT: the caller's (OPTS),
 * else LL_STORE_POOL_BYTES, else the default.  Returns whether it is the
 * default (s_fit_pool_bytes may shrink it), or -1 with the reason (a bad
 * LL_STORE_POOL_BYTES) in ERR. */
static int s_pool_bytes(const ll_store_opts_t *opts, size_t *out, char *err, size_t errlen)
{
    const char *knob = getenv("LL_STORE_POOL_BYTES");
    size_t n = 0;
    if (opts->pool_bytes) {
        *out = opts->pool_bytes;
        return 0;
    }
    if (knob && *knob) {
        if (ll_store_parse_bytes(knob, &n) != 0 || n < 2 * LL_STORE_R) {
            snprintf(err, errlen,
                     "LL_STORE_POOL_BYTES must be a size of at least 4M, such as 64G or 512M, "
                     "not '%.40s'",
                     knob);
            return -1;
        }
        *out = n;
        return 0;
    }
    *out = s_default_pool_bytes();
    return 1;
}

/* The session's new pool file at PATH (the store chose the place) against
 * the room its file system has free.  The file is sparse: one that does not
 * fit is made all the same, and saves fail later, when backing a region
 * finds no room (a container's /dev/shm is often 64 MiB).  A size given
 * (DEFAULTED false: pool_bytes, LL_STORE_POOL_BYTES) that does not fit is
 * an error now; the default shrinks to 90% of what is free (a warning),
 * unless that is under 16 MiB (the error).  0, or -1 with the reason. */
static int s_fit_pool_bytes(const char *path, bool defaulted, size_t *pool_bytes, char *err,
                            size_t errlen)
{
    char dir[1024];
    struct statvfs sv;
    struct stat st;
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (!slash || slash == path || (size_t) (slash - path) >= sizeof dir || stat(path, &st) == 0)
        return 0; /* a memfd, or a pool file that exists already */
    snprintf(dir, sizeof dir, "%.*s", (int) (slash - path), path);
    if (statvfs(dir, &sv) != 0 || sv.f_blocks == 0)
        return 0; /* no limit known */
    unsigned long long avail = (unsigned long long) sv.f_bavail * sv.f_frsize;
    unsigned long long need = (unsigned long long) *pool_bytes + LL_STORE_R; /* and its header */
    if (need <= avail)
        return 0;
    size_t fit = (size_t) (avail / 10 * 9);
    fit -= fit % LL_STORE_R;
    if (defaulted && fit >= 8 * LL_STORE_R) {
        ll_warn("store",
                "payload pool sized to %zu MiB: %s has %llu MiB free (LL_STORE_POOL_BYTES "
                "sets the size)",
                fit >> 20, dir, avail >> 20);
        *pool_bytes = fit;
        return 0;
    }
    snprintf(err, errlen,
             "payload pool %s: %llu MiB do not fit in %s (%llu MiB free of %llu MiB): set "
             "LL_STORE_POOL_BYTES to at most %zuM, or give it more room (a container's /dev/shm: "
             "docker run --shm-size=32g)",
             path, need >> 20, dir, avail >> 20,
             (unsigned long long) sv.f_blocks * sv.f_frsize >> 20, fit >> 20);
    return -1;
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
    char *key = ll_store_key(st, "pool", NULL);
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
            /* A worker on another host than the kernel's (cluster mode: its
             * host's agent sets LL_STORE_FOREIGN_HOST) never makes the
             * session's pool anew: the recorded one is the kernel's, alive
             * on its own host, and replacing the record would cut the
             * kernel off its payloads.  Until payloads move between hosts
             * (README "Cluster mode"), such a worker can use the session's
             * store only where it reaches the kernel's pool. */
            const char *foreign = getenv("LL_STORE_FOREIGN_HOST");
            if (foreign && *foreign) {
                snprintf(err, errlen,
                         "the payload pool of session %s (%s) is not reachable from GPU host %s "
                         "(%s): moving payloads between hosts is not done yet",
                         st->session, rec_path, foreign, pool ? "another pool is there now" : e2);
                if (pool)
                    ll_pool_destroy(&pool);
                break;
            }
            ll_warn("store", "session %s: pool %s is gone (%s); payloads saved in it are lost",
                    st->session, rec_path, pool ? "recreated" : e2);
        }
        if (!pool) {
            const char *path = want ? want : default_path;
            if (!want && fallback_path && ll_store_fault_is("hugetlb_fail"))
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
            /* The owner's pool (the kernel's) has no name: it goes with the
             * last process that maps it, even when the kernel is killed, so
             * it never stays in /dev/shm. */
            if (!want && st->redis_owned && ll_pool_make_nameless(pool) != 0)
                ll_warn("store", "session %s: cannot unlink the new pool %s: %s", st->session, path,
                        strerror(errno));
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

#define S_PRESSED_MS 30000 /* after a save met the user's cap, reserves stay empty this long */

/* Tell the pool's reserve how much free space to keep prefaulted, by the
 * store's reserve option (see ll_store.h). */
void ll_store_reserve_update(ll_store_t *st)
{
    size_t want = 0;
    if (st->reserve_opt > 0) {
        want = (size_t) st->reserve_opt;
    } else if (st->reserve_opt == LL_STORE_RESERVE_DEFAULT) {
        size_t cap = ll_pool_nregions(st->pool) * LL_STORE_R / 2;
        if (cap > LL_STORE_RESERVE_MAX)
            cap = LL_STORE_RESERVE_MAX;
        want = st->largest_put;
        if (ll_quota_pressed(st->quota, S_PRESSED_MS)) {
            /* Another save of the user met the cap: hold nothing ahead of use. */
            st->reserve_regions = 0;
            if (st->redis_owned)
                ll_pool_set_keep(st->pool, 0);
            ll_pool_reserve(st->pool, 0);
            return;
        }
        if (ll_pool_save_bytes(st->pool) > want)
            want = ll_pool_save_bytes(st->pool);
        if (st->redis_owned && want < LL_STORE_RESERVE_OWNER_MIN)
            want = LL_STORE_RESERVE_OWNER_MIN;
        if (want > cap)
            want = cap;
    }
    size_t nreg = want / LL_STORE_R + (want % LL_STORE_R != 0);
    st->reserve_regions = nreg;
    if (st->redis_owned)
        ll_pool_set_keep(st->pool, nreg); /* a worker's trim leaves the kernel's reserve */
    ll_pool_reserve(st->pool, nreg);      /* starts its thread only for nreg > 0 */
}

#define S_IDLE_REDIS_MS 1000 /* the idle reclamation's wait for Redis, at most */

/* The session owner's idle hook (ll_pool_set_idle; on the pool's reserve
 * thread, once the store has been quiet a moment and a commit, a dropped
 * lease or a bigger save moved the pool): reclaim what became garbage,
 * follow the session's saves with the reserve, and give back the memory of
 * free space beyond it.  Never waits for the store's callers: busy, it
 * returns -1 and is called again.  Its Redis wait is short and ignores the
 * interrupt fd and signal check, which belong to the caller's thread. */
static int s_idle(void *ctx)
{
    ll_store_t *st = ctx;
    if (pthread_mutex_trylock(&st->mu) != 0)
        return -1;
    /* A save of the user (another session's, or a worker's of this one)
     * waits at the cap: old versions this session's history keeps give way
     * to it, oldest first, as many as bring the user's pools under the cap
     * for it, and their regions are reclaimed and trimmed below, so that the
     * ledger stops counting them. */
    uint64_t excess = ll_quota_excess(st->quota, S_PRESSED_MS);
    if (excess) {
        ll_redis_begin_quiet(st->redis, S_IDLE_REDIS_MS);
        /* (a drop makes the reclamation below due) */
        if (ll_history_relieve(st, (size_t) ((excess + LL_STORE_R - 1) / LL_STORE_R), "cap") < 0)
            ll_debug("store", "history at the cap: %s", st->err);
        st->err[0] = 0;
        st->errkind = LL_STORE_OK;
    }
    if (ll_pool_gc_due(st->pool)) {
        ll_redis_begin_quiet(st->redis, S_IDLE_REDIS_MS);
        if (ll_store_gc_locked(st) < 0)
            ll_debug("store", "idle reclamation: %s", st->err);
        st->err[0] = 0;
        st->errkind = LL_STORE_OK;
    }
    ll_store_reserve_update(st);
    ll_pool_trim(st->pool, st->reserve_regions);
    pthread_mutex_unlock(&st->mu);
    return 0;
}

/* Count the pool in the user's ledger (ll_quota; without one, a warning
 * and no cap), and set the cap from LL_STORE_USER_CAP unless the broker
 * set it (hostd's cap wins).  0, or -1 for a bad LL_STORE_USER_CAP. */
static int s_open_quota(ll_store_t *st, char *err, size_t errlen)
{
    char e[640];
    st->quota = ll_quota_open(NULL, e, sizeof e);
    if (!st->quota && e[0])
        ll_warn("store", "%s", e);
    const char *knob = getenv("LL_STORE_USER_CAP");
    size_t cap = 0;
    if (knob && *knob) {
        if (ll_store_parse_bytes(knob, &cap) != 0) {
            snprintf(err, errlen,
                     "LL_STORE_USER_CAP must be a size such as 16G or 512M (0: none), not "
                     "'%.40s'",
                     knob);
            return -1;
        }
        int src;
        ll_quota_cap(st->quota, &src);
        if (src != LL_QUOTA_SRC_HOSTD)
            ll_quota_set_cap(st->quota, cap, cap ? LL_QUOTA_SRC_ENV : LL_QUOTA_SRC_NONE);
    }
    ll_pool_set_quota(st->pool, st->quota);
    return 0;
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
        char *sock = ll_redis_start(runtime_dir, session, &st->redis_owned, err, errlen);
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

    size_t pool_bytes = 0;
    int defaulted = s_pool_bytes(opts, &pool_bytes, err, errlen);
    if (defaulted < 0)
        goto fail;
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
    /* The session's owner makes its pool (others open the recorded one). */
    if (st->redis_owned && !want && kind.place == LL_PAGEKIND_SHM_FILE &&
        s_fit_pool_bytes(pool_path, defaulted == 1, &pool_bytes, err, errlen) != 0)
        goto fail;
    ll_debug("store", "session %s: a new pool would be %s", session, why);
    if (s_attach_pool(st, want, pool_path, fallback, pool_bytes, err, errlen) != 0) {
        if (kind.place == LL_PAGEKIND_NONE && strstr(err, "pool path is empty"))
            snprintf(err, errlen, "%s", why);
        goto fail;
    }
    if (s_open_quota(st, err, errlen) != 0)
        goto fail;
    st->reserve_opt = opts->reserve_bytes;
    ll_store_reserve_update(st);
    if (st->redis_owned) {
        st->guard = ll_redis_guard_new(runtime_dir, session);
        ll_pool_set_idle(st->pool, s_idle, st);
    }
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
    if (st->pool)
        ll_pool_set_idle(st->pool, NULL, NULL); /* waits for a call in progress */
    if (st->pool && getpid() == st->pid)
        ll_store_pending_release_all(st);
    if (st->pool)
        ll_pool_set_quota(st->pool, NULL); /* a mapping may keep the pool's handle */
    ll_pool_destroy(&st->pool);
    ll_quota_destroy(&st->quota);
    ll_redis_destroy(&st->redis);
    ll_redis_guard_destroy(&st->guard); /* before the stop: no restart */
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

/* ---- reclamation ----------------------------------------------------- */

/* ll_pool_refs_fn: mark the regions every committed entry refers to. */
static int s_mark_refs(void *ctx, uint64_t *mark, size_t nregions)
{
    ll_store_t *st = ctx;
    /* Versions kept as history are readers too (ll_history.c). */
    if (ll_history_mark(st, mark, nregions) != 0)
        return -1;
    char *k = ll_store_key(st, "prefs", NULL);
    redisReply *vals = k ? ll_redis_cmdf(st->redis, "HVALS %s", k) : NULL;
    free(k);
    if (!vals || vals->type != REDIS_REPLY_ARRAY) {
        if (vals)
            freeReplyObject(vals);
        return -1;
    }
    for (size_t i = 0; i < vals->elements; i++) {
        redisReply *r = vals->element[i];
        char **prefs;
        size_t np;
        if (r->type != REDIS_REPLY_STRING ||
            ll_store_json_parse_list(r->str, r->len, &prefs, &np) != 0)
            continue;
        for (size_t j = 0; j < np; j++) {
            size_t nb, n;
            uint64_t pool_id;
            ll_pool_region_t *regs;
            if (ll_store_ref_parse(prefs[j], &pool_id, &nb, &regs, &n) == 0) {
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

int ll_store_gc_locked(ll_store_t *st)
{
    char err[256];
    if (ll_redis_ensure(st->redis) != 0)
        return ll_store_redis_fail(st, "reclamation failed");
    int freed = ll_pool_gc(st->pool, s_mark_refs, st, err, sizeof err);
    st->gc_runs++;
    if (freed < 0)
        return ll_store_fail(st, LL_STORE_EIO, "reclamation failed: %s (%s)", err,
                             ll_redis_errstr(st->redis));
    st->reclaimed += (uint64_t) freed;
    return freed;
}

int ll_store_set_reserve(ll_store_t *st, long long nbytes)
{
    if (ll_store_enter(st) != 0)
        return -1;
    st->reserve_opt = nbytes;
    ll_store_reserve_update(st);
    ll_store_leave(st);
    return 0;
}

long long ll_store_prefault(ll_store_t *st, size_t nbytes)
{
    if (ll_store_enter(st) != 0)
        return -1;
    size_t n = ll_pool_prefault(st->pool, (nbytes + LL_STORE_R - 1) / LL_STORE_R);
    ll_store_leave(st);
    return (long long) (n * LL_STORE_R);
}

int ll_store_gc(ll_store_t *st)
{
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = ll_store_gc_locked(st);
    if (rc >= 0)
        ll_pool_trim(st->pool, st->reserve_regions); /* what is free beyond the reserve goes */
    ll_store_leave(st);
    return rc;
}

int ll_store_delete_session(ll_store_t *st)
{
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = -1;
    /* Session ids are [A-Za-z0-9._-]: nothing to escape in the pattern. */
    char *pattern = ll_store_key(st, "*", NULL);
    char cursor[32] = "0";
    if (!pattern) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    do {
        redisReply *r = ll_redis_cmdf(st->redis, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            if (r)
                freeReplyObject(r);
            ll_store_redis_fail(st, "delete_session failed");
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
                ll_store_redis_fail(st, "delete_session failed");
                goto out;
            }
            freeReplyObject(d);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    ll_store_pending_release_all(st);
    if (ll_pool_unlink(st->pool) != 0) {
        ll_store_fail(st, LL_STORE_EIO, "cannot remove the pool file: %s", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    free(pattern);
    ll_store_leave(st);
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

/* ll_history: superseded versions of a session's variables, kept within a
 * byte budget so that a user can list them and bring one back (time
 * travel).  Runs in every process that commits (the hooks in
 * ll_store_commit.c), in the owner's reclamation (ll_store.c), and in the
 * kernel (the operations, from ll_store_py.c), under the store's mutex.
 *
 * DESIGN
 * ------
 * Keys of session S, besides ll_store.c's:
 *   ll:S:hon             "1": commits record history (set by the kernel;
 *                        each Store reads it at its first commit)
 *   ll:S:h:VER:NAME      a copy of the entry ll:S:v:NAME as version VER
 *                        committed it (COPY inside the commit's MULTI)
 *   ll:S:hprefs          hash "VER:NAME" -> its payload refs (JSON list)
 *   ll:S:hist            hash "VER:NAME" -> "TIME NBYTES BLOBLEN CELL"
 *   ll:S:hdrop           hash "VER:NAME" -> TIME the budget dropped it
 * A commit records every version it writes (the current one included), in
 * the same transaction as the entry itself.  So from the moment a version
 * is committed until its history entry is pruned, ll:S:hprefs refers to its
 * regions, and reclamation (which reads ll:S:hprefs besides ll:S:prefs,
 * ll_history_mark) never frees them: kept history is a reader in the sense
 * of ll_pool_reclaim.c's rule, with no window between the commit that
 * supersedes a version and the history taking it over.  Pruning only
 * removes references (never a race with reclamation: a reclaimer that read
 * them first just frees later), then moves the pool's epoch so that the
 * owner's idle reclamation runs.
 *
 * THE BUDGET.  What history costs is what superseded versions hold that no
 * current version holds: their payload regions (2 MiB each, counted once
 * however many kept versions share a region: an incremental save shares
 * the unchanged ones) plus their blobs in Redis.  ll_history_op("prune")
 * drops the oldest superseded versions until that fits; the kernel calls
 * it when idle after commits.  A dropped version is remembered (ll:S:hdrop)
 * so that asking for it says it was dropped, not that it never existed. */
#include "store/ll_history.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_store_internal.h"

/* ---- text -------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} s_buf_t;

static void s_printf(s_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_printf(s_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->oom || n < 0)
        return;
    if (b->len + (size_t) n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 256) + (size_t) n;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t) n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t) n;
}

/* ---- commit hooks ------------------------------------------------------ */

int ll_history_set(ll_store_t *st, bool on)
{
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = 0;
    char *k = ll_store_key(st, "hon", NULL);
    redisReply *r =
        k ? (on ? ll_redis_cmdf(st->redis, "SET %s 1", k) : ll_redis_cmdf(st->redis, "DEL %s", k))
          : NULL;
    if (!r || r->type == REDIS_REPLY_ERROR)
        rc = ll_store_redis_fail(st, "history setting failed");
    else {
        st->history_known = true;
        st->history_on = on;
    }
    if (r)
        freeReplyObject(r);
    free(k);
    ll_store_leave(st);
    return rc;
}

int ll_history_on(ll_store_t *st)
{
    if (st->history_known)
        return st->history_on;
    char *k = ll_store_key(st, "hon", NULL);
    redisReply *r = k ? ll_redis_cmdf(st->redis, "GET %s", k) : NULL;
    free(k);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r)
            freeReplyObject(r);
        return -1;
    }
    st->history_known = true;
    st->history_on = r->type == REDIS_REPLY_STRING;
    freeReplyObject(r);
    return st->history_on;
}

/* "VER:NAME", malloc'd. */
static char *s_field(const char *vbuf, const char *name)
{
    size_t n = strlen(vbuf) + strlen(name) + 2;
    char *f = malloc(n);
    if (f)
        snprintf(f, n, "%s:%s", vbuf, name);
    return f;
}

int ll_history_queue(ll_store_t *st, ll_redis_argv_t *a, const char *vkey,
                     const ll_store_write_t *w, const char *vbuf, const char *prefs_json,
                     const char *cell, int *sent)
{
    size_t nbytes = 0;
    for (size_t j = 0; j < w->nprefs; j++) {
        long long nb = ll_store_ref_nbytes(w->prefs[j]);
        nbytes += nb > 0 ? (size_t) nb : 0;
    }
    char *field = s_field(vbuf, w->name);
    char *hkey = field ? ll_store_key(st, "h:", field) : NULL;
    char *k_hist = ll_store_key(st, "hist", NULL), *k_hprefs = ll_store_key(st, "hprefs", NULL);
    char meta[96];
    size_t mlen = (size_t) snprintf(meta, sizeof meta, "%lld %zu %zu ", (long long) time(NULL),
                                    nbytes, w->blob ? w->bloblen : 0);
    size_t clen = strlen(cell);
    char *val = malloc(mlen + clen + 1);
    int bad = !field || !hkey || !k_hist || !k_hprefs || !val;
    if (!bad) {
        memcpy(val, meta, mlen);
        memcpy(val + mlen, cell, clen + 1);
        bad |= ll_redis_arg(a, "COPY") || ll_redis_arg(a, vkey) || ll_redis_arg(a, hkey) ||
               ll_redis_arg(a, "REPLACE") || ll_redis_send(st->redis, a);
        bad |= ll_redis_arg(a, "HSET") || ll_redis_arg(a, k_hist) || ll_redis_arg(a, field) ||
               ll_redis_arg(a, val) || ll_redis_send(st->redis, a);
        *sent += 2;
        if (w->nprefs && !bad) {
            bad |= ll_redis_arg(a, "HSET") || ll_redis_arg(a, k_hprefs) || ll_redis_arg(a, field) ||
                   ll_redis_arg(a, prefs_json) || ll_redis_send(st->redis, a);
            (*sent)++;
        }
    }
    free(val);
    free(k_hprefs);
    free(k_hist);
    free(hkey);
    free(field);
    return bad;
}

/* ---- reclamation ------------------------------------------------------- */

/* Regions of the JSON list of refs at TEXT in this session's pool: call
 * FN(ctx, idx, gen) for each. */
static void s_each_region(ll_store_t *st, const char *text, size_t len,
                          void (*fn)(void *ctx, uint32_t idx, uint64_t gen), void *ctx)
{
    char **prefs;
    size_t np;
    if (ll_store_json_parse_list(text, len, &prefs, &np) != 0)
        return;
    for (size_t j = 0; j < np; j++) {
        size_t nb, n;
        uint64_t pool_id;
        ll_pool_region_t *regs;
        if (ll_store_ref_parse(prefs[j], &pool_id, &nb, &regs, &n) == 0) {
            for (size_t q = 0; q < n && pool_id == ll_pool_id(st->pool); q++)
                fn(ctx, regs[q].idx, regs[q].gen);
            free(regs);
        }
        free(prefs[j]);
    }
    free(prefs);
}

typedef struct {
    uint64_t *mark;
    size_t n;
} s_mark_t;

/* A region's generations only grow: a region a kept version refers to is
 * live at the newest generation anyone refers to, so keep the largest (a
 * stale ref then never hides the live one from the current marks). */
static void s_mark_one(void *ctx, uint32_t idx, uint64_t gen)
{
    s_mark_t *m = ctx;
    if (idx < m->n && m->mark[idx] < gen)
        m->mark[idx] = gen;
}

int ll_history_mark(ll_store_t *st, uint64_t *mark, size_t nregions)
{
    char *k = ll_store_key(st, "hprefs", NULL);
    redisReply *vals = k ? ll_redis_cmdf(st->redis, "HVALS %s", k) : NULL;
    free(k);
    if (!vals || vals->type != REDIS_REPLY_ARRAY) {
        if (vals)
            freeReplyObject(vals);
        return -1;
    }
    s_mark_t m = {mark, nregions};
    for (size_t i = 0; i < vals->elements; i++)
        if (vals->element[i]->type == REDIS_REPLY_STRING)
            s_each_region(st, vals->element[i]->str, vals->element[i]->len, s_mark_one, &m);
    freeReplyObject(vals);
    return 0;
}

/* ---- reading the history ----------------------------------------------- */

/* One kept version, pointing into the replies it was parsed from. */
typedef struct {
    uint64_t ver;
    const char *name; /* NUL-terminated copy */
    long long time;
    size_t nbytes, bloblen;
    const char *cell;
    const redisReply *field, *prefs; /* prefs: NULL when it has none */
    bool current;
} s_item_t;

static int s_item_cmp(const void *a, const void *b)
{
    const s_item_t *x = a, *y = b;
    return x->ver < y->ver ? -1 : x->ver > y->ver;
}

/* Parse "VER:NAME" into *VER and a malloc'd name. */
static char *s_parse_field(const redisReply *f, uint64_t *ver)
{
    const char *colon = f->type == REDIS_REPLY_STRING ? memchr(f->str, ':', f->len) : NULL;
    if (!colon || colon == f->str)
        return NULL;
    *ver = strtoull(f->str, NULL, 10);
    return strndup(colon + 1, f->len - (size_t) (colon + 1 - f->str));
}

/* Run the read-only commands KEYS[i] (each "HGETALL" or "HVALS" of key
 * KEYS[i]) in one MULTI/EXEC: the EXEC reply, NULL on failure. */
static redisReply *s_read(ll_store_t *st, const char *const *cmds, const char *const *keys, int n)
{
    ll_redis_argv_t a = {0};
    int bad = ll_redis_arg(&a, "MULTI") || ll_redis_send(st->redis, &a);
    for (int i = 0; i < n && !bad; i++)
        bad |=
            ll_redis_arg(&a, cmds[i]) || ll_redis_arg(&a, keys[i]) || ll_redis_send(st->redis, &a);
    bad |= ll_redis_arg(&a, "EXEC") || ll_redis_send(st->redis, &a);
    ll_redis_argv_free(&a);
    redisReply *r = NULL;
    if (!bad && ll_redis_drain(st->redis, n + 1) == 0)
        r = ll_redis_reply(st->redis);
    if (bad)
        ll_redis_reset(st->redis);
    if (r && (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t) n)) {
        freeReplyObject(r);
        r = NULL;
    }
    for (int i = 0; r && i < n; i++)
        if (r->element[i]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            r = NULL;
        }
    return r;
}

/* A field/value pair of an HGETALL reply, for sorted lookups. */
typedef struct {
    const redisReply *key, *val;
} s_pair_t;

static int s_pair_cmp(const void *a, const void *b)
{
    const redisReply *x = ((const s_pair_t *) a)->key, *y = ((const s_pair_t *) b)->key;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->str, y->str, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* The pairs of HGETALL reply R sorted by field (*N of them), or NULL. */
static s_pair_t *s_pairs(const redisReply *r, size_t *n)
{
    *n = 0;
    s_pair_t *p = malloc((r->elements / 2 + 1) * sizeof *p);
    for (size_t j = 0; p && j + 1 < r->elements; j += 2)
        if (r->element[j]->type == REDIS_REPLY_STRING)
            p[(*n)++] = (s_pair_t){r->element[j], r->element[j + 1]};
    if (p)
        qsort(p, *n, sizeof *p, s_pair_cmp);
    return p;
}

static const redisReply *s_lookup(const s_pair_t *p, size_t n, const char *key, size_t len)
{
    redisReply k = {.type = REDIS_REPLY_STRING, .str = (char *) key, .len = len};
    s_pair_t want = {&k, NULL};
    const s_pair_t *hit = p ? bsearch(&want, p, n, sizeof *p, s_pair_cmp) : NULL;
    return hit ? hit->val : NULL;
}

/* The items of HIST (an HGETALL reply) for NAME (NULL: all), sorted by
 * version, each marked current by VER (HGETALL of ll:S:ver); HPREFS (an
 * HGETALL of ll:S:hprefs, or NULL) gives their refs.  *N items, or NULL
 * (out of memory). */
static s_item_t *s_items(const redisReply *hist, const redisReply *ver, const redisReply *hprefs,
                         const char *name, size_t *n)
{
    *n = 0;
    size_t m = hist->elements / 2, nv = 0, np = 0;
    s_item_t *it = calloc(m ? m : 1, sizeof *it);
    s_pair_t *vp = s_pairs(ver, &nv), *pp = hprefs ? s_pairs(hprefs, &np) : NULL;
    if (!it || !vp || (hprefs && !pp)) {
        free(it);
        free(vp);
        free(pp);
        return NULL;
    }
    for (size_t i = 0; i < m; i++) {
        const redisReply *f = hist->element[2 * i], *v = hist->element[2 * i + 1];
        s_item_t x = {.field = f};
        char *nm = s_parse_field(f, &x.ver);
        if (!nm || v->type != REDIS_REPLY_STRING || (name && strcmp(nm, name) != 0)) {
            free(nm);
            continue;
        }
        x.name = nm;
        char *end = NULL;
        x.time = strtoll(v->str, &end, 10);
        x.nbytes = (size_t) strtoull(end, &end, 10);
        x.bloblen = (size_t) strtoull(end, &end, 10);
        x.cell = *end == ' ' ? end + 1 : end;
        const redisReply *cur = s_lookup(vp, nv, nm, strlen(nm));
        x.current = cur && ll_redis_u64(cur) == x.ver;
        x.prefs = s_lookup(pp, np, f->str, f->len);
        it[(*n)++] = x;
    }
    free(vp);
    free(pp);
    qsort(it, *n, sizeof *it, s_item_cmp);
    return it;
}

static void s_items_free(s_item_t *it, size_t n)
{
    for (size_t i = 0; it && i < n; i++)
        free((char *) it[i].name);
    free(it);
}

static int s_list(ll_store_t *st, const char *name, s_buf_t *out)
{
    char *k_hist = ll_store_key(st, "hist", NULL), *k_ver = ll_store_key(st, "ver", NULL),
         *k_drop = ll_store_key(st, "hdrop", NULL);
    const char *cmds[] = {"HGETALL", "HGETALL", "HGETALL"}, *keys[] = {k_hist, k_ver, k_drop};
    redisReply *r = k_hist && k_ver && k_drop ? s_read(st, cmds, keys, 3) : NULL;
    free(k_hist);
    free(k_ver);
    free(k_drop);
    if (!r)
        return ll_store_redis_fail(st, "history failed");
    size_t n;
    s_item_t *it = s_items(r->element[0], r->element[1], NULL, name, &n);
    for (size_t i = 0; it && i < n; i++)
        s_printf(out, "%llu\t%s\t%lld\t%zu\t%d\t%s\n", (unsigned long long) it[i].ver, it[i].name,
                 it[i].time, it[i].nbytes, it[i].current, it[i].cell);
    s_items_free(it, n);
    const redisReply *d = r->element[2];
    for (size_t j = 0; j + 1 < d->elements; j += 2) {
        uint64_t v;
        char *nm = s_parse_field(d->element[j], &v);
        if (nm && (!name || strcmp(nm, name) == 0) &&
            d->element[j + 1]->type == REDIS_REPLY_STRING) {
            /* "TIME WHY" ("TIME": the budget, as before the reason was kept) */
            const char *val = d->element[j + 1]->str, *sp = strchr(val, ' ');
            s_printf(out, "dropped\t%llu\t%s\t%.*s\t%s\n", (unsigned long long) v, nm,
                     (int) (sp ? (size_t) (sp - val) : strlen(val)), val, sp ? sp + 1 : "budget");
        }
        free(nm);
    }
    freeReplyObject(r);
    return 0;
}

static int s_fetch(ll_store_t *st, const char *name, uint64_t ver, s_buf_t *out,
                   ll_store_entry_t **entry)
{
    char vbuf[32];
    snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long) ver);
    char *field = s_field(vbuf, name);
    char *hkey = field ? ll_store_key(st, "h:", field) : NULL;
    char *k_drop = ll_store_key(st, "hdrop", NULL);
    int rc = -1;
    redisReply *r = NULL, *d = NULL;
    if (!field || !hkey || !k_drop) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    r = ll_redis_cmdf(st->redis, "HMGET %s ver blob prefs refs", hkey);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 4) {
        ll_store_redis_fail(st, "history fetch failed");
        goto out;
    }
    if (r->element[0]->type != REDIS_REPLY_STRING) {
        d = ll_redis_cmdf(st->redis, "HGET %s %s", k_drop, field);
        if (!d) {
            ll_store_redis_fail(st, "history fetch failed");
            goto out;
        }
        if (d->type == REDIS_REPLY_STRING)
            s_printf(out, "dropped %s", d->str);
        else
            s_printf(out, "unknown");
        rc = 0;
        goto out;
    }
    ll_store_entry_t *e = calloc(1, sizeof *e);
    redisReply *b = r->element[1], *pr = r->element[2], *rf = r->element[3];
    if (!e || b->type != REDIS_REPLY_STRING || pr->type != REDIS_REPLY_STRING ||
        rf->type != REDIS_REPLY_STRING) {
        free(e);
        ll_store_fail(st, LL_STORE_EIO, "history entry '%s' is damaged in Redis", field);
        goto out;
    }
    e->version = ver;
    e->name = strdup(name);
    e->blob = malloc(b->len ? b->len : 1);
    e->bloblen = b->len;
    if (e->blob)
        memcpy(e->blob, b->str, b->len);
    if (!e->name || !e->blob ||
        ll_store_json_parse_list(pr->str, pr->len, &e->prefs, &e->nprefs) != 0 ||
        ll_store_json_parse_list(rf->str, rf->len, &e->refs, &e->nrefs) != 0) {
        ll_store_entries_free(e, 1);
        ll_store_fail(st, LL_STORE_EIO, "history entry '%s' is damaged in Redis", field);
        goto out;
    }
    *entry = e;
    s_printf(out, "kept");
    rc = 0;
out:
    if (r)
        freeReplyObject(r);
    if (d)
        freeReplyObject(d);
    free(field);
    free(hkey);
    free(k_drop);
    return rc;
}

/* ---- the budget -------------------------------------------------------- */

typedef struct {
    uint64_t *cur;     /* per region: the generation current versions use */
    uint32_t *count;   /* per region: superseded kept versions using it alone */
    size_t n, regions; /* regions counted (count > 0) */
    int delta;
} s_cost_t;

static void s_cur_one(void *ctx, uint32_t idx, uint64_t gen)
{
    s_cost_t *c = ctx;
    if (idx < c->n)
        c->cur[idx] = gen;
}

static void s_count_one(void *ctx, uint32_t idx, uint64_t gen)
{
    s_cost_t *c = ctx;
    if (idx >= c->n || c->cur[idx] == gen)
        return;
    if (c->delta > 0 && c->count[idx]++ == 0)
        c->regions++;
    else if (c->delta < 0 && c->count[idx] > 0 && --c->count[idx] == 0)
        c->regions--;
}

/* Drop the items DROP[] of IT, remembering when and why (WHY, one word). */
/* Whether a region of a kept version is one no current version uses (the
 * version holds memory of its own). */
typedef struct {
    const s_cost_t *c;
    bool own;
} s_own_t;

static void s_own_one(void *ctx, uint32_t idx, uint64_t gen)
{
    s_own_t *o = ctx;
    if (idx < o->c->n && o->c->cur[idx] != gen)
        o->own = true;
}

static bool s_holds_own(ll_store_t *st, const s_cost_t *c, const s_item_t *it)
{
    s_own_t o = {c, false};
    if (it->prefs)
        s_each_region(st, it->prefs->str, it->prefs->len, s_own_one, &o);
    return o.own;
}

static int s_drop(ll_store_t *st, s_item_t *it, const size_t *drop, size_t ndrop, const char *why)
{
    char *k_hist = ll_store_key(st, "hist", NULL), *k_hprefs = ll_store_key(st, "hprefs", NULL),
         *k_drop = ll_store_key(st, "hdrop", NULL);
    char now[48];
    snprintf(now, sizeof now, "%lld %s", (long long) time(NULL), why);
    ll_redis_argv_t a = {0};
    int sent = 0;
    int bad = !k_hist || !k_hprefs || !k_drop || ll_redis_arg(&a, "MULTI") ||
              ll_redis_send(st->redis, &a);
    sent++;
    for (size_t i = 0; i < ndrop && !bad; i++) {
        const redisReply *f = it[drop[i]].field;
        char *field = strndup(f->str, f->len);
        char *hkey = field ? ll_store_key(st, "h:", field) : NULL;
        bad |= !hkey || ll_redis_arg(&a, "DEL") || ll_redis_arg(&a, hkey) ||
               ll_redis_send(st->redis, &a);
        bad |= ll_redis_arg(&a, "HDEL") || ll_redis_arg(&a, k_hprefs) || ll_redis_arg(&a, field) ||
               ll_redis_send(st->redis, &a);
        bad |= ll_redis_arg(&a, "HDEL") || ll_redis_arg(&a, k_hist) || ll_redis_arg(&a, field) ||
               ll_redis_send(st->redis, &a);
        bad |= ll_redis_arg(&a, "HSET") || ll_redis_arg(&a, k_drop) || ll_redis_arg(&a, field) ||
               ll_redis_arg(&a, now) || ll_redis_send(st->redis, &a);
        sent += 4;
        free(hkey);
        free(field);
    }
    bad |= ll_redis_arg(&a, "EXEC") || ll_redis_send(st->redis, &a);
    ll_redis_argv_free(&a);
    redisReply *r = NULL;
    if (!bad && ll_redis_drain(st->redis, sent) == 0)
        r = ll_redis_reply(st->redis);
    if (bad)
        ll_redis_reset(st->redis);
    free(k_hist);
    free(k_hprefs);
    free(k_drop);
    int rc =
        r && r->type == REDIS_REPLY_ARRAY ? 0 : ll_store_redis_fail(st, "history prune failed");
    if (r)
        freeReplyObject(r);
    /* Their regions may be garbage now: make the owner's reclamation due. */
    if (rc == 0)
        ll_pool_commit_done(st->pool);
    return rc;
}

/* What a prune keeps: the oldest superseded versions go until what the rest
 * hold fits BUDGET bytes and they number at most MAXKEPT, and until SHED
 * regions are no longer held by any of them (a save that needs room: then
 * versions every region of which a current version uses are left alone,
 * their going would free nothing; a region is never counted for a kept
 * version while the current one uses it).  WHY is remembered with each dropped version:
 * "budget", "pool" (a save found the pool full) or "cap" (the user's cap). */
typedef struct {
    size_t budget, maxkept, shed;
    const char *why;
} s_keep_t;

static int s_prune(ll_store_t *st, const s_keep_t *keep, s_buf_t *out)
{
    char *k_hist = ll_store_key(st, "hist", NULL), *k_ver = ll_store_key(st, "ver", NULL),
         *k_hprefs = ll_store_key(st, "hprefs", NULL), *k_prefs = ll_store_key(st, "prefs", NULL);
    const char *cmds[] = {"HGETALL", "HGETALL", "HGETALL", "HVALS"};
    const char *keys[] = {k_hist, k_ver, k_hprefs, k_prefs};
    redisReply *r = k_hist && k_ver && k_hprefs && k_prefs ? s_read(st, cmds, keys, 4) : NULL;
    free(k_hist);
    free(k_ver);
    free(k_hprefs);
    free(k_prefs);
    if (!r)
        return ll_store_redis_fail(st, "history prune failed");
    size_t n = 0, ndrop = 0, nr = ll_pool_nregions(st->pool);
    s_item_t *it = s_items(r->element[0], r->element[1], r->element[2], NULL, &n);
    s_cost_t c = {.cur = calloc(nr ? nr : 1, sizeof *c.cur),
                  .count = calloc(nr ? nr : 1, sizeof *c.count),
                  .n = nr};
    size_t *drop = calloc(n ? n : 1, sizeof *drop);
    int rc = -1;
    if (!it || !c.cur || !c.count || !drop) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    const redisReply *cur = r->element[3];
    for (size_t i = 0; i < cur->elements; i++)
        if (cur->element[i]->type == REDIS_REPLY_STRING)
            s_each_region(st, cur->element[i]->str, cur->element[i]->len, s_cur_one, &c);
    size_t blobs = 0;
    c.delta = 1;
    for (size_t i = 0; i < n; i++)
        if (!it[i].current) {
            blobs += it[i].bloblen;
            if (it[i].prefs)
                s_each_region(st, it[i].prefs->str, it[i].prefs->len, s_count_one, &c);
        }
    size_t superseded = 0, held = c.regions;
    for (size_t i = 0; i < n; i++)
        superseded += !it[i].current;
    c.delta = -1;
    for (size_t i = 0; i < n; i++) {
        bool over = c.regions * LL_STORE_R + blobs > keep->budget || superseded > keep->maxkept;
        bool short_ = held - c.regions < keep->shed;
        if (!over && !short_)
            break;
        /* (making room: a version all of whose regions the current ones use
         * would free nothing, and is kept) */
        if (it[i].current || (!over && !s_holds_own(st, &c, &it[i])))
            continue;
        superseded--;
        blobs -= it[i].bloblen;
        if (it[i].prefs)
            s_each_region(st, it[i].prefs->str, it[i].prefs->len, s_count_one, &c);
        drop[ndrop++] = i;
    }
    if (ndrop && s_drop(st, it, drop, ndrop, keep->why) != 0)
        goto out;
    for (size_t i = 0; i < ndrop; i++)
        s_printf(out, "%llu\t%s\n", (unsigned long long) it[drop[i]].ver, it[drop[i]].name);
    if (ndrop)
        ll_info("store",
                "history: dropped %zu old versions (%s; %zu of %zu regions they held freed)", ndrop,
                keep->why, held - c.regions, held);
    rc = 0;
out:
    s_items_free(it, n);
    free(c.cur);
    free(c.count);
    free(drop);
    freeReplyObject(r);
    return rc;
}

int ll_history_relieve(ll_store_t *st, size_t regions, const char *why)
{
    if (regions == 0 || ll_history_on(st) <= 0) /* (a worker may put before its first commit) */
        return 0;
    s_buf_t out = {0};
    s_keep_t keep = {SIZE_MAX, SIZE_MAX, regions, why};
    if (s_prune(st, &keep, &out) != 0) {
        free(out.s);
        return -1;
    }
    int n = 0;
    for (size_t i = 0; out.s && i < out.len; i++)
        n += out.s[i] == '\n';
    free(out.s);
    if (n)
        ll_warn("store", "%s: dropped the %d oldest versions the history kept",
                strcmp(why, "cap") == 0 ? "at the user's store cap" : "pool full", n);
    return n;
}

int ll_history_op(ll_store_t *st, const char *op, const char *name, uint64_t num, char **text,
                  ll_store_entry_t **entry)
{
    *text = NULL;
    if (entry)
        *entry = NULL;
    if (strcmp(op, "set") == 0) {
        if (ll_history_set(st, num != 0) != 0)
            return -1;
        *text = strdup("");
        return 0;
    }
    if (ll_store_enter(st) != 0)
        return -1;
    s_buf_t out = {0};
    s_printf(&out, "%s", "");
    int rc;
    if (ll_redis_ensure(st->redis) != 0)
        rc = ll_store_redis_fail(st, "history failed");
    else if (strcmp(op, "list") == 0)
        rc = s_list(st, name, &out);
    else if (strcmp(op, "fetch") == 0 && name && entry)
        rc = s_fetch(st, name, num, &out, entry);
    else if (strcmp(op, "prune") == 0) {
        s_keep_t keep = {(size_t) num, name ? (size_t) strtoull(name, NULL, 10) : SIZE_MAX, 0,
                         "budget"};
        rc = s_prune(st, &keep, &out);
    } else
        rc = ll_store_fail(st, LL_STORE_EINVAL, "unknown history operation '%s'", op);
    if (rc == 0 && out.oom)
        rc = ll_store_fail(st, LL_STORE_EIO, "out of memory");
    if (rc == 0)
        *text = out.s;
    else
        free(out.s);
    ll_store_leave(st);
    return rc;
}

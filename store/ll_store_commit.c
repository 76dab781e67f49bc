/* ll_store_commit: committing a cell's variables to Redis, and the reads
 * that see commits whole (fetch, versions, last_commit).  Runs on the
 * caller's thread under the store's mutex.
 *
 * A commit is WATCH seq, GET seq (and the base versions), then one
 * MULTI ... EXEC that writes every entry, the version hash, seq and the
 * commit record: all of a cell or nothing, and a concurrent commit makes
 * EXEC fail and us retry.  Versions are commit numbers, so a name's version
 * only moves forward even across delete and re-create.  If the connection
 * breaks after EXEC was sent we cannot know whether it ran (Redis may even
 * run it after we reconnected): every later attempt first looks for the
 * commit record's random token at that commit number, so a cell lands
 * exactly once.  Refs in a commit are leased while it runs: a ref whose
 * region was reclaimed (its generation moved) is refused instead of
 * committed.  fetch reads all names in one MULTI/EXEC, so a reader sees a
 * cell's writes all or none. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_history.h"
#include "store/ll_store_internal.h"

#define S_COMMIT_RECORDS_KEPT 1000
#define S_PAIRWISE_MAX        (1u << 16) /* write x delete pairs a commit checks at most */

/* ---- commit ---------------------------------------------------------- */

/* One commit in flight.  The arguments, then what step 1 (lease) prepares
 * for the transaction, then what step 2 (the retry loop) remembers. */
typedef struct {
    ll_store_t *st;
    const char *cell_id; /* never NULL ("" for none) */
    const ll_store_write_t *writes;
    size_t nwrites;
    const char *const *deletes;
    size_t ndeletes;
    const ll_store_base_t *bases;
    size_t nbases;

    char **prefs_json;  /* per write: its payload refs as a JSON list */
    char **refs_json;   /* per write: its refs as a JSON list */
    char **vkeys;       /* ll:S:v:NAME per write, then per delete */
    const char **names; /* per write (borrowed from WRITES) */
    char *writes_json, *deletes_json;
    char *k_seq, *k_ver, *k_prefs;
    uint32_t *leased; /* regions leased for the commit's payloads */
    size_t nleased, cap_leased;
    char token[40]; /* random: finds our commit record after a lost reply */
    ll_redis_argv_t a;

    /* Commit numbers at which an EXEC of ours may have run although its
     * reply was lost with the connection. */
    uint64_t lost[8];
    int nlost;
} s_commit_t;

/* Lease every region of write W's payloads (its refs must name this
 * pool's regions at their current generation), appending them to
 * C->leased.  0, or -1 with the reason recorded. */
static int s_commit_lease_refs(s_commit_t *c, const ll_store_write_t *w)
{
    ll_store_t *st = c->st;
    for (size_t j = 0; j < w->nprefs; j++) {
        size_t nb, n;
        uint64_t pool_id;
        ll_pool_region_t *regs;
        if (ll_store_ref_parse(w->prefs[j], &pool_id, &nb, &regs, &n) != 0)
            return ll_store_fail(st, LL_STORE_EINVAL, "'%s': not a payload ref: %.80s", w->name,
                                 w->prefs[j]);
        if (pool_id != ll_pool_id(st->pool)) {
            free(regs);
            return ll_store_fail(
                st, LL_STORE_EGONE,
                "'%s': payload is in another pool (the session's pool was recreated)", w->name);
        }
        if (c->nleased + n > c->cap_leased) {
            c->cap_leased = (c->nleased + n) * 2 + 16;
            uint32_t *l = realloc(c->leased, c->cap_leased * sizeof *l);
            if (!l) {
                free(regs);
                return ll_store_fail(st, LL_STORE_EIO, "out of memory");
            }
            c->leased = l;
        }
        for (size_t k = 0; k < n; k++) {
            if (ll_pool_lease(st->pool, &regs[k]) != 0) {
                ll_store_fail(st, LL_STORE_EGONE,
                              "'%s': payload region %u was reclaimed; its version is gone "
                              "(re-save the payload)",
                              w->name, (unsigned) regs[k].idx);
                free(regs);
                return -1;
            }
            c->leased[c->nleased++] = regs[k].idx;
        }
        free(regs);
    }
    return 0;
}

/* Step 1, lease.  Check the arguments, lease every region the commit
 * refers to (so none can be reclaimed between here and EXEC: a ref whose
 * region was reclaimed is refused now instead of committed), and encode
 * what the transaction writes, with a fresh random token.  Nothing is sent
 * to Redis.  0, or -1 with the reason recorded; either way what was
 * leased and allocated is in C for s_commit_release. */
static int s_commit_lease(s_commit_t *c)
{
    ll_store_t *st = c->st;
    size_t nw = c->nwrites, nd = c->ndeletes;
    c->prefs_json = calloc(nw + 1, sizeof *c->prefs_json);
    c->refs_json = calloc(nw + 1, sizeof *c->refs_json);
    c->vkeys = calloc(nw + nd + 1, sizeof *c->vkeys);
    c->k_seq = ll_store_key(st, "seq", NULL);
    c->k_ver = ll_store_key(st, "ver", NULL);
    c->k_prefs = ll_store_key(st, "prefs", NULL);
    c->names = calloc(nw + 1, sizeof *c->names);
    if (!c->prefs_json || !c->refs_json || !c->vkeys || !c->k_seq || !c->k_ver || !c->k_prefs ||
        !c->names)
        return ll_store_fail(st, LL_STORE_EIO, "out of memory");
    for (size_t i = 0; i < nw; i++) {
        const ll_store_write_t *w = &c->writes[i];
        if (!w->name || !*w->name)
            return ll_store_fail(st, LL_STORE_EINVAL, "empty variable name");
        /* Checks for the caller's mistakes, pairwise, so only where that
         * stays cheap: run for every write of a 100k-name commit they took
         * seconds, past the store's timeout (the Python layer
         * passes a dict and disjoint deletes anyway). */
        for (size_t j = 0; nw * nd <= S_PAIRWISE_MAX && j < nd; j++)
            if (strcmp(c->deletes[j], w->name) == 0)
                return ll_store_fail(st, LL_STORE_EINVAL, "'%s' is both written and deleted",
                                     w->name);
        for (size_t j = 0; nw < 64 && j < i; j++)
            if (strcmp(c->writes[j].name, w->name) == 0)
                return ll_store_fail(st, LL_STORE_EINVAL, "'%s' is written twice", w->name);
        if (s_commit_lease_refs(c, w) != 0)
            return -1;
        c->prefs_json[i] = ll_store_json_list(w->prefs, w->nprefs);
        c->refs_json[i] = ll_store_json_list(w->refs, w->nrefs);
        c->vkeys[i] = ll_store_key(st, "v:", w->name);
        c->names[i] = w->name;
        if (!c->prefs_json[i] || !c->refs_json[i] || !c->vkeys[i])
            return ll_store_fail(st, LL_STORE_EINVAL,
                                 "'%s': names and refs must be valid UTF-8 text", w->name);
    }
    for (size_t j = 0; j < nd; j++)
        if (!c->deletes[j] || !*c->deletes[j] ||
            !(c->vkeys[nw + j] = ll_store_key(st, "v:", c->deletes[j])))
            return ll_store_fail(st, LL_STORE_EINVAL, "bad name to delete");
    c->writes_json = ll_store_json_list(c->names, nw);
    c->deletes_json = ll_store_json_list(c->deletes, nd);
    if (!c->writes_json || !c->deletes_json)
        return ll_store_fail(st, LL_STORE_EINVAL, "names must be valid UTF-8 text");
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t) sizeof rnd)
        for (size_t i = 0; i < sizeof rnd; i++)
            rnd[i] = (unsigned char) (rand() ^ getpid());
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(c->token + 2 * i, 3, "%02x", rnd[i]);
    return 0;
}

/* Whether an EXEC of ours whose reply was lost ran after all: our token in
 * the commit record at one of the commit numbers it may have taken.  Redis
 * may even run it after we reconnected, so every attempt looks again.
 * When it did, *VERSION is that number. */
static bool s_commit_landed(s_commit_t *c, uint64_t *version)
{
    ll_store_t *st = c->st;
    bool landed = false;
    for (int i = 0; i < c->nlost && !landed; i++) {
        char lbuf[32];
        snprintf(lbuf, sizeof lbuf, "%llu", (unsigned long long) c->lost[i]);
        char *k = ll_store_key(st, "c:", lbuf);
        redisReply *t = k ? ll_redis_cmdf(st->redis, "HGET %s token", k) : NULL;
        if (t && t->type == REDIS_REPLY_STRING && strcmp(t->str, c->token) == 0) {
            landed = true;
            *version = c->lost[i];
            ll_info("store", "commit %llu ran although its reply was lost",
                    (unsigned long long) c->lost[i]);
        }
        if (t)
            freeReplyObject(t);
        free(k);
    }
    return landed;
}

/* WATCH seq, read it into *CUR and check the base versions.  0: go on with
 * the transaction; 1: the connection was re-made meanwhile, which drops
 * the WATCH silently: start the attempt over; -1: failed (a conflict is
 * ECONFLICT, the WATCH given back), the reason recorded. */
static int s_commit_watch(s_commit_t *c, uint64_t *cur)
{
    ll_store_t *st = c->st;
    redisReply *r = ll_redis_cmdf(st->redis, "WATCH %s", c->k_seq);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r)
            freeReplyObject(r);
        return ll_store_redis_fail(st, "commit failed (WATCH)");
    }
    freeReplyObject(r);
    unsigned long watched_on = ll_redis_reconnects(st->redis);
    r = ll_redis_cmdf(st->redis, "GET %s", c->k_seq);
    if (!r)
        return ll_store_redis_fail(st, "commit failed (GET)");
    *cur = ll_redis_u64(r);
    freeReplyObject(r);
    if (c->nbases > 0) {
        if (ll_redis_arg(&c->a, "HMGET") || ll_redis_arg(&c->a, c->k_ver))
            return ll_store_fail(st, LL_STORE_EIO, "out of memory");
        for (size_t i = 0; i < c->nbases; i++)
            if (ll_redis_arg(&c->a, c->bases[i].name))
                return ll_store_fail(st, LL_STORE_EIO, "out of memory");
        r = ll_redis_cmd(st->redis, c->a.argc, c->a.argv, c->a.lens);
        c->a.argc = 0;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != c->nbases) {
            if (r)
                freeReplyObject(r);
            return ll_store_redis_fail(st, "commit failed (HMGET)");
        }
        for (size_t i = 0; i < c->nbases; i++) {
            uint64_t have = ll_redis_u64(r->element[i]);
            if (have != c->bases[i].version) {
                ll_store_fail(st, LL_STORE_ECONFLICT,
                              "'%s' is at version %llu, not %llu as the commit expected",
                              c->bases[i].name, (unsigned long long) have,
                              (unsigned long long) c->bases[i].version);
                freeReplyObject(r);
                r = ll_redis_cmdf(st->redis, "UNWATCH");
                if (r)
                    freeReplyObject(r);
                return -1;
            }
        }
        freeReplyObject(r);
    }
    return ll_redis_reconnects(st->redis) != watched_on ? 1 : 0;
}

/* Queue the transaction that makes commit number VBUF: MULTI, every entry,
 * the version hash, the payload index, the deletes, seq, the commit record
 * K_COMMIT and the removal of the oldest kept record K_OLD (NULL: none).
 * Pipelined: nothing reaches Redis before EXEC is queued except what
 * hiredis flushes early (harmless: MULTI holds it).  *SENT counts the
 * replies to drain before EXEC's.  Returns nonzero when a command could
 * not be queued (out of memory, a broken connection). */
static int s_commit_queue(s_commit_t *c, const char *vbuf, const char *k_commit, const char *k_old,
                          int *sent)
{
    ll_redis_t *rd = c->st->redis;
    ll_redis_argv_t *a = &c->a;
    const ll_store_write_t *writes = c->writes;
    size_t nwrites = c->nwrites, ndeletes = c->ndeletes;
    int bad = 0;
    *sent = 0;
    bad |= ll_redis_arg(a, "MULTI") || ll_redis_send(rd, a);
    (*sent)++;
    for (size_t i = 0; i < nwrites && !bad; i++) {
        const ll_store_write_t *w = &writes[i];
        bad |= ll_redis_arg(a, "DEL") || ll_redis_arg(a, c->vkeys[i]) || ll_redis_send(rd, a);
        bad |= ll_redis_arg(a, "HSET") || ll_redis_arg(a, c->vkeys[i]) || ll_redis_arg(a, "ver") ||
               ll_redis_arg(a, vbuf) || ll_redis_arg(a, "blob") ||
               ll_redis_argn(a, w->blob ? w->blob : "", w->blob ? w->bloblen : 0) ||
               ll_redis_arg(a, "prefs") || ll_redis_arg(a, c->prefs_json[i]) ||
               ll_redis_arg(a, "refs") || ll_redis_arg(a, c->refs_json[i]) ||
               ll_redis_arg(a, "cell") || ll_redis_arg(a, c->cell_id) || ll_redis_send(rd, a);
        *sent += 2;
        if (c->st->history_on && !bad && ll_history_keeps(w, c->nwrites)) /* (ll_history.c) */
            bad |= ll_history_queue(c->st, a, c->vkeys[i], w, vbuf, c->prefs_json[i], c->cell_id,
                                    sent);
    }
    if (nwrites && !bad) {
        bad |= ll_redis_arg(a, "HSET") || ll_redis_arg(a, c->k_ver);
        for (size_t i = 0; i < nwrites && !bad; i++)
            bad |= ll_redis_arg(a, writes[i].name) || ll_redis_arg(a, vbuf);
        bad |= ll_redis_send(rd, a);
        (*sent)++;
        /* The payload index: what reclamation reads (one HVALS). */
        size_t with = 0;
        for (size_t i = 0; i < nwrites; i++)
            with += writes[i].nprefs > 0;
        if (with && !bad) {
            bad |= ll_redis_arg(a, "HSET") || ll_redis_arg(a, c->k_prefs);
            for (size_t i = 0; i < nwrites && !bad; i++)
                if (writes[i].nprefs)
                    bad |= ll_redis_arg(a, writes[i].name) || ll_redis_arg(a, c->prefs_json[i]);
            bad |= ll_redis_send(rd, a);
            (*sent)++;
        }
        if (with < nwrites && !bad) {
            bad |= ll_redis_arg(a, "HDEL") || ll_redis_arg(a, c->k_prefs);
            for (size_t i = 0; i < nwrites && !bad; i++)
                if (!writes[i].nprefs)
                    bad |= ll_redis_arg(a, writes[i].name);
            bad |= ll_redis_send(rd, a);
            (*sent)++;
        }
    }
    if (ndeletes && !bad) {
        bad |= ll_redis_arg(a, "DEL");
        for (size_t j = 0; j < ndeletes && !bad; j++)
            bad |= ll_redis_arg(a, c->vkeys[nwrites + j]);
        bad |= ll_redis_send(rd, a);
        bad |= ll_redis_arg(a, "HDEL") || ll_redis_arg(a, c->k_ver);
        for (size_t j = 0; j < ndeletes && !bad; j++)
            bad |= ll_redis_arg(a, c->deletes[j]);
        bad |= ll_redis_send(rd, a);
        bad |= ll_redis_arg(a, "HDEL") || ll_redis_arg(a, c->k_prefs);
        for (size_t j = 0; j < ndeletes && !bad; j++)
            bad |= ll_redis_arg(a, c->deletes[j]);
        bad |= ll_redis_send(rd, a);
        *sent += 3;
    }
    bad |= ll_redis_arg(a, "SET") || ll_redis_arg(a, c->k_seq) || ll_redis_arg(a, vbuf) ||
           ll_redis_send(rd, a);
    bad |= ll_redis_arg(a, "HSET") || ll_redis_arg(a, k_commit) || ll_redis_arg(a, "cell") ||
           ll_redis_arg(a, c->cell_id) || ll_redis_arg(a, "token") || ll_redis_arg(a, c->token) ||
           ll_redis_arg(a, "writes") || ll_redis_arg(a, c->writes_json) ||
           ll_redis_arg(a, "deletes") || ll_redis_arg(a, c->deletes_json) || ll_redis_send(rd, a);
    *sent += 2;
    if (k_old && !bad) {
        bad |= ll_redis_arg(a, "DEL") || ll_redis_arg(a, k_old) || ll_redis_send(rd, a);
        (*sent)++;
    }
    return bad;
}

/* Queue and EXEC the transaction that makes commit number NEXT (seq was
 * NEXT - 1 when watched), and read what came of it.  0: it ran; 1: try
 * again (another commit won the race, or the connection broke: NEXT is
 * remembered in C->lost when EXEC may have been sent); -1: failed, the
 * reason recorded. */
static int s_commit_exec(s_commit_t *c, uint64_t next)
{
    ll_store_t *st = c->st;
    char vbuf[32], oldc[64];
    snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long) next);
    char *k_commit = ll_store_key(st, "c:", vbuf);
    char *k_old = NULL;
    if (next > S_COMMIT_RECORDS_KEPT) {
        snprintf(oldc, sizeof oldc, "%llu", (unsigned long long) (next - S_COMMIT_RECORDS_KEPT));
        k_old = ll_store_key(st, "c:", oldc);
    }
    if (!k_commit || (next > S_COMMIT_RECORDS_KEPT && !k_old)) {
        free(k_commit);
        free(k_old);
        return ll_store_fail(st, LL_STORE_EIO, "out of memory");
    }
    int sent;
    int bad = s_commit_queue(c, vbuf, k_commit, k_old, &sent);
    free(k_old);
    free(k_commit);
    if (!bad)
        ll_store_fault("before_commit");
    bad |= ll_redis_arg(&c->a, "EXEC") || ll_redis_send(st->redis, &c->a);
    c->a.argc = 0;
    if (!bad && ll_store_fault_is("drop_after_exec"))
        ll_redis_fault_drop(st->redis);
    redisReply *exec = NULL;
    if (!bad && ll_redis_drain(st->redis, sent) == 0)
        exec = ll_redis_reply(st->redis);
    if (exec && ll_store_fault_is("lose_exec_reply")) { /* it ran; pretend we never heard */
        freeReplyObject(exec);
        exec = NULL;
        ll_redis_reset(st->redis);
    }
    if (!exec) {
        /* The connection broke: did EXEC run?  The commit record says
         * (checked at the top of the next attempt). */
        if (bad) {
            /* Nothing was sent, but half a transaction may sit in the
             * output buffer: throw the connection away, then retry. */
            ll_redis_reset(st->redis);
            return 1;
        }
        if (c->nlost == (int) (sizeof c->lost / sizeof c->lost[0]))
            return ll_store_fail(st, LL_STORE_EIO,
                                 "commit failed: the connection to Redis keeps breaking");
        c->lost[c->nlost++] = next;
        return 1;
    }
    int rc = 0;
    if (exec->type == REDIS_REPLY_NIL) { /* another commit won the race */
        rc = 1;
    } else if (exec->type != REDIS_REPLY_ARRAY) {
        rc = ll_store_fail(st, LL_STORE_EIO, "commit failed: Redis said %s",
                           exec->type == REDIS_REPLY_ERROR ? exec->str : "something unexpected");
    } else {
        for (size_t i = 0; i < exec->elements && rc == 0; i++)
            if (exec->element[i]->type == REDIS_REPLY_ERROR)
                /* MULTI/EXEC does not roll back; an error here means Redis
                 * refused a command (e.g. out of memory) */
                rc = ll_store_fail(st, LL_STORE_EIO, "commit failed inside the transaction: %s",
                                   exec->element[i]->str);
    }
    freeReplyObject(exec);
    return rc;
}

/* Step 2, the WATCH/EXEC retry loop.  Each attempt: make sure the
 * connection is up; if an earlier EXEC's reply was lost, look whether it
 * landed; WATCH seq and check the bases; then the transaction.  A
 * concurrent commit (EXEC answers nil), a re-made connection or a lost
 * reply means another attempt, up to 200.  0 with the commit number in
 * *VERSION (the cell landed once: a transaction whose reply was lost is
 * found by its token, not run again), or -1 with the reason recorded. */
static int s_commit_loop(s_commit_t *c, uint64_t *version)
{
    ll_store_t *st = c->st;
    for (int attempt = 0;; attempt++) {
        if (attempt == 200)
            return ll_store_fail(st, LL_STORE_EIO,
                                 "commit kept conflicting with other commits; gave up");
        if (ll_redis_ensure(st->redis) != 0)
            return ll_store_redis_fail(st, "commit failed");
        if (s_commit_landed(c, version))
            return 0;
        if (ll_history_on(st) < 0) /* one read per Store, at its first commit */
            return ll_store_redis_fail(st, "commit failed (history setting)");
        uint64_t cur = 0;
        int rc = s_commit_watch(c, &cur);
        if (rc < 0)
            return -1;
        if (rc > 0)
            continue;
        rc = s_commit_exec(c, cur + 1);
        if (rc < 0)
            return -1;
        if (rc == 0) {
            *version = cur + 1;
            return 0;
        }
    }
}

/* Step 3, release.  After a commit that landed (OK): count it, bump the
 * pool's commit epoch, then release the written payloads from the pending
 * list; the order matters (ll_pool.c DESIGN: a reclaimer that chose its
 * candidates before the commit must see the epoch move before the leases
 * go).  After a failure: leave no WATCH behind on a connection we reuse (a
 * broken one took its WATCH with it: no need to wait for a reconnect).
 * Either way give back the commit's own leases and free C. */
static void s_commit_release(s_commit_t *c, bool ok)
{
    ll_store_t *st = c->st;
    if (ok) {
        ll_store_fault("after_commit");
        st->commits++;
        ll_pool_commit_done(st->pool);
        /* The reserve of every process follows the session's saves. */
        ll_pool_note_save(st->pool, st->save_written);
        st->save_written = 0;
        for (size_t i = 0; i < c->nwrites; i++)
            for (size_t j = 0; j < c->writes[i].nprefs; j++)
                ll_store_pending_release(st, c->writes[i].prefs[j]);
    } else if (st->redis && ll_redis_connected(st->redis)) {
        redisReply *r = ll_redis_cmdf(st->redis, "UNWATCH");
        if (r)
            freeReplyObject(r);
    }
    for (size_t i = 0; i < c->nleased; i++)
        ll_pool_unlease(st->pool, c->leased[i]);
    free(c->leased);
    for (size_t i = 0; i < c->nwrites + c->ndeletes && c->vkeys; i++)
        free(c->vkeys[i]);
    for (size_t i = 0; i < c->nwrites; i++) {
        if (c->prefs_json)
            free(c->prefs_json[i]);
        if (c->refs_json)
            free(c->refs_json[i]);
    }
    free(c->vkeys);
    free(c->prefs_json);
    free(c->refs_json);
    free(c->names);
    free(c->writes_json);
    free(c->deletes_json);
    ll_redis_argv_free(&c->a);
    free(c->k_seq);
    free(c->k_ver);
    free(c->k_prefs);
}

int ll_store_commit(ll_store_t *st, const char *cell_id, const ll_store_write_t *writes,
                    size_t nwrites, const char *const *deletes, size_t ndeletes,
                    const ll_store_base_t *bases, size_t nbases, uint64_t *version)
{
    if (ll_store_enter(st) != 0)
        return -1;
    s_commit_t c = {.st = st,
                    .cell_id = cell_id ? cell_id : "",
                    .writes = writes,
                    .nwrites = nwrites,
                    .deletes = deletes,
                    .ndeletes = ndeletes,
                    .bases = bases,
                    .nbases = nbases};
    int rc = s_commit_lease(&c);
    if (rc == 0)
        rc = s_commit_loop(&c, version);
    s_commit_release(&c, rc == 0);
    ll_store_leave(st);
    return rc;
}

/* ---- reads ---------------------------------------------------------- */

/* One atomic read of NAMES: the EXEC reply (array of HMGET arrays). */
static redisReply *s_fetch_raw(ll_store_t *st, const char *const *names, size_t n)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (ll_redis_ensure(st->redis) != 0)
            return NULL;
        ll_redis_argv_t a = {0};
        int bad = ll_redis_arg(&a, "MULTI") || ll_redis_send(st->redis, &a);
        for (size_t i = 0; i < n && !bad; i++) {
            char *k = ll_store_key(st, "v:", names[i]);
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
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = -1;
    ll_store_entry_t *out = calloc(nnames ? nnames : 1, sizeof *out);
    size_t nout = 0;
    redisReply *exec = NULL;
    if (!out) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto done;
    }
    if (nnames == 0) {
        rc = 0;
        goto done;
    }
    exec = s_fetch_raw(st, names, nnames);
    if (!exec) {
        ll_store_redis_fail(st, "fetch failed");
        goto done;
    }
    if (exec->type != REDIS_REPLY_ARRAY || exec->elements != nnames) {
        ll_store_fail(st, LL_STORE_EIO, "fetch failed: Redis said %s",
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
            ll_store_fail(st, LL_STORE_EIO, "entry '%s' is damaged in Redis", names[i]);
            goto done;
        }
        o->blob = malloc(b->len ? b->len : 1);
        if (o->blob)
            memcpy(o->blob, b->str, b->len);
        o->bloblen = b->len;
        nout++;
        if (!o->blob || ll_store_json_parse_list(pr->str, pr->len, &o->prefs, &o->nprefs) != 0 ||
            ll_store_json_parse_list(rf->str, rf->len, &o->refs, &o->nrefs) != 0) {
            ll_store_fail(st, LL_STORE_EIO, "entry '%s' is damaged in Redis", names[i]);
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
    ll_store_leave(st);
    return rc;
}

int ll_store_versions(ll_store_t *st, char ***names, uint64_t **versions, size_t *n)
{
    *names = NULL;
    *versions = NULL;
    *n = 0;
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = -1;
    char *k = ll_store_key(st, "ver", NULL);
    redisReply *r = k ? ll_redis_cmdf(st->redis, "HGETALL %s", k) : NULL;
    free(k);
    if (!r) {
        ll_store_redis_fail(st, "versions failed");
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2) {
        ll_store_fail(st, LL_STORE_EIO, "versions failed: Redis said %s",
                      r->type == REDIS_REPLY_ERROR ? r->str : "something unexpected");
        goto out;
    }
    size_t m = r->elements / 2;
    *names = calloc(m ? m : 1, sizeof **names);
    *versions = calloc(m ? m : 1, sizeof **versions);
    if (!*names || !*versions) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m; i++) {
        (*names)[i] = strndup(r->element[2 * i]->str, r->element[2 * i]->len);
        (*versions)[i] = ll_redis_u64(r->element[2 * i + 1]);
        *n = i + 1;
        if (!(*names)[i]) {
            ll_store_fail(st, LL_STORE_EIO, "out of memory");
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
    ll_store_leave(st);
    return rc;
}

int ll_store_last_commit(ll_store_t *st, uint64_t *version, char **cell_id)
{
    *version = 0;
    *cell_id = NULL;
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = -1;
    char *k = ll_store_key(st, "seq", NULL);
    redisReply *r = k ? ll_redis_cmdf(st->redis, "GET %s", k) : NULL;
    free(k);
    if (!r) {
        ll_store_redis_fail(st, "last_commit failed");
        goto out;
    }
    *version = ll_redis_u64(r);
    freeReplyObject(r);
    if (*version) {
        char vbuf[32];
        snprintf(vbuf, sizeof vbuf, "%llu", (unsigned long long) *version);
        k = ll_store_key(st, "c:", vbuf);
        r = k ? ll_redis_cmdf(st->redis, "HGET %s cell", k) : NULL;
        free(k);
        if (!r) {
            ll_store_redis_fail(st, "last_commit failed");
            goto out;
        }
        if (r->type == REDIS_REPLY_STRING)
            *cell_id = strndup(r->str, r->len);
        freeReplyObject(r);
    }
    rc = 0;
out:
    ll_store_leave(st);
    return rc;
}

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
#include "store/ll_store_internal.h"

#define S_COMMIT_RECORDS_KEPT 1000

/* ---- commit ---------------------------------------------------------- */

int ll_store_commit(ll_store_t *st, const char *cell_id, const ll_store_write_t *writes,
                    size_t nwrites, const char *const *deletes, size_t ndeletes,
                    const ll_store_base_t *bases, size_t nbases, uint64_t *version)
{
    if (ll_store_enter(st) != 0)
        return -1;
    int rc = -1;
    char **prefs_json = calloc(nwrites + 1, sizeof *prefs_json);
    char **refs_json = calloc(nwrites + 1, sizeof *refs_json);
    char **vkeys = calloc(nwrites + ndeletes + 1, sizeof *vkeys);
    uint32_t *leased = NULL;
    size_t nleased = 0, cap_leased = 0;
    ll_redis_argv_t a = {0};
    char *k_seq = ll_store_key(st, "seq", NULL), *k_ver = ll_store_key(st, "ver", NULL);
    char *k_prefs = ll_store_key(st, "prefs", NULL);
    char *writes_json = NULL, *deletes_json = NULL;
    const char **names = calloc(nwrites + 1, sizeof *names);
    if (!prefs_json || !refs_json || !vkeys || !k_seq || !k_ver || !k_prefs || !names) {
        ll_store_fail(st, LL_STORE_EIO, "out of memory");
        goto out;
    }
    if (!cell_id)
        cell_id = "";
    /* Check the arguments and lease every region the commit will refer to,
     * so none can be reclaimed between here and EXEC. */
    for (size_t i = 0; i < nwrites; i++) {
        const ll_store_write_t *w = &writes[i];
        if (!w->name || !*w->name) {
            ll_store_fail(st, LL_STORE_EINVAL, "empty variable name");
            goto out;
        }
        for (size_t j = 0; j < ndeletes; j++)
            if (strcmp(deletes[j], w->name) == 0) {
                ll_store_fail(st, LL_STORE_EINVAL, "'%s' is both written and deleted", w->name);
                goto out;
            }
        for (size_t j = 0; j < i; j++)
            if (nwrites < 64 && strcmp(writes[j].name, w->name) == 0) {
                ll_store_fail(st, LL_STORE_EINVAL, "'%s' is written twice", w->name);
                goto out;
            }
        for (size_t j = 0; j < w->nprefs; j++) {
            size_t nb, n;
            uint64_t pool_id;
            ll_pool_region_t *regs;
            if (ll_store_ref_parse(w->prefs[j], &pool_id, &nb, &regs, &n) != 0) {
                ll_store_fail(st, LL_STORE_EINVAL, "'%s': not a payload ref: %.80s", w->name,
                              w->prefs[j]);
                goto out;
            }
            if (pool_id != ll_pool_id(st->pool)) {
                free(regs);
                ll_store_fail(st, LL_STORE_EGONE,
                              "'%s': payload is in another pool (the session's pool was recreated)",
                              w->name);
                goto out;
            }
            if (nleased + n > cap_leased) {
                cap_leased = (nleased + n) * 2 + 16;
                uint32_t *l = realloc(leased, cap_leased * sizeof *l);
                if (!l) {
                    free(regs);
                    ll_store_fail(st, LL_STORE_EIO, "out of memory");
                    goto out;
                }
                leased = l;
            }
            for (size_t k = 0; k < n; k++) {
                if (ll_pool_lease(st->pool, &regs[k]) != 0) {
                    ll_store_fail(st, LL_STORE_EGONE,
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
        prefs_json[i] = ll_store_json_list(w->prefs, w->nprefs);
        refs_json[i] = ll_store_json_list(w->refs, w->nrefs);
        vkeys[i] = ll_store_key(st, "v:", w->name);
        names[i] = w->name;
        if (!prefs_json[i] || !refs_json[i] || !vkeys[i]) {
            ll_store_fail(st, LL_STORE_EINVAL, "'%s': names and refs must be valid UTF-8 text",
                          w->name);
            goto out;
        }
    }
    for (size_t j = 0; j < ndeletes; j++) {
        if (!deletes[j] || !*deletes[j] ||
            !(vkeys[nwrites + j] = ll_store_key(st, "v:", deletes[j]))) {
            ll_store_fail(st, LL_STORE_EINVAL, "bad name to delete");
            goto out;
        }
    }
    writes_json = ll_store_json_list(names, nwrites);
    deletes_json = ll_store_json_list(deletes, ndeletes);
    if (!writes_json || !deletes_json) {
        ll_store_fail(st, LL_STORE_EINVAL, "names must be valid UTF-8 text");
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
            ll_store_fail(st, LL_STORE_EIO, "commit kept conflicting with other commits; gave up");
            goto out;
        }
        if (ll_redis_ensure(st->redis) != 0) {
            ll_store_redis_fail(st, "commit failed");
            goto out;
        }
        for (int i = 0; i < nlost && !landed; i++) {
            char lbuf[32];
            snprintf(lbuf, sizeof lbuf, "%llu", (unsigned long long) lost[i]);
            char *k = ll_store_key(st, "c:", lbuf);
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
            ll_store_redis_fail(st, "commit failed (WATCH)");
            goto out;
        }
        freeReplyObject(r);
        /* A reconnect after WATCH would silently drop it: start over. */
        unsigned long watched_on = ll_redis_reconnects(st->redis);
        r = ll_redis_cmdf(st->redis, "GET %s", k_seq);
        if (!r) {
            ll_store_redis_fail(st, "commit failed (GET)");
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
                ll_store_redis_fail(st, "commit failed (HMGET)");
                goto out;
            }
            for (size_t i = 0; i < nbases; i++) {
                uint64_t have = ll_redis_u64(r->element[i]);
                if (have != bases[i].version) {
                    ll_store_fail(st, LL_STORE_ECONFLICT,
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
        char *k_commit = ll_store_key(st, "c:", vbuf);
        char *k_old = NULL;
        if (next > S_COMMIT_RECORDS_KEPT) {
            snprintf(oldc, sizeof oldc, "%llu",
                     (unsigned long long) (next - S_COMMIT_RECORDS_KEPT));
            k_old = ll_store_key(st, "c:", oldc);
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
            ll_store_fault("before_commit");
        bad |= ll_redis_arg(&a, "EXEC") || ll_redis_send(st->redis, &a);
        a.argc = 0;
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
            free(k_commit);
            if (bad) {
                /* Nothing was sent, but half a transaction may sit in the
                 * output buffer: throw the connection away, then retry. */
                ll_redis_reset(st->redis);
                continue;
            }
            if (nlost == (int) (sizeof lost / sizeof lost[0])) {
                ll_store_fail(st, LL_STORE_EIO,
                              "commit failed: the connection to Redis keeps breaking");
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
            ll_store_fail(st, LL_STORE_EIO, "commit failed: Redis said %s",
                          exec->type == REDIS_REPLY_ERROR ? exec->str : "something unexpected");
            freeReplyObject(exec);
            goto out;
        }
        for (size_t i = 0; i < exec->elements; i++)
            if (exec->element[i]->type == REDIS_REPLY_ERROR) {
                /* MULTI/EXEC does not roll back; an error here means Redis
                 * refused a command (e.g. out of memory) */
                ll_store_fail(st, LL_STORE_EIO, "commit failed inside the transaction: %s",
                              exec->element[i]->str);
                freeReplyObject(exec);
                goto out;
            }
        freeReplyObject(exec);
        *version = next;
        break;
    }
    ll_store_fault("after_commit");
    st->commits++;
    /* Order matters (ll_pool.c DESIGN): epoch first, then drop leases. */
    ll_pool_commit_done(st->pool);
    for (size_t i = 0; i < nwrites; i++)
        for (size_t j = 0; j < writes[i].nprefs; j++)
            ll_store_pending_release(st, writes[i].prefs[j]);
    rc = 0;
    goto out;
oom:
    ll_store_fail(st, LL_STORE_EIO, "out of memory");
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
    ll_store_leave(st);
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

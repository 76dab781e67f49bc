/* ll_store_ref: payload refs as text, the JSON lists of them a variable's
 * entry stores in Redis, and the payloads this process holds uncommitted.
 * Any thread; the pending list under the store's mutex.
 *
 * A payload ref names the pool regions of one payload and their XXH3
 * hashes: "P1/<pool id>/<nbytes>/<idx>.<gen>.<hash>,..." (hex); the pool id
 * keeps a ref from resolving in a pool recreated under the same name, the
 * generation from resolving in a region reclaimed and reused since.  A put
 * holds its new payload (its regions leased) in the pending list until a
 * commit lists the ref or the caller discards it, so neither a reclaimer
 * nor a crash of another process can lose it; a crash of this process
 * drops its leases with it. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "store/ll_store_internal.h"

/* ---- payload refs --------------------------------------------------- */

/* Parse REF into its pool id, *NBYTES and a malloc'd region array.  0 or -1. */
int ll_store_ref_parse(const char *ref, uint64_t *pool_id, size_t *nbytes, ll_pool_region_t **regs,
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
    size_t n = (size_t) ((nb + LL_STORE_R - 1) / LL_STORE_R);
    /* Each region takes at least "i.g.h," in the text: a length the text
     * cannot hold is refused before anything is allocated for it (a
     * corrupt or hostile ref must not ask for gigabytes; found by
     * tests/fuzz/fuzz_store_meta.c). */
    if (n > UINT32_MAX || n > (strlen(p) + 1) / 6)
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

char *ll_store_ref_format(uint64_t pool_id, size_t nbytes, const ll_pool_region_t *regs, size_t n)
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
    if (!ref || ll_store_ref_parse(ref, &id, &nb, &r, &n) != 0)
        return -1;
    free(r);
    return (long long) nb;
}

/* ---- pending (uncommitted) payloads ---------------------------------- */

static uint64_t s_str_hash(const char *s)
{
    return XXH3_64bits(s, strlen(s));
}

void ll_store_pending_add(ll_store_t *st, char *ref_copy, uint32_t *idx, size_t n)
{
    ll_store_pending_t *p = malloc(sizeof *p);
    if (!p) { /* keep the leases: they die with the process */
        free(ref_copy);
        free(idx);
        return;
    }
    size_t b = s_str_hash(ref_copy) % LL_STORE_PENDING_BUCKETS;
    p->ref = ref_copy;
    p->idx = idx;
    p->n = n;
    p->next = st->pending[b];
    st->pending[b] = p;
    st->npending++;
}

/* Release the pending payload REF; false when there is none. */
bool ll_store_pending_release(ll_store_t *st, const char *ref)
{
    size_t b = s_str_hash(ref) % LL_STORE_PENDING_BUCKETS;
    for (ll_store_pending_t **pp = &st->pending[b]; *pp; pp = &(*pp)->next) {
        ll_store_pending_t *p = *pp;
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

void ll_store_pending_release_all(ll_store_t *st)
{
    for (size_t b = 0; b < LL_STORE_PENDING_BUCKETS; b++)
        while (st->pending[b])
            ll_store_pending_release(st, st->pending[b]->ref);
}

/* ---- JSON lists ---------------------------------------------------- */

char *ll_store_json_list(const char *const *items, size_t n)
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
int ll_store_json_parse_list(const char *text, size_t len, char ***items, size_t *n)
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

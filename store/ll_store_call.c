/* ll_store_call: what every store call stands on: entering a call (the
 * store's lock, its deadline for Redis, the reserve told the store is
 * busy) and leaving it, freeing the entries a read returns, the call's error (its kind says when Redis was gone
 * or silent, or the wait interrupted), the session's Redis keys, and fault
 * injection for the crash tests.  Below every other file of the store that
 * uses a store handle (ll_store.c, ll_history.c, ll_store_put.c,
 * ll_store_commit.c), so that each of them uses only lower ones. */
#include "store/ll_store.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_redis.h"
#include "store/ll_store_internal.h"

int ll_store_fail(ll_store_t *st, int kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->err, sizeof st->err, fmt, ap);
    va_end(ap);
    /* A failure the call met because Redis was gone or silent, or because
     * it was interrupted, says so to the caller, whatever step failed. */
    int why = kind == LL_STORE_EIO && st->redis ? ll_redis_failure(st->redis) : LL_REDIS_OK;
    st->errkind = why == LL_REDIS_UNAVAILABLE ? LL_STORE_EUNAVAIL
                  : why == LL_REDIS_CANCELLED ? LL_STORE_EINTR
                                              : kind;
    return -1;
}

int ll_store_redis_fail(ll_store_t *st, const char *what)
{
    return ll_store_fail(st, LL_STORE_EIO, "%s: %s", what, ll_redis_errstr(st->redis));
}

bool ll_store_fault_is(const char *step)
{
    const char *f = getenv("LL_STORE_FAULT");
    return f && strcmp(f, step) == 0;
}

/* Fault injection: SIGKILL ourselves when LL_STORE_FAULT names STEP. */
void ll_store_fault(const char *step)
{
    const char *f = getenv("LL_STORE_FAULT");
    if (f && strcmp(f, step) == 0) {
        ll_warn("store", "LL_STORE_FAULT=%s: killing this process", step);
        raise(SIGKILL);
    }
}

char *ll_store_key(ll_store_t *st, const char *a, const char *b)
{
    size_t n = strlen(st->prefix) + strlen(a) + (b ? strlen(b) : 0) + 1;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%s%s%s", st->prefix, a, b ? b : "");
    return k;
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
int ll_store_enter(ll_store_t *st)
{
    pthread_mutex_lock(&st->mu);
    st->errkind = LL_STORE_OK;
    st->err[0] = 0;
    if (getpid() != st->pid) {
        ll_store_fail(st, LL_STORE_EIO,
                      "this store was opened by process %d; open a new one after fork",
                      (int) st->pid);
        pthread_mutex_unlock(&st->mu);
        return -1;
    }
    if (st->pool)
        ll_pool_reserve_busy(st->pool); /* the reserve refills once we are idle */
    if (st->redis)
        ll_redis_begin(st->redis); /* the call's deadline */
    return 0;
}

void ll_store_set_cancel(ll_store_t *st, int fd, bool drain, bool (*check)(void *ctx), void *ctx)
{
    pthread_mutex_lock(&st->mu);
    ll_redis_set_cancel(st->redis, fd, drain, check, ctx);
    pthread_mutex_unlock(&st->mu);
}

void ll_store_leave(ll_store_t *st)
{
    pthread_mutex_unlock(&st->mu);
}

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

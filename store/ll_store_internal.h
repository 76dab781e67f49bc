/* ll_store_internal: what the files of the checkpoint store share and
 * nobody else should see: the store handle, the uncommitted payloads it
 * holds, and the calls between ll_store.c (open, close, reclamation,
 * stats), ll_store_ref.c (payload refs, JSON lists, pending payloads),
 * ll_store_put.c (put, discard, map) and ll_store_commit.c (commit and the
 * reads).  Every function here expects the store's mutex held (taken by
 * ll_store_enter) unless it says otherwise. */
#ifndef LL_STORE_INTERNAL_H
#define LL_STORE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "store/ll_pool.h"
#include "store/ll_redis.h"
#include "store/ll_redis_server.h"
#include "store/ll_store.h"

#define LL_STORE_R               LL_POOL_REGION_BYTES /* a region, for short */
#define LL_STORE_PENDING_BUCKETS 4096

/* An uncommitted payload this process holds (its regions leased). */
typedef struct ll_store_pending {
    struct ll_store_pending *next;
    char *ref;
    uint32_t *idx; /* one lease count per entry */
    size_t n;
} ll_store_pending_t;

struct ll_store_t {
    pthread_mutex_t mu; /* serializes calls */
    pid_t pid;          /* the process that opened it */
    char *runtime_dir;
    char *session;
    char *prefix; /* "ll:<session>:" */
    ll_redis_t *redis;
    bool redis_owned;        /* we started the private server */
    ll_redis_guard_t *guard; /* restarts it when it dies or stalls (owner only) */
    ll_pool_t *pool;
    ll_quota_t *quota; /* the user's ledger (ll_quota), NULL: not counted */
    ll_store_pending_t *pending[LL_STORE_PENDING_BUCKETS];
    size_t npending;
    char err[768]; /* last failure */
    int errkind;
    uint64_t bytes_written, bytes_shared, puts, commits, gc_runs, reclaimed;
    long long reserve_opt;  /* as ll_store_opts_t.reserve_bytes */
    size_t largest_put;     /* bytes the largest put wrote (default reserve policy) */
    size_t save_written;    /* bytes the puts since the last commit wrote */
    size_t reserve_regions; /* what the pool's reserve was asked to keep */
    bool history_known;     /* ll_history.c: ll:S:hon was read (or set) ... */
    bool history_on;        /* ... and says commits keep history */
};

/* ---- ll_store.c ------------------------------------------------------- */

/* Record a failure of KIND (ll_store_errkind_t) for ll_store_errstr.
 * Returns -1. */
int ll_store_fail(ll_store_t *st, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An EIO failure "WHAT: <the Redis connection's last error>".  -1. */
int ll_store_redis_fail(ll_store_t *st, const char *what);

/* Fault injection (tests): whether LL_STORE_FAULT names STEP; SIGKILL this
 * process when it does. */
bool ll_store_fault_is(const char *step);
void ll_store_fault(const char *step);

/* The key "ll:<session>:" A B (B may be NULL); malloc'd (caller frees), or
 * NULL when out of memory.  Any thread. */
char *ll_store_key(ll_store_t *st, const char *a, const char *b);

/* Lock ST, clear its error and check it is usable in this process (not a
 * fork child).  0 (locked), or -1 (unlocked, the reason recorded). */
int ll_store_enter(ll_store_t *st);
void ll_store_leave(ll_store_t *st);

/* Reclaim now (ll_pool_gc with the committed refs read from Redis).
 * Regions freed, or -1. */
int ll_store_gc_locked(ll_store_t *st);

/* Tell the pool's reserve how much free space to keep prefaulted, by the
 * store's reserve option and largest put (see ll_store.h). */
void ll_store_reserve_update(ll_store_t *st);

/* ---- ll_store_ref.c --------------------------------------------------- */

/* Parse REF into its pool id, *NBYTES and *REGS (malloc'd, caller frees;
 * NULL on failure) of *NREG regions.  0, or -1 for a malformed ref.  Any
 * thread. */
int ll_store_ref_parse(const char *ref, uint64_t *pool_id, size_t *nbytes, ll_pool_region_t **regs,
                       size_t *nreg);
/* The ref of a payload: malloc'd (caller frees), or NULL.  Any thread. */
char *ll_store_ref_format(uint64_t pool_id, size_t nbytes, const ll_pool_region_t *regs, size_t n);

/* Hold a payload uncommitted: takes ownership of REF_COPY and IDX (the
 * regions leased for it, one lease per entry; they are unleased when it is
 * released).  On allocation failure the leases stay (they die with the
 * process). */
void ll_store_pending_add(ll_store_t *st, char *ref_copy, uint32_t *idx, size_t n);
/* Release the pending payload REF; false when there is none. */
bool ll_store_pending_release(ll_store_t *st, const char *ref);
void ll_store_pending_release_all(ll_store_t *st);

/* A JSON list of N strings: malloc'd text (caller frees), or NULL (not
 * UTF-8, out of memory).  Any thread. */
char *ll_store_json_list(const char *const *items, size_t n);
/* Parse a JSON list of strings: *ITEMS gets a malloc'd array of malloc'd
 * strings (caller frees each and the array).  0 or -1.  Any thread. */
int ll_store_json_parse_list(const char *text, size_t len, char ***items, size_t *n);

#endif

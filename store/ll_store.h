/* ll_store: the checkpoint store's C interface.  Per-variable
 * entries in Redis (version, structure blob, payload refs, refs) committed
 * a cell at a time, payload bytes in the shared-memory pool (ll_pool).
 * Used by the _llstore Python module (ll_store_py.c) in the kernel, in
 * workers and in tests.  Thread-safe: calls on one store are serialized. */
#ifndef LL_STORE_H
#define LL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/ll_pool.h"

typedef struct ll_store_t ll_store_t;

/* Error kinds (ll_store_errkind); ll_store_errstr says the rest. */
typedef enum {
    LL_STORE_OK = 0,
    LL_STORE_EIO = 1,       /* Redis, system calls, corrupt data */
    LL_STORE_EFULL = 2,     /* the payload pool has no room */
    LL_STORE_EGONE = 3,     /* a payload's space was reclaimed since */
    LL_STORE_EINVAL = 4,    /* bad argument (e.g. a malformed payload ref) */
    LL_STORE_ECONFLICT = 5, /* base_versions did not match */
    LL_STORE_EUNAVAIL = 6,  /* Redis did not answer in time, or cannot be reached */
    LL_STORE_EINTR = 7,     /* the call was interrupted (ll_store_set_cancel) */
    LL_STORE_EQUOTA = 8,    /* the user's pools would hold more than the cap (ll_quota) */
} ll_store_errkind_t;

typedef struct {
    const char *redis_url; /* NULL: private redis-server of the runtime dir */
    size_t pool_bytes;     /* 0: LL_STORE_POOL_BYTES, else half of RAM, at most 16 GiB */
    const char *pool_path; /* NULL: /dev/shm/looseleaf-<uid>-<hash>-<session>.pool */
    /* Free pool space kept prefaulted in the background (ll_pool_reserve):
     * 0 = the default policy (LL_STORE_RESERVE_DEFAULT), < 0 = none, > 0 = keep
     * this many bytes (rounded up to regions, at most the pool). */
    long long reserve_bytes;
} ll_store_opts_t;

/* The default reserve: as much as the largest put of this process, or the
 * most one commit of the session (any process) wrote, whichever is more;
 * at least 16 MiB in the session's owner (the Store that started the
 * private redis-server: the kernel), at most half the pool and 2 GiB.  So
 * it starts small and grows with what the session saves; the next save of
 * that size finds its space prefaulted.  What it holds counts against the
 * user's cap (ll_quota), of which it leaves a quarter to saves. */
#define LL_STORE_RESERVE_DEFAULT   0
#define LL_STORE_RESERVE_OWNER_MIN ((size_t) 16 << 20)
#define LL_STORE_RESERVE_MAX       ((size_t) 2 << 30)

/* A size such as "64G", "512M", "1073741824" (K, M, G, T: binary; "iB" or
 * "B" may follow) into *OUT.  0, or -1 when TEXT is none. */
int ll_store_parse_bytes(const char *text, size_t *out);

/* Open session SESSION of RUNTIME_DIR.  Returns a store the caller destroys
 * (ll_store_destroy), or NULL with a reason in ERR. */
ll_store_t *ll_store_open(const char *runtime_dir, const char *session, const ll_store_opts_t *opts,
                          char *err, size_t errlen);

/* The page kind ("hugetlb", "thp" or "4k") a new pool of POOL_BYTES (0: the
 * default size) would get on this host, made by the session's owner (OWNER)
 * or another process, with the reason in WHY: LL_STORE_PAGE_KIND (auto,
 * hugetlb, 4k), huge pages free or allowed as surplus, shmem THP.  0, or -1
 * (WHY says why) for a bad LL_STORE_PAGE_KIND or a kind this process cannot
 * make.  A store open may still fall back to 4k when huge pages counted as
 * available do not come (see API.md). */
int ll_store_page_kind_choice(size_t pool_bytes, bool owner, char kind[16], char *why,
                              size_t whylen);

/* What ends a call that waits for Redis before its timeout (LL_STORE_TIMEOUT_S,
 * default 10 s; see ll_redis_set_cancel): FD becoming readable (DRAIN: an
 * eventfd or pipe of interrupts emptied at the start of each call, so only
 * an interrupt during the call counts) and CHECK(CTX) returning true (asked
 * every 100 ms of a wait).  The call then fails with LL_STORE_EINTR. */
void ll_store_set_cancel(ll_store_t *store, int fd, bool drain, bool (*check)(void *ctx),
                         void *ctx);

/* Release leases, stop an owned redis-server, free; nulls *STORE_P. */
void ll_store_destroy(ll_store_t **store_p);

/* The last failure of a call on STORE (the store's buffer: read it before
 * the next call). */
const char *ll_store_errstr(ll_store_t *store);
int ll_store_errkind(ll_store_t *store);

/* Copy LEN bytes at DATA into the pool; with BASE_REF (a ref of an earlier
 * payload) regions whose hash matches are shared.  DIRTY (NULL, or one flag
 * per region; needs BASE_REF of the same length) says which regions may
 * have changed: the others are shared with the base without being hashed
 * (the caller vouches for them).  Returns a malloc'd ref (caller frees) and
 * the bytes copied in *WRITTEN, or NULL. */
char *ll_store_put(ll_store_t *store, const void *data, size_t len, const char *base_ref,
                   const uint8_t *dirty, size_t *written);

/* A payload written in pieces, for bytes that are not in this process's
 * memory all at once (a device's changed regions, copied out through a
 * pair of staging buffers while the store copies the last pair in).
 * BEGIN allocates what a put of LEN bytes with BASE_REF and DIRTY (as
 * ll_store_put) would write; the regions the caller must write are those
 * DIRTY names (all without a base), and any the base lost meanwhile:
 * ll_store_writer_needed lists them.  WRITE copies N of them, region
 * IDX[k] at SRC + k * 2 MiB, on the put's threads; FINISH shares a written
 * region whose hash is the base's after all and returns the ref
 * (malloc'd, the caller's; *WRITTEN: bytes copied), held as a put's;
 * ABORT gives everything back.  FINISH and ABORT free *W_P and null it.
 * The writer must end before its store is destroyed.  NULL / -1 with the
 * reason in the store's error, as for a put. */
typedef struct ll_store_writer ll_store_writer_t;
ll_store_writer_t *ll_store_writer_begin(ll_store_t *store, size_t len, const char *base_ref,
                                         const uint8_t *dirty);
/* The regions still to write into IDX (NULL: only count them; else room
 * for every region of the payload).  Returns how many. */
size_t ll_store_writer_needed(const ll_store_writer_t *w, size_t *idx);
int ll_store_writer_write(ll_store_writer_t *w, const size_t *idx, size_t n, const void *src,
                          size_t srclen);
char *ll_store_writer_finish(ll_store_writer_t **w_p, size_t *written);
void ll_store_writer_abort(ll_store_writer_t **w_p);

/* Give back an uncommitted payload.  0, or -1 when REF is not pending. */
int ll_store_discard(ll_store_t *store, const char *ref);

/* Map a payload (see ll_pool_map).  Returns a mapping the caller unmaps
 * (ll_pool_unmap; it may outlive the store), or NULL on failure. */
ll_pool_map_t *ll_store_map(ll_store_t *store, const char *ref, bool writable);

/* Length of the payload a ref names, or -1 if REF is malformed. */
long long ll_store_ref_nbytes(const char *ref);

/* One variable written by a commit; PREFS payload refs, REFS names. */
typedef struct {
    const char *name;
    const void *blob;
    size_t bloblen;
    const char *const *prefs;
    size_t nprefs;
    const char *const *refs;
    size_t nrefs;
} ll_store_write_t;

/* Expected current version of NAME (0: must not exist). */
typedef struct {
    const char *name;
    uint64_t version;
} ll_store_base_t;

/* Commit every write and delete of cell CELL_ID atomically.  All written
 * names get version *VERSION (greater than every earlier version).  Returns
 * 0, or -1 (ECONFLICT when BASES do not match; nothing written). */
int ll_store_commit(ll_store_t *store, const char *cell_id, const ll_store_write_t *writes,
                    size_t nwrites, const char *const *deletes, size_t ndeletes,
                    const ll_store_base_t *bases, size_t nbases, uint64_t *version);

/* One committed entry, as fetched. */
typedef struct {
    char *name;
    uint64_t version;
    char *blob;
    size_t bloblen;
    char **prefs;
    size_t nprefs;
    char **refs;
    size_t nrefs;
} ll_store_entry_t;

/* Fetch NAMES in one atomic read.  *ENTRIES gets an array of the names that
 * exist (in NAMES order), *NENTRIES its length; free with
 * ll_store_entries_free.  0 or -1. */
int ll_store_fetch(ll_store_t *store, const char *const *names, size_t nnames,
                   ll_store_entry_t **entries, size_t *nentries);
void ll_store_entries_free(ll_store_entry_t *entries, size_t n);

/* Every committed name with its version: parallel malloc'd arrays of *N
 * entries; the caller frees each name and both arrays.  0 or -1. */
int ll_store_versions(ll_store_t *store, char ***names, uint64_t **versions, size_t *n);

/* Newest commit: version and cell id (malloc'd, the caller frees; NULL
 * when none).  0 or -1. */
int ll_store_last_commit(ll_store_t *store, uint64_t *version, char **cell_id);

/* Back and prefault up to NBYTES of free pool space in this process ahead
 * of a save (idle time); returns the bytes prefaulted, or -1. */
long long ll_store_prefault(ll_store_t *store, size_t nbytes);

/* Keep NBYTES of free pool space prefaulted in the background from now on
 * (see ll_store_opts_t.reserve_bytes: 0 = default policy, < 0 = none).  0/-1. */
int ll_store_set_reserve(ll_store_t *store, long long nbytes);

/* Reclaim unused regions now; returns how many, or -1. */
int ll_store_gc(ll_store_t *store);

/* Delete every key of the session and the pool file. 0 or -1. */
int ll_store_delete_session(ll_store_t *store);

typedef struct {
    ll_pool_stats_t pool;
    uint64_t bytes_written; /* copied into the pool by puts */
    uint64_t bytes_shared;  /* of puts, shared with their base instead */
    uint64_t puts;
    uint64_t commits;
    uint64_t gc_runs;
    uint64_t regions_reclaimed;
    unsigned long redis_reconnects;
    size_t pending; /* uncommitted payloads held */
    const char *redis_url;
    bool redis_owned; /* this store started the redis-server */
} ll_store_stats_t;
/* (The reserve: pool.reserve_target and pool.reserve_ready, in regions.)
 * The strings in *OUT are the store's: valid while it is open. */
void ll_store_stats(ll_store_t *store, ll_store_stats_t *out);

/* The _llstore module's init function (ll_store_py.c), for
 * ll_interp_add_builtin("_llstore", ll_store_pyinit).  Returns a new
 * module object (PyObject *), NULL with a Python exception set. */
void *ll_store_pyinit(void);

/* Fault injection for tests: LL_STORE_FAULT=after_payload|before_commit|
 * after_commit makes the process SIGKILL itself at that step. */

#endif

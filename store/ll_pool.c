/* ll_pool: the payload pool (see ll_pool.h).  Runs in every process of a
 * session that saves or restores payloads, on whatever thread calls it.
 *
 * DESIGN
 * ------
 * The pool is one shared-memory file: a header, then NREGIONS regions of
 * 2 MiB.  The header holds, per region, three 64-bit atomic words:
 *
 *   state = gen << 3 | BACKED | FREE, ALLOC, FREEING or TRIM
 *   lease = one bit per process slot that holds the region
 *   trims = how many times its memory was given back (see Memory)
 *
 * and a table of LL_POOL_MAX_PROCS process slots, each (start time << 22 |
 * pid) of its owner, so a slot whose owner died (pid gone, or reused by a
 * process with another start time) can be recognised and emptied.  Nothing
 * in the file is protected by a lock: a process killed at any instant can
 * leave behind only lease bits of a dead slot and ALLOC regions no commit
 * refers to, both of which reclamation undoes.
 *
 * Allocation (free regions this process already prefaulted first, so a
 * steady-state save does not fault; then backed free regions, lowest
 * first; a fresh one only when none is left): set my lease bit, then CAS
 * state FREE(g) -> ALLOC(g+1).  The
 * new generation makes any older reference to the index stale, so a reader
 * holding a reference from before can never map someone else's bytes.
 * Before writing, the writer backs the region (ll_pool_back: fallocate, or
 * MADV_POPULATE_WRITE with shmem THP in "advise" mode): a full /dev/shm or
 * no more huge pages is an error then, never a SIGBUS later.  Only the
 * allocating process writes a region, and only before it is committed;
 * after that the bytes never change.
 *
 * Lease (a reader mapping a payload, a writer reusing a base region, a commit
 * in flight): set my bit, then check state == ALLOC(gen).  Reclamation of a
 * candidate does the mirror image: CAS ALLOC(g) -> FREEING(g), then check the
 * lease word is 0, then CAS to FREE(g) (or back to ALLOC(g)).  With sequentially
 * consistent atomics either the leaser sees FREEING/FREE (and gives up, or
 * waits for FREEING to resolve) or the reclaimer sees the bit (and backs off):
 * the Dekker pattern.  Which regions committed versions use lives in Redis;
 * ll_pool_gc asks its caller for that set *after* choosing candidates.  A
 * commit that lands meanwhile bumps the header's epoch after EXEC and before
 * its writer drops its leases; the reclaimer gives up when the epoch moved,
 * so a region is never freed on the strength of a stale reference set.
 *
 * When reclamation runs, which versions it may free, and what a region's
 * memory counts in the user's ledger (BACKED, trims): ll_pool_reclaim.c.
 *
 * Mapping for readers: reserve an address range, then MAP_FIXED each run of
 * consecutive regions into it, so a payload scattered over the pool reads as
 * one contiguous buffer without a copy.  The mapping holds leases on its
 * regions until it is unmapped.
 *
 * Page kinds (MEASURED.md: 4 KiB first touch runs at 0.33 GB/s): a pool on a
 * hugetlbfs mount (or memfd:hugetlb) uses 2 MiB pages; a tmpfs mount whose
 * huge= option (or shmem_enabled=force) allows THP gets MADV_HUGEPAGE; else
 * 4 KiB pages, prefaulted per region (by the reserve ahead of time, else
 * by ll_pool_back right before the copy) so the copy itself does not
 * fault.  Which kind a new pool gets is ll_pagekind's decision.
 *
 * Files, lowest first (each uses only those before it): a region's memory
 * (back, prefault, punch), ll_pool_pages.c; the reserve thread that
 * prefaults free regions ahead of saves, ll_pool_reserve.c; this one (open,
 * allocate, lease, map); reclamation and giving memory back,
 * ll_pool_reclaim.c; the self-test, ll_pool_selftest.c.  The header layout
 * and the handle they share: ll_pool_internal.h. */
#include "store/ll_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_mman.h"
#include "base/ll_clock.h"
#include "store/ll_pool_internal.h"

#define S_HUGETLBFS_MAGIC 0x958458f6
#define S_TMPFS_MAGIC     0x01021994

#define S_MAGIC         "LLPOOL03"
#define S_PID_BITS      22
#define S_SLOT_CLEANING UINT64_MAX

struct ll_pool_map_t {
    ll_pool_t *pool; /* holds a reference */
    char *addr;      /* start of the consecutive mapping */
    size_t maplen;   /* nreg * region bytes */
    size_t nbytes;   /* payload length */
    uint32_t *idx;   /* leased regions */
    size_t nreg;
};

static char s_zero_byte; /* address of an empty mapping */

static size_t s_round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* Start time (clock ticks since boot) of PID, 0 when it does not exist. */
static uint64_t s_proc_start(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    /* Fields after the command name, which may contain spaces and ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    /* state is field 3, starttime field 22: skip 19 more fields. */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p + 1, ' ');
    }
    if (!p)
        return 0;
    return strtoull(p + 1, NULL, 10);
}

static uint64_t s_slot_word(pid_t pid)
{
    uint64_t start = s_proc_start(pid) & ((UINT64_C(1) << (64 - S_PID_BITS)) - 1);
    return start << S_PID_BITS | (uint64_t) pid;
}

static bool s_slot_alive(uint64_t word)
{
    if (word == 0 || word == S_SLOT_CLEANING)
        return true; /* free, or being emptied by someone: not ours to touch */
    pid_t pid = (pid_t) (word & ((UINT64_C(1) << S_PID_BITS) - 1));
    return s_slot_word(pid) == word;
}

void ll_pool_clean_dead_slots(ll_pool_t *pool)
{
    for (int s = 0; s < LL_POOL_MAX_PROCS; s++) {
        uint64_t w = atomic_load(&pool->hdr->slots[s]);
        if (s_slot_alive(w))
            continue;
        /* One cleaner only: a second one clearing bits after the slot was
         * reused would steal the new owner's leases. */
        if (!atomic_compare_exchange_strong(&pool->hdr->slots[s], &w, S_SLOT_CLEANING))
            continue;
        uint64_t mask = ~(UINT64_C(1) << s);
        for (size_t i = 0; i < pool->nregions; i++)
            atomic_fetch_and(&pool->lease[i], mask);
        ll_info("store", "pool: dropped the leases of dead process %d",
                (int) (w & ((UINT64_C(1) << S_PID_BITS) - 1)));
        atomic_store(&pool->hdr->slots[s], 0);
    }
}

static int s_claim_slot(ll_pool_t *pool)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int s = 0; s < LL_POOL_MAX_PROCS; s++) {
            uint64_t expect = 0;
            if (atomic_compare_exchange_strong(&pool->hdr->slots[s], &expect, pool->me))
                return s;
        }
        ll_pool_clean_dead_slots(pool);
    }
    return -1;
}

/* "hugetlb", "thp" or "4k" for a pool file on the file system of FD; sets
 * *ADVISE when THP needs MADV_HUGEPAGE. */
static void s_detect_kind(int fd, char kind[16], bool *advise)
{
    struct statfs sfs;
    *advise = false;
    snprintf(kind, 16, "4k");
    if (fstatfs(fd, &sfs) != 0)
        return;
    if ((unsigned long) sfs.f_type == S_HUGETLBFS_MAGIC) {
        snprintf(kind, 16, "hugetlb");
        return;
    }
    if ((unsigned long) sfs.f_type != S_TMPFS_MAGIC)
        return;
    char buf[256] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            buf[0] = 0;
        fclose(f);
    }
    if (strstr(buf, "[force]")) {
        snprintf(kind, 16, "thp");
        return;
    }
    /* The tmpfs mount's own huge= option decides for files on it. */
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        unsigned maj, min;
        if (sscanf(line, "%*s %*s %u:%u", &maj, &min) != 2)
            continue;
        if (maj != major(st.st_dev) || min != minor(st.st_dev))
            continue;
        if (strstr(line, "huge=always") || strstr(line, "huge=within_size")) {
            snprintf(kind, 16, "thp");
        } else if (strstr(line, "huge=advise")) {
            snprintf(kind, 16, "thp");
            *advise = true;
        }
        break;
    }
    fclose(f);
}

static int s_fail(char *err, size_t errlen, const char *fmt, const char *a, int e)
{
    snprintf(err, errlen, fmt, a, strerror(e));
    return -1;
}

/* Initialise a new (empty) pool file: size, header, backing of the header. */
static int s_init_file(int fd, size_t pool_bytes, const char *path, const char *kind, char *err,
                       size_t errlen)
{
    size_t nregions = pool_bytes / LL_POOL_REGION_BYTES;
    if (nregions == 0)
        nregions = 1;
    if (nregions > UINT32_MAX) {
        snprintf(err, errlen, "pool of %zu bytes is too large", pool_bytes);
        return -1;
    }
    size_t hdr_len = sizeof(ll_pool_hdr_t) + 3 * sizeof(uint64_t) * nregions;
    size_t data_offset = s_round_up(hdr_len, LL_POOL_REGION_BYTES);
    size_t file_len = data_offset + nregions * LL_POOL_REGION_BYTES;
    if (ftruncate(fd, (off_t) file_len) != 0)
        return s_fail(err, errlen, "cannot size pool %s: %s", path, errno);
    int rc = posix_fallocate(fd, 0, (off_t) data_offset);
    if (rc != 0)
        return s_fail(err, errlen, "cannot reserve the header of pool %s: %s", path, rc);
    ll_pool_hdr_t *hdr = mmap(NULL, data_offset, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (hdr == MAP_FAILED)
        return s_fail(err, errlen, "cannot map pool %s: %s", path, errno);
    memset(hdr, 0, hdr_len);
    hdr->region_bytes = (uint32_t) LL_POOL_REGION_BYTES;
    hdr->nregions = nregions;
    hdr->data_offset = data_offset;
    while (hdr->id == 0)
        if (getrandom(&hdr->id, sizeof hdr->id, 0) != (ssize_t) sizeof hdr->id)
            hdr->id = (uint64_t) time(NULL) ^ ((uint64_t) getpid() << 32) ^ (uintptr_t) hdr;
    bool advise;
    if (kind)
        snprintf(hdr->page_kind, sizeof hdr->page_kind, "%s", kind);
    else
        s_detect_kind(fd, hdr->page_kind, &advise);
    atomic_thread_fence(memory_order_seq_cst);
    memcpy(hdr->magic, S_MAGIC, 8); /* last: marks the pool usable */
    munmap(hdr, data_offset);
    return 0;
}

/* Free what a pool handle owns in this process once its mapping and fd are
 * gone (or were never made): shared by a failed open and the last unref. */
static void s_pool_free(ll_pool_t *pool)
{
    free(pool->counts);
    free(pool->populated);
    free(pool->warm);
    free(pool->path);
    pthread_mutex_destroy(&pool->mu);
    ll_pool_reserve_fini(pool);
    free(pool);
}

/* A handle for PATH with nothing opened yet, or NULL (out of memory). */
static ll_pool_t *s_pool_new(const char *path)
{
    ll_pool_t *pool = calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    pool->fd = -1;
    pool->slot = -1;
    pool->path = strdup(path);
    pthread_mutex_init(&pool->mu, NULL);
    ll_pool_reserve_init(pool);
    atomic_store(&pool->refs, 1);
    return pool;
}

/* Make a new nameless pool for PATH "memfd:hugetlb|thp|4k" into POOL->fd.
 * 0, or -1 with a reason (POOL->fd, if open, is the caller's to close). */
static int s_create_memfd(ll_pool_t *pool, const char *path, size_t pool_bytes, char *err,
                          size_t errlen)
{
    const char *want = path + 6;
    unsigned flags = MFD_CLOEXEC;
    if (strcmp(want, "hugetlb") == 0)
        flags |= MFD_HUGETLB;
    else if (strcmp(want, "thp") != 0 && strcmp(want, "4k") != 0) {
        snprintf(err, errlen, "unknown pool kind %s (memfd:hugetlb|thp|4k)", path);
        return -1;
    }
    pool->fd = memfd_create("looseleaf-pool", flags);
    if (pool->fd < 0)
        return s_fail(err, errlen, "memfd_create for %s failed: %s", path, errno);
    pool->nameless = true;
    fchmod(pool->fd, 0600); /* others reach it through /proc/<pid>/fd */
    if (s_init_file(pool->fd, pool_bytes, path, want, err, errlen) != 0)
        return -1;
    pool->thp_advise = strcmp(want, "thp") == 0;
    return 0;
}

/* Open the pool file PATH into POOL->fd, creating and initialising it when
 * it is new (*CREATED then true), under an exclusive flock so that two
 * processes opening a new pool initialise it once.  0, or -1 with a reason
 * (POOL->fd, if open, is the caller's to close). */
static int s_open_file(ll_pool_t *pool, const char *path, size_t pool_bytes, bool *created,
                       char *err, size_t errlen)
{
    /* /proc/<pid>/fd/<n> is how other processes reach a memfd pool: a
     * link to follow, never a file to create. */
    bool proc = strncmp(path, "/proc/", 6) == 0;
    pool->fd = open(path, O_RDWR | O_CLOEXEC | (proc ? 0 : O_CREAT | O_NOFOLLOW), 0600);
    if (pool->fd < 0)
        return s_fail(err, errlen, "cannot open pool %s: %s", path, errno);
    /* Serialise initialisation between processes opening a new pool. */
    if (flock(pool->fd, LOCK_EX) != 0)
        return s_fail(err, errlen, "cannot lock pool %s: %s", path, errno);
    int rc = -1;
    struct stat st;
    if (fstat(pool->fd, &st) != 0) {
        s_fail(err, errlen, "cannot stat pool %s: %s", path, errno);
        goto out_unlock;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077)) {
        snprintf(err, errlen, "pool %s must be owned by this user with mode 0600", path);
        goto out_unlock;
    }
    /* A creator killed inside s_init_file (after sizing the file, before
     * its magic, written last) leaves a file no process can have used:
     * initialise it again rather than refuse it for ever. */
    ll_pool_hdr_t head;
    static const char zero_magic[8];
    bool unfinished = (size_t) st.st_size >= sizeof head &&
                      pread(pool->fd, &head, sizeof head, 0) == (ssize_t) sizeof head &&
                      memcmp(head.magic, zero_magic, 8) == 0;
    if (unfinished && ftruncate(pool->fd, 0) == 0)
        st.st_size = 0;
    if (st.st_size == 0) {
        if (s_init_file(pool->fd, pool_bytes, path, NULL, err, errlen) != 0) {
            if (ftruncate(pool->fd, 0) != 0) {
                /* nothing more to undo */
            }
            goto out_unlock;
        }
        *created = true;
    }
    rc = 0;
out_unlock:
    flock(pool->fd, LOCK_UN);
    return rc;
}

/* Check the header of the pool open on POOL->fd, map the whole file and
 * point the handle's fields into it.  0, or -1 with a reason (nothing
 * mapped). */
static int s_map_file(ll_pool_t *pool, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(pool->fd, &st) != 0 || (size_t) st.st_size < sizeof(ll_pool_hdr_t)) {
        snprintf(err, errlen, "pool %s is truncated", path);
        return -1;
    }
    ll_pool_hdr_t peek;
    if (pread(pool->fd, &peek, sizeof peek, 0) != (ssize_t) sizeof peek ||
        memcmp(peek.magic, S_MAGIC, 8) != 0 || peek.region_bytes != LL_POOL_REGION_BYTES) {
        snprintf(err, errlen, "%s is not a LooseLeaf pool", path);
        return -1;
    }
    size_t file_len = peek.data_offset + peek.nregions * LL_POOL_REGION_BYTES;
    if ((size_t) st.st_size != file_len ||
        peek.data_offset < sizeof(ll_pool_hdr_t) + 3 * sizeof(uint64_t) * peek.nregions) {
        snprintf(err, errlen, "pool %s has an inconsistent header", path);
        return -1;
    }
    pool->base =
        mmap(NULL, file_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, pool->fd, 0);
    if (pool->base == MAP_FAILED) {
        pool->base = NULL;
        return s_fail(err, errlen, "cannot map pool %s: %s", path, errno);
    }
    pool->file_len = file_len;
    pool->hdr = (ll_pool_hdr_t *) pool->base;
    pool->nregions = peek.nregions;
    pool->data = pool->base + peek.data_offset;
    pool->state = (_Atomic uint64_t *) (pool->hdr + 1);
    pool->lease = pool->state + pool->nregions;
    pool->trims = pool->lease + pool->nregions;
    snprintf(pool->page_kind, sizeof pool->page_kind, "%.15s", peek.page_kind);
    if (!pool->nameless) {
        char kind[16];
        s_detect_kind(pool->fd, kind, &pool->thp_advise);
    }
    if (strcmp(pool->page_kind, "thp") == 0)
        madvise(pool->data, pool->nregions * LL_POOL_REGION_BYTES, MADV_HUGEPAGE);
    return 0;
}

/* This process's side of a mapped pool: its bookkeeping and a process
 * slot for its lease bits.  0, or -1 with a reason. */
static int s_join(ll_pool_t *pool, const char *path, char *err, size_t errlen)
{
    pool->counts = calloc(pool->nregions, sizeof *pool->counts);
    pool->populated = calloc(pool->nregions, sizeof *pool->populated);
    pool->warm = calloc(pool->nregions, sizeof *pool->warm);
    if (!pool->counts || !pool->populated || !pool->warm) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pool->pid = getpid();
    snprintf(pool->share_path, sizeof pool->share_path, "/proc/%d/fd/%d", (int) pool->pid,
             pool->fd);
    pool->me = s_slot_word(pool->pid);
    pool->slot = s_claim_slot(pool);
    if (pool->slot < 0) {
        snprintf(err, errlen, "pool %s: all %d process slots are held by live processes", path,
                 LL_POOL_MAX_PROCS);
        return -1;
    }
    return 0;
}

ll_pool_t *ll_pool_open(const char *path, size_t pool_bytes, char *err, size_t errlen)
{
    if (!path || !*path) {
        snprintf(err, errlen, "pool path is empty");
        return NULL;
    }
    ll_pool_t *pool = s_pool_new(path);
    if (!pool) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    bool created = false;
    if (strncmp(path, "memfd:", 6) == 0) {
        if (s_create_memfd(pool, path, pool_bytes, err, errlen) != 0)
            goto out_close;
        created = true;
    } else if (s_open_file(pool, path, pool_bytes, &created, err, errlen) != 0) {
        goto out_close;
    }
    if (s_map_file(pool, path, err, errlen) != 0)
        goto out_close;
    if (s_join(pool, path, err, errlen) != 0)
        goto out_unmap;
    ll_debug("store", "pool %s opened (%s, %zu regions, %s, slot %d)", path,
             created ? "created" : "existing", pool->nregions, pool->page_kind, pool->slot);
    return pool;

out_unmap:
    munmap(pool->base, pool->file_len);
out_close:
    if (pool->fd >= 0)
        close(pool->fd);
    if (created && !pool->nameless)
        unlink(path);
    s_pool_free(pool);
    return NULL;
}

static void s_pool_unref(ll_pool_t *pool)
{
    if (atomic_fetch_sub(&pool->refs, 1) != 1)
        return;
    if (pool->slot >= 0 && getpid() == pool->pid) {
        uint64_t bit = UINT64_C(1) << pool->slot;
        for (size_t i = 0; i < pool->nregions; i++)
            if (pool->counts[i])
                atomic_fetch_and(&pool->lease[i], ~bit);
        uint64_t expect = pool->me;
        atomic_compare_exchange_strong(&pool->hdr->slots[pool->slot], &expect, 0);
    }
    munmap(pool->base, pool->file_len);
    close(pool->fd);
    s_pool_free(pool);
}

void ll_pool_destroy(ll_pool_t **pool_p)
{
    if (!pool_p || !*pool_p)
        return;
    ll_pool_reserve_stop(*pool_p);
    s_pool_unref(*pool_p);
    *pool_p = NULL;
}

int ll_pool_make_nameless(ll_pool_t *pool)
{
    if (pool->nameless)
        return 0;
    if (unlink(pool->path) != 0 && errno != ENOENT)
        return -1;
    pool->nameless = true;
    return 0;
}

int ll_pool_unlink(ll_pool_t *pool)
{
    if (pool->nameless)
        return 0;
    if (unlink(pool->path) != 0 && errno != ENOENT)
        return -1;
    return 0;
}

void ll_pool_warm_counts(ll_pool_t *pool, size_t *free_warm, size_t *idle_warm)
{
    *free_warm = *idle_warm = 0;
    size_t nwarm = atomic_load(&pool->nwarm);
    for (size_t k = 0; k < nwarm; k++) {
        uint32_t i = pool->warm[k];
        uint64_t s = atomic_load(&pool->state[i]);
        if (!ll_pool_populated(pool, i))
            continue;
        if (LL_POOL_ST(s) == LL_POOL_ST_FREE)
            (*free_warm)++;
        else if (LL_POOL_ST(s) == LL_POOL_ST_ALLOC && atomic_load(&pool->lease[i]) == 0)
            (*idle_warm)++;
    }
}

const char *ll_pool_page_kind(ll_pool_t *pool)
{
    return pool->page_kind;
}

uint64_t ll_pool_epoch(ll_pool_t *pool)
{
    return atomic_load(&pool->hdr->epoch);
}

size_t ll_pool_nregions(ll_pool_t *pool)
{
    return pool->nregions;
}

uint64_t ll_pool_id(ll_pool_t *pool)
{
    return pool->hdr->id;
}

const char *ll_pool_share_path(ll_pool_t *pool)
{
    return pool->nameless ? pool->share_path : pool->path;
}

void ll_pool_lease_bit(ll_pool_t *pool, uint32_t idx)
{
    pthread_mutex_lock(&pool->mu);
    if (pool->counts[idx]++ == 0)
        atomic_fetch_or(&pool->lease[idx], UINT64_C(1) << pool->slot);
    pthread_mutex_unlock(&pool->mu);
}

void ll_pool_unlease(ll_pool_t *pool, uint32_t idx)
{
    if (idx >= pool->nregions)
        return;
    pthread_mutex_lock(&pool->mu);
    if (pool->counts[idx] > 0 && --pool->counts[idx] == 0) {
        atomic_fetch_and(&pool->lease[idx], ~(UINT64_C(1) << pool->slot));
        /* The region may be garbage now: the next reclamation is due. */
        atomic_fetch_add(&pool->hdr->released, 1);
    }
    pthread_mutex_unlock(&pool->mu);
}

int ll_pool_lease(ll_pool_t *pool, const ll_pool_region_t *reg)
{
    if (reg->idx >= pool->nregions)
        return -1;
    ll_pool_lease_bit(pool, reg->idx);
    uint64_t alloc = LL_POOL_MK(reg->gen, 1, LL_POOL_ST_ALLOC);
    uint64_t freeing = LL_POOL_MK(reg->gen, 1, LL_POOL_ST_FREEING);
    double t0 = ll_clock_ms();
    for (;;) {
        uint64_t s = atomic_load(&pool->state[reg->idx]);
        if (s == alloc)
            return 0;
        if (s != freeing)
            break;
        /* A reclaimer is deciding; it sees our bit and backs off unless it
         * already looked.  A reclaimer that died here leaves FREEING behind:
         * after a second, undo it ourselves (a live one's CAS then fails). */
        if (ll_clock_ms() - t0 >= 1000) {
            atomic_compare_exchange_strong(&pool->state[reg->idx], &s, alloc);
            continue;
        }
        sched_yield();
    }
    ll_pool_unlease(pool, reg->idx);
    return -1;
}

void ll_pool_free_unwritten(ll_pool_t *pool, const ll_pool_region_t *reg)
{
    if (reg->idx >= pool->nregions)
        return;
    uint64_t s = LL_POOL_MK(reg->gen, 1, LL_POOL_ST_ALLOC);
    /* Backed here (written, or prefaulted): FREE and still counted, ready
     * for the next save.  Never backed by this process (a put that failed
     * before its copy): its memory is given back, so a failed put holds
     * nothing (another process's prefault of it is voided by the trim
     * count). */
    if (ll_pool_populated(pool, reg->idx) || ll_pool_punch(pool, reg->idx) != 0) {
        atomic_compare_exchange_strong(&pool->state[reg->idx], &s,
                                       LL_POOL_MK(reg->gen, 1, LL_POOL_ST_FREE));
        return;
    }
    if (atomic_compare_exchange_strong(&pool->state[reg->idx], &s,
                                       LL_POOL_MK(reg->gen, 0, LL_POOL_ST_FREE)))
        ll_quota_give(pool->quota, 1);
}

_Static_assert(LL_POOL_REGION_BYTES == (size_t) 2 << 20, "ll_quota counts 2 MiB regions");

void ll_pool_set_quota(ll_pool_t *pool, ll_quota_t *q)
{
    size_t used = 0;
    for (size_t i = 0; i < pool->nregions; i++)
        used += LL_POOL_IS_BACKED(atomic_load(&pool->state[i]));
    if (q && ll_quota_join(q, pool->hdr->id, used, pool->nameless ? NULL : pool->path) != 0) {
        ll_warn("store", "pool %s: the user's store ledger has no room (%d pools): not counted",
                pool->path, LL_QUOTA_MAX_POOLS);
        q = NULL;
    }
    pool->quota = q;
}

/* Take FREE region I for writing if its backing is as BACKED wants (-1:
 * either).  Counts an uncounted one in the ledger first.  0, 1 (not
 * taken), or -1 (the user's cap: nothing taken). */
static int s_take(ll_pool_t *pool, uint32_t i, int backed, ll_pool_region_t *reg)
{
    uint64_t s = atomic_load(&pool->state[i]);
    if (LL_POOL_ST(s) != LL_POOL_ST_FREE || (backed >= 0 && LL_POOL_IS_BACKED(s) != backed))
        return 1;
    bool count = !LL_POOL_IS_BACKED(s);
    if (count && ll_quota_take(pool->quota, 1, NULL) != 0)
        return -1;
    ll_pool_lease_bit(pool, i);
    uint64_t gen = LL_POOL_GEN(s) + 1;
    if (!atomic_compare_exchange_strong(&pool->state[i], &s,
                                        LL_POOL_MK(gen, 1, LL_POOL_ST_ALLOC))) {
        ll_pool_unlease(pool, i);
        if (count)
            ll_quota_give(pool->quota, 1);
        return 1;
    }
    atomic_fetch_add(&pool->hdr->allocs, 1);
    reg->idx = i;
    reg->gen = gen;
    reg->hash = 0;
    return 0;
}

int ll_pool_alloc_unbacked(ll_pool_t *pool, ll_pool_region_t *reg, void **addr, int *kind,
                           char *err, size_t errlen)
{
    size_t n = pool->nregions;
    /* Three passes, so a save reuses memory before it asks for more: the
     * free regions this process already prefaulted (a steady-state save
     * then costs a copy, not page faults), then any free region that is
     * backed (reclaimed space, another process's reserve), lowest first,
     * then a fresh one, lowest first, counted in the user's ledger.  Lowest
     * first keeps the pool's memory at the bottom, where the reserve looks
     * and from where trimming (top down) does not take it away. */
    size_t nwarm = pool->nwarm;
    for (size_t k = 0; k < nwarm; k++) {
        uint32_t i = pool->warm[(pool->warm_cursor + k) % nwarm];
        if (!ll_pool_populated(pool, i) || s_take(pool, i, 1, reg) != 0)
            continue;
        pool->warm_cursor = (pool->warm_cursor + k + 1) % nwarm;
        goto got;
    }
    for (size_t i = 0; i < n; i++)
        if (s_take(pool, (uint32_t) i, 1, reg) == 0)
            goto got;
    bool over = false;
    for (size_t i = 0; i < n; i++) {
        int rc = s_take(pool, (uint32_t) i, -1, reg);
        if (rc == 0)
            goto got;
        if (rc < 0) {
            over = true;
            break;
        }
    }
    *kind = over ? LL_POOL_EQUOTA : LL_POOL_EFULL;
    if (over)
        snprintf(err, errlen, "over the user's cap on store memory");
    else
        snprintf(err, errlen, "payload pool full: all %zu regions (%zu MiB) of %s are in use", n,
                 n * (LL_POOL_REGION_BYTES >> 20), pool->path);
    return -1;
got:
    /* Not backed here: the writer backs it (ll_pool_back) on its copy
     * thread, right before copying into it. */
    *addr = pool->data + (size_t) reg->idx * LL_POOL_REGION_BYTES;
    return 0;
}

void ll_pool_commit_done(ll_pool_t *pool)
{
    atomic_fetch_add(&pool->hdr->epoch, 1);
}

/* A private writable mapping of a hugetlb pool makes the kernel reserve a
 * huge page for every page it maps (for copy-on-write), which fails with
 * ENOMEM when the host has none to spare, e.g. after the pool itself took
 * the surplus room.  Restoring committed bytes must not need new huge pages:
 * put a private copy in ordinary anonymous memory at ADDR instead (LEN bytes
 * of the pool file at OFF, read through a shared mapping, which needs no
 * new pages since the regions are allocated).  0, or -1 with errno.
 * Costs a copy and, while the mapping lives, the memory of it; so does the
 * reservation of a private hugetlb mapping when it succeeds. */
static int s_map_copy(ll_pool_t *pool, char *addr, size_t len, off_t off)
{
    /* The destination first: the failed mapping may have left a hole at
     * ADDR, where the source's mapping could otherwise land. */
    char *dst =
        mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (dst == MAP_FAILED)
        return -1;
    char *src = mmap(NULL, len, PROT_READ, MAP_SHARED, pool->fd, off);
    if (src == MAP_FAILED)
        return -1;                    /* (the caller unmaps ADDR) */
    madvise(dst, len, MADV_HUGEPAGE); /* (THP "madvise" mode: 2 MiB faults, not 4 KiB) */
    memcpy(dst, src, len);
    munmap(src, len);
    ll_debug("store", "pool %s: no huge pages for a private mapping of %zu bytes; copied them",
             pool->path, len);
    return 0;
}

ll_pool_map_t *ll_pool_map(ll_pool_t *pool, const ll_pool_region_t *regs, size_t nreg,
                           size_t nbytes, bool writable, int *kind, char *err, size_t errlen)
{
    const size_t R = LL_POOL_REGION_BYTES;
    if (nbytes > nreg * R || (nreg > 0 && nbytes <= (nreg - 1) * R)) {
        *kind = LL_POOL_EINVAL;
        snprintf(err, errlen, "payload of %zu bytes cannot span %zu regions", nbytes, nreg);
        return NULL;
    }
    ll_pool_map_t *map = calloc(1, sizeof *map);
    if (!map || !(map->idx = malloc((nreg ? nreg : 1) * sizeof *map->idx))) {
        free(map);
        *kind = LL_POOL_EIO;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    map->pool = pool;
    map->nbytes = nbytes;
    for (size_t i = 0; i < nreg; i++) {
        if (ll_pool_lease(pool, &regs[i]) != 0) {
            *kind = LL_POOL_EGONE;
            snprintf(err, errlen,
                     "payload region %u (generation %llu) was reclaimed: the version that "
                     "used it is gone",
                     (unsigned) regs[i].idx, (unsigned long long) regs[i].gen);
            goto out_unlease;
        }
        map->idx[map->nreg++] = regs[i].idx;
    }
    if (nreg == 0) {
        map->addr = &s_zero_byte;
        atomic_fetch_add(&pool->refs, 1);
        return map;
    }
    map->maplen = nreg * R;
    /* Reserve region-aligned address space (huge pages need it), then map
     * each run of consecutive regions over it. */
    char *res =
        mmap(NULL, map->maplen + R, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) {
        *kind = LL_POOL_EIO;
        s_fail(err, errlen, "cannot reserve address space%s: %s", "", errno);
        goto out_unlease;
    }
    char *addr = (char *) s_round_up((uintptr_t) res, R);
    if (addr > res)
        munmap(res, (size_t) (addr - res));
    munmap(addr + map->maplen, (size_t) (res + R - addr));
    map->addr = addr;
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    int flags = (writable ? MAP_PRIVATE : MAP_SHARED) | MAP_FIXED;
    bool huge_private = writable && strcmp(pool->page_kind, "hugetlb") == 0;
    for (size_t i = 0; i < nreg;) {
        size_t run = 1;
        while (i + run < nreg && regs[i + run].idx == regs[i].idx + run)
            run++;
        off_t off = (off_t) (pool->hdr->data_offset + (size_t) regs[i].idx * R);
        void *got = NULL;
        if (huge_private) {
            /* A failed MAP_FIXED leaves a hole another thread's mmap could
             * take: find out elsewhere whether the huge pages are there. */
            void *probe = mmap(NULL, run * R, prot, MAP_PRIVATE, pool->fd, off);
            if (probe == MAP_FAILED)
                got = MAP_FAILED;
            else
                munmap(probe, run * R);
        }
        if (got != MAP_FAILED)
            got = mmap(addr + i * R, run * R, prot, flags, pool->fd, off);
        if (got == MAP_FAILED && !(huge_private && errno == ENOMEM &&
                                   s_map_copy(pool, addr + i * R, run * R, off) == 0)) {
            *kind = LL_POOL_EIO;
            s_fail(err, errlen, "cannot map payload regions%s: %s", "", errno);
            munmap(addr, map->maplen);
            goto out_unlease;
        }
        i += run;
    }
    if (strcmp(pool->page_kind, "thp") == 0)
        madvise(addr, map->maplen, MADV_HUGEPAGE);
    atomic_fetch_add(&pool->refs, 1);
    return map;

out_unlease:
    for (size_t i = 0; i < map->nreg; i++)
        ll_pool_unlease(pool, map->idx[i]);
    free(map->idx);
    free(map);
    return NULL;
}

void *ll_pool_map_addr(ll_pool_map_t *map)
{
    return map->addr;
}

size_t ll_pool_map_len(ll_pool_map_t *map)
{
    return map->nbytes;
}

void ll_pool_unmap(ll_pool_map_t **map_p)
{
    if (!map_p || !*map_p)
        return;
    ll_pool_map_t *map = *map_p;
    if (map->maplen)
        munmap(map->addr, map->maplen);
    if (getpid() == map->pool->pid)
        for (size_t i = 0; i < map->nreg; i++)
            ll_pool_unlease(map->pool, map->idx[i]);
    s_pool_unref(map->pool);
    free(map->idx);
    free(map);
    *map_p = NULL;
}

void ll_pool_stats(ll_pool_t *pool, ll_pool_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->page_kind = pool->page_kind;
    out->path = ll_pool_share_path(pool);
    out->regions_total = pool->nregions;
    out->regions_prefaulted = atomic_load(&pool->nwarm);
    pthread_mutex_lock(&pool->rmu);
    out->reserve_target = pool->rtarget;
    pthread_mutex_unlock(&pool->rmu);
    out->reserve_ready = ll_pool_free_warm(pool);
    out->pool_bytes = pool->nregions * LL_POOL_REGION_BYTES;
    pthread_mutex_lock(&pool->mu);
    for (size_t i = 0; i < pool->nregions; i++) {
        uint64_t st = atomic_load(&pool->state[i]);
        if (LL_POOL_ST(st) != LL_POOL_ST_FREE && LL_POOL_ST(st) != LL_POOL_ST_TRIM)
            out->regions_used++;
        out->regions_backed += LL_POOL_IS_BACKED(st);
        if (pool->counts[i])
            out->regions_leased++;
    }
    pthread_mutex_unlock(&pool->mu);
}

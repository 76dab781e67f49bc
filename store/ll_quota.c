/* ll_quota: the user's ledger of checkpoint-store memory (see ll_quota.h).
 * Runs in every process of a user's sessions that opens a store (kernel,
 * workers, tests) and in the user's host pool, on whatever thread calls.
 *
 * DESIGN
 * ------
 * The ledger is one small shared file per user: the cap (bytes, 0 none,
 * and where it came from), then LL_QUOTA_MAX_POOLS entries of two atomic
 * words, (pool id, regions the pool holds).  Every process of a pool joins
 * the pool's entry and adds or subtracts as it allocates and frees regions;
 * the user holds the sum over entries.  A take adds first and then sums, so
 * of two racing takes at least one sees the other (sequentially consistent
 * atomics): the cap is never passed, at worst both fail.
 *
 * Liveness: each process holding entry i keeps a read OFD lock on byte
 * 1 + i of the file; the lock goes with the process however it ends (and
 * with the last fork child that shares the open file).  Joining and
 * cleaning happen under a write lock on byte 0: an entry whose byte a write
 * lock can take has no process left, so it is emptied (its pool is gone: a
 * kernel's pool has no name and dies with its last process) or, for the
 * pool being joined, recounted from the pool itself, which also undoes
 * what a process killed between counting and allocating left behind.  A
 * named pool file whose processes all exited is not counted until a
 * process opens it again (kernels' pools have no name).
 *
 * What counts is memory (what the host gives up, not what is committed): a
 * pool counts every region it holds backed, committed or not, free regions
 * kept for the next save and its reserve included (ll_pool_reclaim.c).  Memory
 * held ahead of use may take the user only to three quarters of the cap
 * (ll_quota_take_spare); a save the cap refuses marks the ledger (pressed),
 * and for a while every pool's owner gives back what it holds ahead of use,
 * so that one kernel's reserve never keeps another's save out.
 *
 * The ledger is the user's own file (0600), so the cap binds the user's
 * store code, not a determined user: like the broker's leases it arbitrates
 * between cooperating processes (hostd/API.md, "Limits"). */
#include "store/ll_quota.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "base/ll_check.h"

#define S_MAGIC  "LLQUOTA1"
#define S_REGION ((uint64_t) 2 << 20) /* LL_POOL_REGION_BYTES (checked in ll_pool.c) */

typedef struct {
    _Atomic uint64_t id; /* pool id, 0: free */
    _Atomic uint64_t regions;
    uint64_t dev, ino; /* of the pool's file (named pools), set before id */
    char path[96];     /* "": a pool without a name (it dies with its last process) */
} s_entry_t;

typedef struct {
    char magic[8];
    _Atomic uint64_t cap;     /* bytes, 0: none */
    _Atomic uint64_t src;     /* ll_quota_src_t */
    _Atomic uint64_t pressed; /* CLOCK_MONOTONIC ms of the last save the cap refused (0: none) */
    _Atomic uint64_t need;    /* bytes that save still waits for (0: none, or it is over) */
    uint64_t spare[3];
    s_entry_t ent[LL_QUOTA_MAX_POOLS];
} s_ledger_t;

struct ll_quota_t {
    int fd;
    s_ledger_t *l;
    int ent; /* joined entry, -1 none */
};

/* An OFD lock of TYPE (F_RDLCK, F_WRLCK, F_UNLCK) on byte OFF; WAIT: block.
 * 0, or -1 (errno). */
static int s_lock(int fd, short type, off_t off, bool wait)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
    return fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
}

static void s_default_path(char *out, size_t len)
{
    const char *env = getenv("LL_STORE_LEDGER");
    if (env && *env)
        snprintf(out, len, "%s", env);
    else
        snprintf(out, len, "/dev/shm/looseleaf-%d-quota", (int) geteuid());
}

ll_quota_t *ll_quota_open(const char *path, char *err, size_t errlen)
{
    char p[512];
    err[0] = 0;
    if (path)
        snprintf(p, sizeof p, "%s", path);
    else
        s_default_path(p, sizeof p);
    if (strcmp(p, "off") == 0)
        return NULL;
    int fd = open(p, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        snprintf(err, errlen, "cannot open the store ledger %s: %s", p, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
        snprintf(err, errlen,
                 "the store ledger %s is not this user's own file (owner %d, mode %o): not "
                 "counting store memory",
                 p, (int) sb.st_uid, (unsigned) (sb.st_mode & 07777));
        close(fd);
        return NULL;
    }
    ll_quota_t *q = calloc(1, sizeof *q);
    if (!q || s_lock(fd, F_WRLCK, 0, true) != 0) {
        snprintf(err, errlen, "cannot lock the store ledger %s: %s", p,
                 q ? strerror(errno) : "out of memory");
        free(q);
        close(fd);
        return NULL;
    }
    q->fd = fd;
    q->ent = -1;
    bool fresh = (size_t) sb.st_size < sizeof(s_ledger_t);
    if (fresh && ftruncate(fd, sizeof(s_ledger_t)) != 0) {
        snprintf(err, errlen, "cannot size the store ledger %s: %s", p, strerror(errno));
        goto fail;
    }
    q->l = mmap(NULL, sizeof(s_ledger_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (q->l == MAP_FAILED) {
        q->l = NULL;
        snprintf(err, errlen, "cannot map the store ledger %s: %s", p, strerror(errno));
        goto fail;
    }
    if (memcmp(q->l->magic, S_MAGIC, 8) != 0) {
        /* New (or torn by a crash while it was made: nothing counted yet). */
        memset((void *) q->l, 0, sizeof(s_ledger_t));
        memcpy(q->l->magic, S_MAGIC, 8);
    }
    s_lock(fd, F_UNLCK, 0, false);
    return q;
fail:
    s_lock(fd, F_UNLCK, 0, false);
    ll_quota_destroy(&q);
    return NULL;
}

void ll_quota_destroy(ll_quota_t **q_p)
{
    if (!q_p || !*q_p)
        return;
    ll_quota_t *q = *q_p;
    if (q->l)
        munmap(q->l, sizeof(s_ledger_t));
    close(q->fd); /* drops the entry's lock (unless a fork child shares it) */
    free(q);
    *q_p = NULL;
}

/* Whether no process holds entry I (we hold byte 0). */
static bool s_dead(ll_quota_t *q, int i)
{
    if (s_lock(q->fd, F_WRLCK, 1 + i, false) != 0)
        return false;
    s_lock(q->fd, F_UNLCK, 1 + i, false);
    return true;
}

/* Whether entry E names a pool file that still exists (its memory with it). */
static bool s_file_lives(const s_entry_t *e)
{
    struct stat sb;
    return e->path[0] && stat(e->path, &sb) == 0 && (uint64_t) sb.st_dev == e->dev &&
           (uint64_t) sb.st_ino == e->ino;
}

int ll_quota_join(ll_quota_t *q, uint64_t pool_id, size_t used, const char *path)
{
    if (!q || q->ent >= 0 || pool_id == 0)
        return -1;
    if (s_lock(q->fd, F_WRLCK, 0, true) != 0)
        return -1;
    int mine = -1, free_i = -1;
    for (int i = 0; i < LL_QUOTA_MAX_POOLS; i++) {
        s_entry_t *e = &q->l->ent[i];
        uint64_t id = atomic_load(&e->id);
        if (id == pool_id && mine < 0) {
            mine = i;
            if (s_dead(q, i))
                atomic_store(&e->regions, used); /* its processes died: recount */
        } else if (id != 0 && s_dead(q, i) && !s_file_lives(e)) {
            atomic_store(&e->regions, 0); /* a pool that is gone */
            atomic_store(&e->id, 0);
            id = 0;
        }
        if (id == 0 && free_i < 0)
            free_i = i;
    }
    if (mine < 0 && free_i >= 0) {
        mine = free_i;
        s_entry_t *e = &q->l->ent[mine];
        struct stat sb;
        e->path[0] = 0;
        if (path && strlen(path) < sizeof e->path && stat(path, &sb) == 0) {
            snprintf(e->path, sizeof e->path, "%s", path);
            e->dev = (uint64_t) sb.st_dev;
            e->ino = (uint64_t) sb.st_ino;
        }
        atomic_store(&e->regions, used);
        atomic_store(&q->l->ent[mine].id, pool_id);
    }
    int rc = -1;
    if (mine >= 0 && s_lock(q->fd, F_RDLCK, 1 + mine, false) == 0) {
        q->ent = mine;
        rc = 0;
    }
    s_lock(q->fd, F_UNLCK, 0, false);
    return rc;
}

uint64_t ll_quota_held(ll_quota_t *q)
{
    uint64_t n = 0;
    for (int i = 0; q && i < LL_QUOTA_MAX_POOLS; i++)
        if (atomic_load(&q->l->ent[i].id) != 0)
            n += atomic_load(&q->l->ent[i].regions);
    return n * S_REGION;
}

/* Add N, then check the user's total against the cap less SPARE_FRAC of it
 * (a fraction 1/SPARE_FRAC kept free; 0: none). */
static int s_take(ll_quota_t *q, size_t n, ll_quota_over_t *over, uint64_t spare_frac)
{
    if (!q || q->ent < 0 || n == 0)
        return 0;
    atomic_fetch_add(&q->l->ent[q->ent].regions, n);
    uint64_t cap = atomic_load(&q->l->cap);
    if (cap == 0)
        return 0;
    if (spare_frac)
        cap -= cap / spare_frac;
    uint64_t held = ll_quota_held(q);
    if (held <= cap)
        return 0;
    atomic_fetch_sub(&q->l->ent[q->ent].regions, n);
    if (over) {
        over->cap = cap;
        over->held = held - n * S_REGION;
        over->src = (int) atomic_load(&q->l->src);
    }
    return -1;
}

int ll_quota_take(ll_quota_t *q, size_t n, ll_quota_over_t *over)
{
    return s_take(q, n, over, 0);
}

int ll_quota_take_spare(ll_quota_t *q, size_t n)
{
    return s_take(q, n, NULL, LL_QUOTA_SPARE_FRAC);
}

void ll_quota_give(ll_quota_t *q, size_t n)
{
    if (q && q->ent >= 0 && n)
        atomic_fetch_sub(&q->l->ent[q->ent].regions, n);
}

void ll_quota_press(ll_quota_t *q, uint64_t need)
{
    if (!q)
        return;
    atomic_store(&q->l->need, need);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* (one clock for every process of the host) */
    atomic_store(&q->l->pressed, (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000 + 1);
}

void ll_quota_unpress(ll_quota_t *q, uint64_t need)
{
    if (q)
        atomic_compare_exchange_strong(&q->l->need, &need, 0); /* (a later waiter's stays) */
}

uint64_t ll_quota_excess(ll_quota_t *q, uint64_t within_ms)
{
    if (!ll_quota_pressed(q, within_ms))
        return 0;
    uint64_t need = atomic_load(&q->l->need), cap = atomic_load(&q->l->cap);
    uint64_t held = ll_quota_held(q);
    return need && cap && held + need > cap ? held + need - cap : 0;
}

uint64_t ll_quota_pressed(ll_quota_t *q, uint64_t within_ms)
{
    uint64_t at = q ? atomic_load(&q->l->pressed) : 0;
    if (!at)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000 + 1;
    return now - at <= within_ms ? at : 0;
}

uint64_t ll_quota_cap(ll_quota_t *q, int *src)
{
    if (src)
        *src = q ? (int) atomic_load(&q->l->src) : LL_QUOTA_SRC_NONE;
    return q ? atomic_load(&q->l->cap) : 0;
}

void ll_quota_set_cap(ll_quota_t *q, uint64_t bytes, int src)
{
    if (!q)
        return;
    atomic_store(&q->l->cap, bytes);
    atomic_store(&q->l->src, (uint64_t) src);
}

const char *ll_quota_fmt_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
    if (n < 1024) {
        snprintf(buf, len, "%llu bytes", (unsigned long long) n);
        return buf;
    }
    int u = 0;
    double v = (double) n / 1024;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    if (v == (double) (uint64_t) v)
        snprintf(buf, len, "%llu %s", (unsigned long long) v, unit[u]);
    else
        snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

/* ---- self-test ---------------------------------------------------------- */

int ll_quota_selftest(bool verbose)
{
    char dir[] = "/tmp/ll_quota_XXXXXX", path[64], named[64], err[256], buf[32];
    int rc = -1;
    ll_quota_t *a = NULL, *b = NULL, *c = NULL;
    ll_quota_over_t over = {0};
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof path, "%s/ledger", dir);
    S_REQUIRE(ll_quota_open("off", err, sizeof err) == NULL && err[0] == 0, out);
    a = ll_quota_open(path, err, sizeof err);
    b = ll_quota_open(path, err, sizeof err);
    c = ll_quota_open(path, err, sizeof err);
    S_REQUIRE(a && b && c, out);
    /* Two pools of the user; no cap: everything is counted, nothing refused. */
    S_REQUIRE(ll_quota_join(a, 11, 3, NULL) == 0 && ll_quota_join(b, 22, 0, NULL) == 0, out);
    S_REQUIRE(ll_quota_take(b, 5, NULL) == 0 && ll_quota_held(a) == 8 * S_REGION, out);
    /* A cap of 10 regions covers both pools: 2 more fit, a third does not. */
    ll_quota_set_cap(c, 10 * S_REGION, LL_QUOTA_SRC_HOSTD);
    S_REQUIRE(ll_quota_take(a, 2, &over) == 0, out);
    S_REQUIRE(ll_quota_take(b, 1, &over) == -1, out);
    S_REQUIRE(over.cap == 10 * S_REGION && over.held == 10 * S_REGION &&
                  over.src == LL_QUOTA_SRC_HOSTD,
              out);
    S_REQUIRE(ll_quota_held(c) == 10 * S_REGION, out); /* the refused take left nothing */
    ll_quota_give(a, 4);
    /* Memory held ahead of use (a reserve) leaves a quarter of the cap to
     * saves: with 6 of 10 regions held, 1 more fits, 2 do not. */
    S_REQUIRE(ll_quota_take_spare(a, 2) == -1 && ll_quota_held(a) == 6 * S_REGION, out);
    S_REQUIRE(ll_quota_take_spare(a, 1) == 0 && ll_quota_take_spare(a, 1) == -1, out);
    ll_quota_give(a, 1);
    S_REQUIRE(ll_quota_take(b, 4, NULL) == 0 && ll_quota_take(b, 1, NULL) == -1, out);
    /* A second process of pool 11 shares its entry; the entry lives while
     * one of them does. */
    S_REQUIRE(ll_quota_join(c, 11, 99, NULL) == 0 && ll_quota_held(c) == 10 * S_REGION, out);
    ll_quota_destroy(&a);
    S_REQUIRE(ll_quota_join((a = ll_quota_open(path, err, sizeof err)), 33, 0, NULL) == 0, out);
    S_REQUIRE(ll_quota_held(a) == 10 * S_REGION, out);
    /* Pool 22's only process dies (a child that joins, takes and is killed):
     * its count goes at the next join; a pool whose processes all died is
     * recounted when joined again. */
    ll_quota_destroy(&b);
    pid_t pid = fork();
    if (pid == 0) {
        ll_quota_t *k = ll_quota_open(path, err, sizeof err);
        if (!k || ll_quota_join(k, 44, 1, NULL) != 0 || ll_quota_take(k, 1, NULL) != 0)
            _exit(1);
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    int status = 0;
    S_REQUIRE(pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status), out);
    /* 11: 1, 33: 0, 44: 2 (dead, until the next join); 22 went at the
     * child's join. */
    S_REQUIRE(ll_quota_held(a) == 3 * S_REGION, out);
    b = ll_quota_open(path, err, sizeof err);
    S_REQUIRE(b && ll_quota_join(b, 22, 1, NULL) == 0, out);
    S_REQUIRE(ll_quota_held(a) == 2 * S_REGION,
              out); /* 11 holds 1, 22 joined anew with 1, 44 gone */
    /* A named pool file outlives its processes, and so does its count,
     * until the file goes. */
    ll_quota_t *f = ll_quota_open(path, err, sizeof err);
    S_REQUIRE(f && ll_quota_join(f, 55, 7, path) == 0, out);
    ll_quota_destroy(&f);
    f = ll_quota_open(path, err, sizeof err);
    S_REQUIRE(f && ll_quota_join(f, 66, 0, NULL) == 0 && ll_quota_held(a) == 9 * S_REGION, out);
    ll_quota_destroy(&f);
    snprintf(named, sizeof named, "%s/ledger2", dir);
    S_REQUIRE(rename(path, named) == 0 && rename(named, path) == 0,
              out); /* same file: still counted */
    f = ll_quota_open(path, err, sizeof err);
    S_REQUIRE(f && ll_quota_join(f, 77, 0, NULL) == 0 && ll_quota_held(a) == 9 * S_REGION, out);
    ll_quota_destroy(&f);
    /* A save waiting for 4 regions under a cap of 10 with 9 held: the
     * user's pools are 3 regions over until it is done. */
    ll_quota_set_cap(a, 10 * S_REGION, LL_QUOTA_SRC_ENV);
    S_REQUIRE(ll_quota_excess(a, 30000) == 0, out);
    ll_quota_press(b, 4 * S_REGION);
    S_REQUIRE(ll_quota_excess(a, 30000) == 3 * S_REGION, out);
    ll_quota_unpress(b, 5 * S_REGION); /* another waiter's: stays */
    S_REQUIRE(ll_quota_excess(a, 30000) == 3 * S_REGION, out);
    ll_quota_unpress(b, 4 * S_REGION);
    S_REQUIRE(ll_quota_excess(a, 30000) == 0 && ll_quota_pressed(a, 30000), out);
    ll_quota_set_cap(a, 0, LL_QUOTA_SRC_NONE);
    S_REQUIRE(ll_quota_take(b, 1000, NULL) == 0, out);
    S_REQUIRE(strcmp(ll_quota_fmt_bytes(256 << 20, buf, sizeof buf), "256 MiB") == 0, out);
    S_REQUIRE(strcmp(ll_quota_fmt_bytes(3 << 29, buf, sizeof buf), "1.5 GiB") == 0, out);
    S_REQUIRE(strcmp(ll_quota_fmt_bytes(100, buf, sizeof buf), "100 bytes") == 0, out);
    /* Another user's (or a too open) file is refused. */
    chmod(path, 0644);
    ll_quota_t *open_file = ll_quota_open(path, err, sizeof err);
    S_REQUIRE(!open_file && strstr(err, "not this user's own file"), out);
    rc = 0;
    if (verbose)
        printf("ll_quota selftest: ok\n");
out:
    ll_quota_destroy(&a);
    ll_quota_destroy(&b);
    ll_quota_destroy(&c);
    unlink(path);
    rmdir(dir);
    return rc;
}

/* ll_store_bench: put/map throughput of the store against memcpy of the
 * same bytes on this machine, for each pool page kind the host offers
 * (make bench).  A standalone program: starts its own redis-server in a
 * temp dir and removes it.  Prints times and ratios measured in one run
 * (the machines are shared and noisy: compare ratios, not absolutes).
 *
 * It says which page kind a kernel's pool would get on this host and why
 * (ll_store_page_kind_choice), and measures that kind and 4 KiB pages
 * (plus any other kind the host offers), each with its backing floor:
 * fallocate + prefault of that many fresh pool bytes with no copy, on the
 * copy threads, and a plain memcpy into fresh memory timed right before the
 * first save (both write every byte into never-touched memory: the like for
 * like comparison).  A first save into a fresh pool is measured twice: right
 * away (its memory may be pages this process just freed) and after
 * LL_BENCH_IDLE seconds with the pool gone, by when this VM has handed freed
 * memory back to the host (free page reporting), as between sessions.
 *
 *   LL_BENCH_BYTES=N      payload size (default 1 GiB)
 *   LL_BENCH_IDLE=S       seconds of idle before the second fresh save (default 10)
 *   LL_BENCH_SYSCTL=1     as root, enable shmem THP ("advise") and allow
 *                         surplus huge pages (vm.nr_overcommit_hugepages,
 *                         nothing reserved) for the run, restoring both
 *                         after, so every page kind can be measured here. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_mman.h"
#include "store/ll_redis.h"
#include "store/ll_redis_server.h"
#include "store/ll_store.h"

#define R LL_POOL_REGION_BYTES

static char *s_read_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    buf[0] = 0;
    if (f) {
        if (!fgets(buf, (int) len, f))
            buf[0] = 0;
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = 0;
    return buf;
}

static int s_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "we");
    if (!f)
        return -1;
    int rc = fputs(text, f) < 0 ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

static long s_meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':')
            v = strtol(line + kl + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} s_copy_t;

static void *s_copy_half(void *arg)
{
    s_copy_t *c = arg;
    memcpy(c->dst, c->src, c->n);
    return NULL;
}

static double s_memcpy_time(char *dst, const char *src, size_t n, int threads)
{
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = ll_clock_s();
        if (threads == 1) {
            memcpy(dst, src, n);
        } else {
            size_t half = n / 2 / R * R;
            s_copy_t c = {dst + half, src + half, n - half};
            pthread_t th;
            int started = pthread_create(&th, NULL, s_copy_half, &c) == 0;
            memcpy(dst, src, half);
            if (started)
                pthread_join(th, NULL);
            else
                memcpy(dst + half, src + half, n - half);
        }
        double t = ll_clock_s() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

/* One plain memcpy of N bytes into freshly mapped anonymous memory (4 KiB
 * pages, never touched: the copy faults them in): the like for like
 * baseline of a first save into a fresh pool, which also writes every byte
 * into memory never touched before.  The copy stays mapped in *DST until
 * the caller's save is done, so the save cannot reuse the pages the copy
 * just faulted in (freed memory the guest has backed is cheaper to touch
 * than memory it gave back to the host; timed first, the copy gets those
 * instead, so the comparison leans against the save).  -1 if it cannot map. */
static double s_fresh_memcpy_time(const char *src, size_t n, char **dst)
{
    *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*dst == MAP_FAILED) {
        *dst = NULL;
        return -1;
    }
    madvise(*dst, n, MADV_NOHUGEPAGE);
    double t0 = ll_clock_s();
    memcpy(*dst, src, n);
    return ll_clock_s() - t0;
}

static double s_read_time(const char *p, size_t n, uint64_t *sink)
{
    double t0 = ll_clock_s();
    const uint64_t *q = (const uint64_t *) p;
    uint64_t s = 0;
    for (size_t i = 0; i < n / 8; i++)
        s += q[i];
    *sink += s;
    return ll_clock_s() - t0;
}

static void s_line(const char *what, double t, size_t n, double base)
{
    printf("  %-34s %9.2f ms %7.2f GB/s   %7.3fx memcpy\n", what, t * 1e3,
           t > 0 ? (double) n / t / 1e9 : 0.0, t / base);
}

typedef struct {
    int fd;
    char *map;
    size_t n;
    bool falloc;
    _Atomic size_t next;
    _Atomic int err;
} s_floor_t;

static void *s_floor_worker(void *arg)
{
    s_floor_t *f = arg;
    for (size_t i; (i = atomic_fetch_add(&f->next, 1)) < f->n / R;) {
        int rc = f->falloc ? posix_fallocate(f->fd, (off_t) (i * R), (off_t) R) : 0;
        if (rc == 0 && madvise(f->map + i * R, R, MADV_POPULATE_WRITE) != 0)
            rc = errno;
        if (rc != 0) {
            atomic_store(&f->err, rc);
            break;
        }
    }
    return NULL;
}

/* The floor under a first save into a fresh pool of KIND ("hugetlb", "thp",
 * "4k"): backing N fresh bytes of such memory as the pool backs a region
 * (fallocate, MADV_POPULATE_WRITE), no copy, on 2 threads as a save spreads
 * it.  Seconds, or -1. */
static double s_backing_floor(const char *kind, size_t n)
{
    bool huge = strcmp(kind, "hugetlb") == 0, thp = strcmp(kind, "thp") == 0;
    int fd = memfd_create("ll-bench-floor", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));
    if (fd < 0 || ftruncate(fd, (off_t) n) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char *map = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return -1;
    }
    if (thp)
        madvise(map, n, MADV_HUGEPAGE);
    s_floor_t f = {.fd = fd, .map = map, .n = n / R * R, .falloc = !thp};
    double t0 = ll_clock_s();
    pthread_t th;
    int started = pthread_create(&th, NULL, s_floor_worker, &f) == 0;
    s_floor_worker(&f);
    if (started)
        pthread_join(th, NULL);
    double t = ll_clock_s() - t0;
    munmap(map, n);
    close(fd);
    return atomic_load(&f.err) ? -1 : t;
}

static int s_idle_s(void)
{
    const char *e = getenv("LL_BENCH_IDLE");
    return e && *e ? atoi(e) : 10;
}

/* A first save into the fresh pool of ST, next to a memcpy into fresh memory
 * timed right before it (first-touch costs here swing with what the host
 * has backed, so the two are measured back to back) and the backing floor.
 * Returns the saved payload's ref (the caller frees it) or NULL. */
static char *s_bench_fresh(ll_store_t *st, const ll_store_stats_t *stats, char *src, size_t n,
                           double t_memcpy)
{
    size_t written;
    char *copy;
    double t_fresh_copy = s_fresh_memcpy_time(src, n, &copy);
    double t0 = ll_clock_s();
    char *ref = ll_store_put(st, src, n, NULL, NULL, &written);
    double t_fresh = ll_clock_s() - t0;
    if (copy)
        munmap(copy, n);
    if (!ref) {
        printf("  put failed: %s\n", ll_store_errstr(st));
        return NULL;
    }
    s_line("save, fresh pool (first touch)", t_fresh, n, t_memcpy);
    printf("  %-34s %9s    %7.2f ms per 2 MiB region\n", "", "",
           t_fresh * 1e3 / (double) ((n + R - 1) / R));
    if (t_fresh_copy > 0) {
        s_line("  memcpy into fresh memory", t_fresh_copy, n, t_memcpy);
        printf("  %-34s %9s    %7.3fx of it (like for like; target <= 2x)\n", "  the save", "",
               t_fresh / t_fresh_copy);
    }
    double t_floor = s_backing_floor(stats->pool.page_kind, n);
    if (t_floor > 0)
        s_line("  backing floor (no copy, 2 thr)", t_floor, n, t_memcpy);
    else
        printf("  backing floor: could not back %zu bytes of %s memory\n", n,
               stats->pool.page_kind);
    return ref;
}

/* Saves against the committed REF of SRC: unchanged and 1% dirty, hashing
 * every region, then with the caller telling which regions it wrote (e.g.
 * from /proc/self/pagemap of a restored mapping). */
static void s_bench_incremental(ll_store_t *st, const char *ref, char *src, size_t n,
                                double t_memcpy, double t_commit)
{
    size_t written;
    double t0 = ll_clock_s();
    char *same = ll_store_put(st, src, n, ref, NULL, &written);
    double t_same = ll_clock_s() - t0;
    s_line("incremental save, unchanged", t_same + t_commit, n, t_memcpy);
    printf("  %-34s %9.2f ms (hash all regions, write %zu bytes, commit %.2f ms)\n", "",
           (t_same + t_commit) * 1e3, written, t_commit * 1e3);
    ll_store_discard(st, same);
    free(same);
    /* Dirty 1% of the regions. */
    size_t nreg = (n + R - 1) / R, step = 100;
    for (size_t i = 0; i < nreg; i += step)
        src[i * R] ^= 0x5a;
    t0 = ll_clock_s();
    char *dirty = ll_store_put(st, src, n, ref, NULL, &written);
    double t_dirty = ll_clock_s() - t0;
    for (size_t i = 0; i < nreg; i += step)
        src[i * R] ^= 0x5a;
    if (dirty) {
        s_line("incremental save, 1% dirty", t_dirty, n, t_memcpy);
        printf("  %-34s %zu MiB written of %zu MiB\n", "", written >> 20, n >> 20);
        ll_store_discard(st, dirty);
        free(dirty);
    } else {
        printf("  incremental save, 1%% dirty failed: %s\n", ll_store_errstr(st));
    }
    uint8_t *mask = calloc(nreg, 1);
    if (!mask)
        return;
    t0 = ll_clock_s();
    char *r = ll_store_put(st, src, n, ref, mask, &written);
    double t_hint = ll_clock_s() - t0;
    if (r) {
        printf("  %-34s %9.2f ms (+ commit %.2f ms; target < 10 ms)\n",
               "unchanged, dirty regions known", t_hint * 1e3, t_commit * 1e3);
        ll_store_discard(st, r);
        free(r);
    }
    for (size_t i = 0; i < nreg; i += step) {
        mask[i] = 1;
        src[i * R] ^= 0x5a;
    }
    t0 = ll_clock_s();
    r = ll_store_put(st, src, n, ref, mask, &written);
    t_hint = ll_clock_s() - t0;
    for (size_t i = 0; i < nreg; i += step)
        src[i * R] ^= 0x5a;
    if (r) {
        printf("  %-34s %9.2f ms (%zu MiB written)\n", "1% dirty, dirty regions known",
               t_hint * 1e3, written >> 20);
        ll_store_discard(st, r);
        free(r);
    }
    free(mask);
}

/* A restore of REF: the map, then the first read of every byte. */
static void s_bench_restore(ll_store_t *st, const char *ref, const char *src, size_t n,
                            double t_memcpy, uint64_t *sink)
{
    double t0 = ll_clock_s();
    ll_pool_map_t *map = ll_store_map(st, ref, false);
    double t_map = ll_clock_s() - t0;
    if (!map) {
        printf("  map failed: %s\n", ll_store_errstr(st));
        return;
    }
    s_line("restore: map (no copy; target < 1x)", t_map, n, t_memcpy);
    double t_read = s_read_time(ll_pool_map_addr(map), n, sink);
    s_line("  then first read of every byte", t_read, n, t_memcpy);
    double t_src = s_read_time(src, n, sink);
    s_line("  (read of the source, for scale)", t_src, n, t_memcpy);
    ll_pool_unmap(&map);
}

/* The first save again, into a fresh pool made after the old one was gone
 * for a while: on this VM freed memory goes back to the host within seconds
 * (free page reporting), and touching it again costs a host fault per page:
 * what a kernel's first save meets. */
static void s_bench_after_idle(const char *dir, const char *session, const ll_store_opts_t *opts,
                               const char *src, size_t n, double t_memcpy)
{
    int idle = s_idle_s();
    if (idle <= 0)
        return;
    sleep((unsigned) idle);
    char err[512], session2[80];
    snprintf(session2, sizeof session2, "%s-idle", session);
    ll_store_t *st = ll_store_open(dir, session2, opts, err, sizeof err);
    if (!st) {
        printf("  fresh pool after idle: %s\n", err);
        return;
    }
    size_t written;
    double t0 = ll_clock_s();
    char *ref = ll_store_put(st, src, n, NULL, NULL, &written);
    double t_idle = ll_clock_s() - t0;
    char what[64];
    snprintf(what, sizeof what, "save, fresh pool after %d s idle", idle);
    if (ref)
        s_line(what, t_idle, n, t_memcpy);
    else
        printf("  %s failed: %s\n", what, ll_store_errstr(st));
    free(ref);
    ll_store_delete_session(st);
    ll_store_destroy(&st);
}

/* One page kind: returns 0, or -1 when the pool could not be used. */
static int s_bench_kind(const char *label, const char *pool_path, const char *dir, const char *url,
                        char *src, size_t n, double t_memcpy, uint64_t *sink)
{
    char err[512];
    ll_store_opts_t opts = {
        .redis_url = url, .pool_bytes = n + n / 50 + 8 * R, .pool_path = pool_path};
    char session[64];
    snprintf(session, sizeof session, "bench-%d-%s", (int) getpid(), label);
    for (char *c = session; *c; c++)
        if (*c == ':' || *c == ' ' || *c == '/')
            *c = '-';
    ll_store_t *st = ll_store_open(dir, session, &opts, err, sizeof err);
    if (!st) {
        printf("[%s] skipped: %s\n", label, err);
        return -1;
    }
    ll_store_stats_t stats;
    ll_store_stats(st, &stats);
    printf("[%s] pool %s, page kind %s\n", label, stats.pool.path, stats.pool.page_kind);
    char *ref = s_bench_fresh(st, &stats, src, n, t_memcpy);
    if (!ref) {
        ll_store_delete_session(st);
        ll_store_destroy(&st);
        return -1;
    }
    ll_store_discard(st, ref);
    free(ref);
    ll_store_gc(st);
    size_t written;
    double t0 = ll_clock_s();
    ref = ll_store_put(st, src, n, NULL, NULL, &written);
    double t_put = ll_clock_s() - t0;
    s_line("save, warm pool (target <= 2x)", t_put, n, t_memcpy);
    const char *prefs[] = {ref};
    ll_store_write_t w = {.name = "x", .blob = "", .prefs = prefs, .nprefs = 1};
    uint64_t version;
    t0 = ll_clock_s();
    if (ll_store_commit(st, "bench", &w, 1, NULL, 0, NULL, 0, &version) != 0)
        printf("  commit failed: %s\n", ll_store_errstr(st));
    double t_commit = ll_clock_s() - t0;
    s_bench_incremental(st, ref, src, n, t_memcpy, t_commit);
    s_bench_restore(st, ref, src, n, t_memcpy, sink);
    free(ref);
    ll_store_delete_session(st);
    ll_store_destroy(&st);
    s_bench_after_idle(dir, session, &opts, src, n, t_memcpy);
    return 0;
}

int main(void)
{
    ll_log_init('A');
    size_t n = (size_t) 1 << 30;
    const char *nb = getenv("LL_BENCH_BYTES");
    if (nb && *nb)
        n = (size_t) strtoull(nb, NULL, 10);
    if (n < R) {
        fprintf(stderr, "LL_BENCH_BYTES must be at least %zu\n", (size_t) R);
        return 2;
    }
    /* Source and memcpy target: anonymous THP (madvise mode is on here),
     * prefaulted, so the baseline is the copy itself. */
    char *src = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        fprintf(stderr, "cannot allocate 2 x %zu bytes\n", n);
        return 1;
    }
    madvise(src, n, MADV_HUGEPAGE);
    madvise(dst, n, MADV_HUGEPAGE);
    for (size_t i = 0; i < n / 8; i++)
        ((uint64_t *) src)[i] = i * 0x9e3779b97f4a7c15ULL;
    memset(dst, 0, n);
    double t1 = s_memcpy_time(dst, src, n, 1), t2 = s_memcpy_time(dst, src, n, 2);
    munmap(dst, n);
    printf("ll_store_bench: %zu MiB payload, %ld cpus, runtime dir on /dev/shm\n", n >> 20,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("  %-34s %9.2f ms %7.2f GB/s   (the baseline)\n", "memcpy, 1 thread, prefaulted",
           t1 * 1e3, (double) n / t1 / 1e9);
    printf("  %-34s %9.2f ms %7.2f GB/s\n", "memcpy, 2 threads, prefaulted", t2 * 1e3,
           (double) n / t2 / 1e9);

    /* Optionally make every page kind available (root only; restored below). */
    const char *shmem_path = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
    const char *nr_path = "/proc/sys/vm/nr_overcommit_hugepages";
    char shmem_old[128], nr_old[64], sel[32] = "";
    bool sysctl = getenv("LL_BENCH_SYSCTL") && strcmp(getenv("LL_BENCH_SYSCTL"), "1") == 0;
    s_read_file(shmem_path, shmem_old, sizeof shmem_old);
    s_read_file(nr_path, nr_old, sizeof nr_old);
    char *b = strchr(shmem_old, '['), *e = b ? strchr(b, ']') : NULL;
    if (b && e)
        snprintf(sel, sizeof sel, "%.*s", (int) (e - b - 1), b + 1);
    if (sysctl) {
        /* The setting recommended for hosts (API.md): all of RAM in 2 MiB
         * pages, i.e. no cap beyond each pool's size and free memory. */
        long all = sysconf(_SC_PHYS_PAGES) * (sysconf(_SC_PAGESIZE) / 1024) / 2048;
        char want[32];
        snprintf(want, sizeof want, "%ld", atol(nr_old) > all ? atol(nr_old) : all);
        if (s_write_file(shmem_path, "advise") != 0 || s_write_file(nr_path, want) != 0)
            printf("LL_BENCH_SYSCTL: cannot change %s / %s: %s\n", shmem_path, nr_path,
                   strerror(errno));
    }

    /* The runtime dir on tmpfs, as recommended (API.md): Redis fsyncs its
     * append-only file at every commit, free on tmpfs, milliseconds on a
     * busy disk. */
    char dir[] = "/dev/shm/ll-store-bench-XXXXXX", err[512];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    bool started;
    char *sock = ll_redis_start(dir, NULL, &started, err, sizeof err);
    if (!sock) {
        fprintf(stderr, "ll_store_bench: %s\n", err);
        return 1;
    }
    char url[600];
    snprintf(url, sizeof url, "unix://%s", sock);
    free(sock);
    uint64_t sink = 0;
    char shm_path[128];
    snprintf(shm_path, sizeof shm_path, "/dev/shm/ll-store-bench-%d.pool", (int) getpid());
    /* What a kernel (the session's owner) would get for a pool of the
     * default size, and for the pools below. */
    char kind[16] = "4k", why[768], kind_b[16] = "4k", why_b[768];
    if (ll_store_page_kind_choice(0, true, kind, why, sizeof why) != 0)
        snprintf(kind, sizeof kind, "4k");
    if (ll_store_page_kind_choice(n + n / 50 + 8 * R, true, kind_b, why_b, sizeof why_b) != 0)
        snprintf(kind_b, sizeof kind_b, "4k");
    printf("page kind of a kernel's pool here%s: %s\n  (%s)\n",
           sysctl ? " (with the LL_BENCH_SYSCTL settings)" : "", kind, why);
    if (strcmp(kind, kind_b) != 0)
        printf("  (the bench's smaller pools would get %s: %s)\n", kind_b, why_b);
    const char *chosen = strcmp(kind_b, "hugetlb") == 0 ? "memfd:hugetlb"
                         : strcmp(kind_b, "thp") == 0   ? "memfd:thp"
                                                        : shm_path;
    char label[64];
    snprintf(label, sizeof label, "chosen: %s", kind_b);
    s_bench_kind(label, chosen, dir, url, src, n, t1, &sink);
    if (strcmp(kind_b, "4k") != 0)
        s_bench_kind("4k: shm file", shm_path, dir, url, src, n, t1, &sink);
    char now[128];
    s_read_file(shmem_path, now, sizeof now);
    if (strstr(now, "[never]") || strstr(now, "[deny]"))
        printf("[memfd:thp] skipped: shmem THP is off (%s: %s; as root: echo advise > it, or "
               "LL_BENCH_SYSCTL=1)\n",
               shmem_path, now);
    else if (strcmp(kind_b, "thp") != 0)
        s_bench_kind("memfd:thp", "memfd:thp", dir, url, src, n, t1, &sink);
    if (strcmp(kind_b, "hugetlb") == 0) {
        /* measured above */
    } else if (s_meminfo("HugePages_Free") * R < n + n / 50 + 8 * R) {
        printf("[memfd:hugetlb] skipped: %s\n  (as root: sysctl vm.nr_overcommit_hugepages=N, "
               "or LL_BENCH_SYSCTL=1)\n",
               why_b);
    } else {
        s_bench_kind("memfd:hugetlb", "memfd:hugetlb", dir, url, src, n, t1, &sink);
    }

    if (sysctl) {
        if (sel[0])
            s_write_file(shmem_path, sel);
        s_write_file(nr_path, nr_old);
    }
    ll_redis_stop(dir, err, sizeof err);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    unlink(shm_path);
    munmap(src, n);
    return sink == 42 ? 3 : 0; /* keep the reads from being optimised away */
}

/* ll_store_bench: put/map throughput of the store against memcpy of the
 * same bytes on this machine, for each pool page kind the host offers
 * (make bench).  A standalone program: starts its own redis-server in a
 * temp dir and removes it.  Prints times and ratios measured in one run
 * (the machines are shared and noisy: compare ratios, not absolutes).
 *
 *   LL_BENCH_BYTES=N      payload size (default 1 GiB)
 *   LL_BENCH_SYSCTL=1     as root, enable shmem THP ("advise") and reserve
 *                         huge pages for the run, restoring both after, so
 *                         every page kind can be measured on this host. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "proto/ll_log.h"
#include "store/ll_redis.h"
#include "store/ll_store.h"

#define R LL_POOL_REGION_BYTES

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *s_read_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    buf[0] = 0;
    if (f) {
        if (!fgets(buf, (int)len, f))
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
        double t0 = s_now();
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
        double t = s_now() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

static double s_read_time(const char *p, size_t n, uint64_t *sink)
{
    double t0 = s_now();
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s = 0;
    for (size_t i = 0; i < n / 8; i++)
        s += q[i];
    *sink += s;
    return s_now() - t0;
}

static void s_line(const char *what, double t, size_t n, double base)
{
    printf("  %-34s %9.2f ms %7.2f GB/s   %7.3fx memcpy\n", what, t * 1e3,
           t > 0 ? (double)n / t / 1e9 : 0.0, t / base);
}

/* One page kind: returns 0, or -1 when the pool could not be used. */
static int s_bench_kind(const char *label, const char *pool_path, const char *dir, const char *url,
                        char *src, size_t n, double t_memcpy, uint64_t *sink)
{
    char err[512];
    ll_store_opts_t opts = {.redis_url = url, .pool_bytes = n + n / 50 + 8 * R,
                            .pool_path = pool_path};
    char session[64];
    snprintf(session, sizeof session, "bench-%d-%s", (int)getpid(), label);
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
    size_t written;
    double t0 = s_now();
    char *ref = ll_store_put(st, src, n, NULL, NULL, &written);
    double t_fresh = s_now() - t0;
    if (!ref) {
        printf("  put failed: %s\n", ll_store_errstr(st));
        ll_store_delete_session(st);
        ll_store_destroy(&st);
        return -1;
    }
    s_line("save, fresh pool (first touch)", t_fresh, n, t_memcpy);
    printf("  %-34s %9s    %7.2f ms per 2 MiB region\n", "", "",
           t_fresh * 1e3 / (double)((n + R - 1) / R));
    ll_store_discard(st, ref);
    free(ref);
    ll_store_gc(st);
    t0 = s_now();
    ref = ll_store_put(st, src, n, NULL, NULL, &written);
    double t_put = s_now() - t0;
    s_line("save, warm pool (target <= 2x)", t_put, n, t_memcpy);
    const char *prefs[] = {ref};
    ll_store_write_t w = {.name = "x", .blob = "", .prefs = prefs, .nprefs = 1};
    uint64_t version;
    t0 = s_now();
    if (ll_store_commit(st, "bench", &w, 1, NULL, 0, NULL, 0, &version) != 0)
        printf("  commit failed: %s\n", ll_store_errstr(st));
    double t_commit = s_now() - t0;
    t0 = s_now();
    char *same = ll_store_put(st, src, n, ref, NULL, &written);
    double t_same = s_now() - t0;
    s_line("incremental save, unchanged", t_same + t_commit, n, t_memcpy);
    printf("  %-34s %9.2f ms (hash all regions, write %zu bytes, commit %.2f ms)\n", "",
           (t_same + t_commit) * 1e3, written, t_commit * 1e3);
    ll_store_discard(st, same);
    free(same);
    /* Dirty 1% of the regions. */
    size_t nreg = (n + R - 1) / R, step = 100;
    for (size_t i = 0; i < nreg; i += step)
        src[i * R] ^= 0x5a;
    t0 = s_now();
    char *dirty = ll_store_put(st, src, n, ref, NULL, &written);
    double t_dirty = s_now() - t0;
    for (size_t i = 0; i < nreg; i += step)
        src[i * R] ^= 0x5a;
    if (dirty) {
        char line[64];
        snprintf(line, sizeof line, "incremental save, 1%% dirty");
        s_line(line, t_dirty, n, t_memcpy);
        printf("  %-34s %zu MiB written of %zu MiB\n", "", written >> 20, n >> 20);
        ll_store_discard(st, dirty);
        free(dirty);
    } else {
        printf("  incremental save, 1%% dirty failed: %s\n", ll_store_errstr(st));
    }
    /* The same two with the caller telling which regions it wrote (e.g. from
     * /proc/self/pagemap of a restored mapping): no hashing of the rest. */
    uint8_t *mask = calloc(nreg, 1);
    if (mask) {
        t0 = s_now();
        char *r = ll_store_put(st, src, n, ref, mask, &written);
        double t_hint = s_now() - t0;
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
        t0 = s_now();
        r = ll_store_put(st, src, n, ref, mask, &written);
        t_hint = s_now() - t0;
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
    t0 = s_now();
    ll_pool_map_t *map = ll_store_map(st, ref, false);
    double t_map = s_now() - t0;
    if (map) {
        s_line("restore: map (no copy; target < 1x)", t_map, n, t_memcpy);
        double t_read = s_read_time(ll_pool_map_addr(map), n, sink);
        s_line("  then first read of every byte", t_read, n, t_memcpy);
        double t_src = s_read_time(src, n, sink);
        s_line("  (read of the source, for scale)", t_src, n, t_memcpy);
        ll_pool_unmap(&map);
    } else {
        printf("  map failed: %s\n", ll_store_errstr(st));
    }
    free(ref);
    ll_store_delete_session(st);
    ll_store_destroy(&st);
    return 0;
}

int main(void)
{
    ll_log_init('A');
    size_t n = (size_t)1 << 30;
    const char *nb = getenv("LL_BENCH_BYTES");
    if (nb && *nb)
        n = (size_t)strtoull(nb, NULL, 10);
    if (n < R) {
        fprintf(stderr, "LL_BENCH_BYTES must be at least %zu\n", (size_t)R);
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
        ((uint64_t *)src)[i] = i * 0x9e3779b97f4a7c15ULL;
    memset(dst, 0, n);
    double t1 = s_memcpy_time(dst, src, n, 1), t2 = s_memcpy_time(dst, src, n, 2);
    munmap(dst, n);
    printf("ll_store_bench: %zu MiB payload, %ld cpus, runtime dir on /dev/shm\n", n >> 20,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("  %-34s %9.2f ms %7.2f GB/s   (the baseline)\n", "memcpy, 1 thread, prefaulted", t1 * 1e3,
           (double)n / t1 / 1e9);
    printf("  %-34s %9.2f ms %7.2f GB/s\n", "memcpy, 2 threads, prefaulted", t2 * 1e3,
           (double)n / t2 / 1e9);

    /* Optionally make every page kind available (root only; restored below). */
    const char *shmem_path = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
    const char *nr_path = "/proc/sys/vm/nr_hugepages";
    char shmem_old[128], nr_old[64], sel[32] = "";
    bool sysctl = getenv("LL_BENCH_SYSCTL") && strcmp(getenv("LL_BENCH_SYSCTL"), "1") == 0;
    s_read_file(shmem_path, shmem_old, sizeof shmem_old);
    s_read_file(nr_path, nr_old, sizeof nr_old);
    char *b = strchr(shmem_old, '['), *e = b ? strchr(b, ']') : NULL;
    if (b && e)
        snprintf(sel, sizeof sel, "%.*s", (int)(e - b - 1), b + 1);
    if (sysctl) {
        char want[32];
        snprintf(want, sizeof want, "%ld", atol(nr_old) + (long)((n + n / 50 + 8 * R) / R) + 1);
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
    char *sock = ll_redis_start(dir, &started, err, sizeof err);
    if (!sock) {
        fprintf(stderr, "ll_store_bench: %s\n", err);
        return 1;
    }
    char url[600];
    snprintf(url, sizeof url, "unix://%s", sock);
    free(sock);
    uint64_t sink = 0;
    char shm_path[128];
    snprintf(shm_path, sizeof shm_path, "/dev/shm/ll-store-bench-%d.pool", (int)getpid());
    s_bench_kind("shm file", shm_path, dir, url, src, n, t1, &sink);
    char now[128];
    s_read_file(shmem_path, now, sizeof now);
    if (strstr(now, "[never]") || strstr(now, "[deny]"))
        printf("[memfd:thp] skipped: shmem THP is off (%s: %s; as root: echo advise > it, or "
               "LL_BENCH_SYSCTL=1)\n", shmem_path, now);
    else
        s_bench_kind("memfd:thp", "memfd:thp", dir, url, src, n, t1, &sink);
    long hp_free = s_meminfo("HugePages_Free");
    if (hp_free < 0 || (size_t)hp_free * R < n + n / 50 + 8 * R)
        printf("[memfd:hugetlb] skipped: %ld free 2 MiB huge pages, %zu needed (as root: "
               "sysctl vm.nr_hugepages=N, or LL_BENCH_SYSCTL=1)\n", hp_free,
               (n + n / 50 + 8 * R) / R);
    else
        s_bench_kind("memfd:hugetlb", "memfd:hugetlb", dir, url, src, n, t1, &sink);

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

/* ll_pool_selftest: the payload pool's self-test (no Redis needed):
 * allocate, back, lease, map and reclaim in one process and across a
 * fork.  A file of its own because it drives every part of the pool
 * (ll_pool.c, ll_pool_pages.c, ll_pool_reclaim.c), which sit below it. */
#include "store/ll_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/ll_log.h"
#include "store/ll_mman.h"
#include "store/ll_pool_internal.h"
#include "base/ll_check.h"

static uint64_t s_test_mark_gen[8];
static ll_pool_t *volatile s_test_child_pool; /* reachable, so leak checkers see no leak */

static int s_test_refs(void *ctx, uint64_t *mark, size_t nregions)
{
    for (size_t i = 0; i < nregions && i < 8; i++)
        mark[i] = s_test_mark_gen[i];
    return 0;
}

int ll_pool_selftest(bool verbose)
{
    char err[256];
    ll_pool_map_t *map = NULL;
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/ll-pool-selftest-%d.pool", (int) getpid());
    unlink(path);
    ll_pool_t *pool = ll_pool_open(path, 4 * LL_POOL_REGION_BYTES, err, sizeof err);
    S_REQUIRE(pool, fail);
    ll_pool_region_t r[4];
    void *addr[4];
    int kind;
    /* Fill the pool as a put does (allocate, back, write); the fifth
     * allocation is a clear "full" error. */
    for (int i = 0; i < 4; i++) {
        S_REQUIRE(ll_pool_alloc_unbacked(pool, &r[i], &addr[i], &kind, err, sizeof err) == 0, fail);
        S_REQUIRE(ll_pool_back(pool, r[i].idx) == 0, fail);
        S_REQUIRE(ll_pool_back(pool, r[i].idx) == 0, fail); /* once is enough; twice is harmless */
        memset(addr[i], 'a' + i, LL_POOL_REGION_BYTES);
    }
    S_REQUIRE(ll_pool_back(pool, 4) == EINVAL, fail);
    ll_pool_stats_t stats;
    ll_pool_stats(pool, &stats);
    S_REQUIRE(stats.regions_used == 4 && stats.regions_leased == 4 && stats.regions_prefaulted == 4,
              fail);
    ll_pool_region_t extra;
    void *xa;
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &extra, &xa, &kind, err, sizeof err) == -1, fail);
    S_REQUIRE(kind == LL_POOL_EFULL && strstr(err, "full"), fail);
    /* Map regions 3 and 1 (not adjacent, reversed) as one buffer. */
    ll_pool_region_t pick[2] = {r[3], r[1]};
    map = ll_pool_map(pool, pick, 2, LL_POOL_REGION_BYTES + 10, false, &kind, err, sizeof err);
    S_REQUIRE(map, fail);
    const char *m = ll_pool_map_addr(map);
    S_REQUIRE(m[0] == 'd' && m[LL_POOL_REGION_BYTES - 1] == 'd' && m[LL_POOL_REGION_BYTES] == 'b',
              fail);
    S_REQUIRE(ll_pool_map_len(map) == LL_POOL_REGION_BYTES + 10, fail);
    /* Bad spans are refused. */
    S_REQUIRE(!ll_pool_map(pool, pick, 2, 10, false, &kind, err, sizeof err) &&
                  kind == LL_POOL_EINVAL,
              fail);
    /* The writer drops its allocation leases: only region 0 is "committed",
     * regions 1 and 3 are held by the mapping, region 2 is garbage. */
    for (int i = 0; i < 4; i++)
        ll_pool_unlease(pool, r[i].idx);
    memset(s_test_mark_gen, 0, sizeof s_test_mark_gen);
    s_test_mark_gen[r[0].idx] = r[0].gen;
    int freed = ll_pool_gc(pool, s_test_refs, NULL, err, sizeof err);
    S_REQUIRE(freed == 1, fail);
    S_REQUIRE(ll_pool_lease(pool, &r[2]) == -1, fail); /* reclaimed */
    S_REQUIRE(ll_pool_lease(pool, &r[0]) == 0, fail);
    ll_pool_unlease(pool, r[0].idx);
    /* Prefaulted here: region 2 is free, region 0 allocated but unleased. */
    size_t free_warm, idle_warm;
    ll_pool_warm_counts(pool, &free_warm, &idle_warm);
    S_REQUIRE(free_warm == 1 && idle_warm == 1, fail);
    /* A reused index gets a new generation: the old reference stays dead. */
    ll_pool_region_t again, again2;
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &again, &xa, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(again.idx == r[2].idx && again.gen > r[2].gen, fail);
    S_REQUIRE(xa == addr[2], fail); /* the same place in the pool */
    S_REQUIRE(ll_pool_lease(pool, &r[2]) == -1, fail);
    /* Given back unwritten (a put that failed): free again, and the next
     * allocation moves the generation on. */
    ll_pool_free_unwritten(pool, &again);
    ll_pool_unlease(pool, again.idx);
    S_REQUIRE(ll_pool_lease(pool, &again) == -1, fail);
    S_REQUIRE(ll_pool_alloc_unbacked(pool, &again2, &xa, &kind, err, sizeof err) == 0, fail);
    S_REQUIRE(again2.idx == again.idx && again2.gen == again.gen + 1, fail);
    ll_pool_unlease(pool, again2.idx);
    /* Unmapping releases the mapping's leases; the bytes were intact. */
    S_REQUIRE(m[LL_POOL_REGION_BYTES + 5] == 'b', fail);
    ll_pool_unmap(&map);
    S_REQUIRE(map == NULL, fail);
    ll_pool_unmap(&map); /* safe twice */
    freed = ll_pool_gc(pool, s_test_refs, NULL, err, sizeof err);
    S_REQUIRE(freed == 3, fail); /* 1, 3 and the re-allocated 2 */

    /* A process that dies holding leases: its slot and leases are dropped. */
    pid_t child = fork();
    if (child == 0) {
        char e2[256];
        ll_pool_t *p2 = s_test_child_pool = ll_pool_open(path, 0, e2, sizeof e2);
        ll_pool_region_t cr;
        void *ca;
        int k2;
        _exit(p2 && ll_pool_alloc_unbacked(p2, &cr, &ca, &k2, e2, sizeof e2) == 0 ? 0 : 1);
    }
    int status;
    S_REQUIRE(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
                  WEXITSTATUS(status) == 0,
              fail);
    ll_pool_stats(pool, &stats);
    S_REQUIRE(stats.regions_used == 2, fail); /* region 0 and the dead child's */
    freed = ll_pool_gc(pool, s_test_refs, NULL, err, sizeof err);
    S_REQUIRE(freed == 1, fail);
    /* A second handle in this process opens the same pool. */
    ll_pool_t *p3 = ll_pool_open(path, 0, err, sizeof err);
    S_REQUIRE(p3 && p3->nregions == 4 && p3->slot != pool->slot, fail);
    S_REQUIRE(ll_pool_lease(p3, &r[0]) == 0, fail);
    ll_pool_destroy(&p3);
    if (verbose)
        printf("(page kind %s) ", pool->page_kind);
    ll_pool_unlink(pool);
    ll_pool_destroy(&pool);
    S_REQUIRE(pool == NULL, fail);
    ll_pool_destroy(&pool);
    /* A creator killed between sizing the file and writing the magic left a
     * sized file of zeros: the next opener initialises it. */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    S_REQUIRE(fd >= 0 && ftruncate(fd, 3 * LL_POOL_REGION_BYTES) == 0, fail);
    close(fd);
    pool = ll_pool_open(path, 2 * LL_POOL_REGION_BYTES, err, sizeof err);
    S_REQUIRE(pool && pool->nregions == 2, fail);
    ll_pool_unlink(pool);
    ll_pool_destroy(&pool);
    return 0;
fail:
    ll_pool_unmap(&map);
    unlink(path);
    ll_pool_destroy(&pool);
    return 1;
}

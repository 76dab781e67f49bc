/* ll_store_selftest: the store's end-to-end self-test: it starts its own
 * redis-server, then puts, commits, fetches, maps, reclaims and deletes
 * a session's variables, and checks the failures a caller must see
 * (stale versions, a stalled Redis).  A file of its own because it drives
 * the whole store (ll_store.c, ll_store_put.c, ll_store_commit.c), which
 * sits below it.
 *
 * Why ll_store_selftest is long: it is one sequence against one store (its
 * redis-server and pool), each step needing the state the one before left;
 * cut into functions it would pass that state around for no reader's gain. */
#include "store/ll_store.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/ll_clock.h"
#include "base/ll_log.h"
#include "store/ll_pagekind.h"
#include "store/ll_redis.h"
#include "store/ll_store_internal.h"
#include "base/ll_check.h"

int ll_store_selftest(bool verbose)
{
    char dir[] = "/tmp/ll-store-selftest-XXXXXX", err[512];
    ll_store_t *st = NULL;
    ll_store_entry_t *e = NULL;
    size_t ne = 0;
    char *ref1 = NULL, *ref2 = NULL;
    ll_pool_map_t *map = NULL;
    int rc = 1;
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ll_store selftest: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char pool_path[128];
    snprintf(pool_path, sizeof pool_path, "/dev/shm/ll-store-selftest-%d.pool", (int) getpid());
    /* A short timeout for the stall below (read by the store and its guard
     * when they start). */
    const char *timeout_env = getenv("LL_STORE_TIMEOUT_S");
    char *saved_timeout = timeout_env ? strdup(timeout_env) : NULL;
    setenv("LL_STORE_TIMEOUT_S", "2", 1);
    /* Sizes as LL_STORE_POOL_BYTES takes them. */
    size_t nb = 0;
    S_REQUIRE(ll_store_parse_bytes("64G", &nb) == 0 && nb == (size_t) 64 << 30, fail);
    S_REQUIRE(ll_store_parse_bytes("512MiB", &nb) == 0 && nb == (size_t) 512 << 20, fail);
    S_REQUIRE(ll_store_parse_bytes("3k", &nb) == 0 && nb == 3072, fail);
    S_REQUIRE(ll_store_parse_bytes("1TB", &nb) == 0 && nb == (size_t) 1 << 40, fail);
    S_REQUIRE(ll_store_parse_bytes("1048576", &nb) == 0 && nb == 1048576, fail);
    S_REQUIRE(ll_store_parse_bytes("", &nb) == -1 && ll_store_parse_bytes("G", &nb) == -1, fail);
    S_REQUIRE(ll_store_parse_bytes("-1G", &nb) == -1 && ll_store_parse_bytes("12X", &nb) == -1,
              fail);
    S_REQUIRE(ll_store_parse_bytes("1Gx", &nb) == -1 &&
                  ll_store_parse_bytes("99999999999T", &nb) == -1,
              fail);
    ll_store_opts_t opts = {.pool_bytes = 8 * LL_STORE_R, .pool_path = pool_path};
    st = ll_store_open(dir, "bad session!", &opts, err, sizeof err);
    S_REQUIRE(!st && strstr(err, "session id"), fail);
    st = ll_store_open(dir, "selftest", &opts, err, sizeof err);
    if (!st)
        fprintf(stderr, "ll_store selftest: open: %s\n", err);
    S_REQUIRE(st, fail);
    S_REQUIRE(st->redis_owned, fail);
    /* A 3-region payload, then the same with one byte changed in region 1. */
    size_t len = 2 * LL_STORE_R + 100, written;
    char *buf = malloc(len);
    S_REQUIRE(buf, fail);
    for (size_t i = 0; i < len; i++)
        buf[i] = (char) (i * 7);
    ref1 = ll_store_put(st, buf, len, NULL, NULL, &written);
    S_REQUIRE(ref1 && written == len && ll_store_ref_nbytes(ref1) == (long long) len, fail);
    buf[LL_STORE_R + 5] ^= 1;
    ref2 = ll_store_put(st, buf, len, ref1, NULL, &written);
    S_REQUIRE(ref2 && written == LL_STORE_R, fail);
    S_REQUIRE(ll_store_put(st, buf, len, "P1/zz", NULL, &written) == NULL &&
                  st->errkind == LL_STORE_EINVAL,
              fail);
    const char *prefs[] = {ref2};
    const char *refs[] = {"y"};
    ll_store_write_t w[2] = {
        {.name = "x",
         .blob = "blob-x",
         .bloblen = 6,
         .prefs = prefs,
         .nprefs = 1,
         .refs = refs,
         .nrefs = 1},
        {.name = "y", .blob = "", .bloblen = 0},
    };
    uint64_t v1 = 0, v2 = 0;
    S_REQUIRE(ll_store_commit(st, "cell-1", w, 2, NULL, 0, NULL, 0, &v1) == 0 && v1 == 1, fail);
    S_REQUIRE(ll_store_discard(st, ref1) == 0, fail); /* never committed */
    /* A stale base version is a conflict and writes nothing. */
    ll_store_base_t stale = {"x", 0};
    S_REQUIRE(ll_store_commit(st, "cell-2", w, 1, NULL, 0, &stale, 1, &v2) == -1 &&
                  st->errkind == LL_STORE_ECONFLICT,
              fail);
    const char *del[] = {"y"};
    ll_store_base_t ok = {"x", v1};
    S_REQUIRE(ll_store_commit(st, "cell-2", w, 1, del, 1, &ok, 1, &v2) == 0 && v2 == 2, fail);
    const char *names[] = {"x", "y", "nope"};
    S_REQUIRE(ll_store_fetch(st, names, 3, &e, &ne) == 0 && ne == 1, fail);
    S_REQUIRE(strcmp(e[0].name, "x") == 0 && e[0].version == 2 && e[0].bloblen == 6 &&
                  memcmp(e[0].blob, "blob-x", 6) == 0 && e[0].nprefs == 1 &&
                  strcmp(e[0].prefs[0], ref2) == 0 && e[0].nrefs == 1 &&
                  strcmp(e[0].refs[0], "y") == 0,
              fail);
    map = ll_store_map(st, e[0].prefs[0], false);
    S_REQUIRE(map && ll_pool_map_len(map) == len && memcmp(ll_pool_map_addr(map), buf, len) == 0,
              fail);
    ll_pool_unmap(&map);
    /* ref1's own region 1 is garbage now; reclamation finds exactly it. */
    /* (the owner's idle reclamation may have been first) */
    int freed = ll_store_gc(st);
    S_REQUIRE(freed == 1 || (freed == 0 && st->reclaimed == 1), fail);
    uint64_t lv;
    char *cell;
    S_REQUIRE(ll_store_last_commit(st, &lv, &cell) == 0 && lv == 2 && cell &&
                  strcmp(cell, "cell-2") == 0,
              fail);
    free(cell);

    /* The owner's guard: its redis-server killed, a new one comes up on the
     * same data and the dead one is reaped; one stopped (SIGSTOP) is killed
     * after half the timeout and comes back too, and a call that met the
     * stall either rode it out or failed as unavailable, never hung. */
    S_REQUIRE(st->guard, fail);
    pid_t rp = ll_redis_server_pid(dir);
    S_REQUIRE(rp > 0 && kill(rp, SIGKILL) == 0, fail);
    for (double until = ll_clock_ms() + 15000;
         ll_redis_guard_restarts(st->guard) < 1 && ll_clock_ms() < until;)
        usleep(10000);
    S_REQUIRE(ll_redis_guard_restarts(st->guard) == 1, fail);
    S_REQUIRE(kill(rp, 0) != 0 && errno == ESRCH, fail); /* reaped, not <defunct> */
    S_REQUIRE(ll_store_last_commit(st, &lv, &cell) == 0 && lv == 2, fail);
    free(cell);
    rp = ll_redis_server_pid(dir);
    S_REQUIRE(rp > 0 && kill(rp, SIGSTOP) == 0, fail);
    double t0 = ll_clock_ms();
    int got = ll_store_last_commit(st, &lv, &cell);
    double waited = ll_clock_ms() - t0;
    if (got == 0)
        free(cell);
    S_REQUIRE(got == 0 || ll_store_errkind(st) == LL_STORE_EUNAVAIL, fail);
    S_REQUIRE(waited < 2000 * 1.5 + 500, fail);
    for (double until = ll_clock_ms() + 15000;
         ll_redis_guard_restarts(st->guard) < 2 && ll_clock_ms() < until;)
        usleep(10000);
    S_REQUIRE(ll_redis_guard_restarts(st->guard) == 2, fail);
    S_REQUIRE(ll_store_last_commit(st, &lv, &cell) == 0 && lv == 2, fail);
    free(cell);
    S_REQUIRE(ll_store_delete_session(st) == 0, fail);
    free(buf);
    if (verbose)
        printf("(redis in %s) ", dir);
    rc = 0;
fail:
    if (rc != 0 && st) /* what the failed check's call said */
        fprintf(stderr, "ll_store selftest: last error: %s\n", st->err);
    ll_store_entries_free(e, ne);
    ll_pool_unmap(&map);
    free(ref1);
    free(ref2);
    ll_store_destroy(&st); /* stops the redis-server it started */
    if (saved_timeout)
        setenv("LL_STORE_TIMEOUT_S", saved_timeout, 1);
    else
        unsetenv("LL_STORE_TIMEOUT_S");
    free(saved_timeout);
    unlink(pool_path);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "ll_store selftest: could not remove %s\n", dir);
    return rc;
}

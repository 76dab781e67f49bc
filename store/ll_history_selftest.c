/* ll_history_selftest: the kept versions end to end (commit, list, fetch,
 * prune, reclamation keeping what the history holds), on a private
 * redis-server and pool; above ll_history.c and the store it exercises. */
#include "store/ll_history.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/ll_check.h"
#include "base/ll_log.h"
#include "store/ll_store_internal.h"

/* ---- self-test (a private redis-server in a temp dir) ------------------ */

static size_t s_used(ll_store_t *st)
{
    ll_store_stats_t s;
    ll_store_stats(st, &s);
    return s.pool.regions_used;
}

/* Commit NAME as a payload of NREG regions filled with FILL.  0 or -1. */
static int s_test_commit(ll_store_t *st, const char *name, size_t nreg, int fill, uint64_t *ver)
{
    size_t len = nreg * LL_STORE_R, written;
    char *buf = malloc(len), *ref = NULL;
    int rc = -1;
    if (buf) {
        memset(buf, fill, len);
        ref = ll_store_put(st, buf, len, NULL, NULL, &written);
    }
    if (ref) {
        const char *prefs[] = {ref};
        ll_store_write_t w = {.name = name, .blob = "b", .bloblen = 1, .prefs = prefs, .nprefs = 1};
        rc = ll_store_commit(st, "c", &w, 1, NULL, 0, NULL, 0, ver);
    }
    free(ref);
    free(buf);
    return rc;
}

/* Kept versions are readers (reclamation leaves them), a fetch of one reads
 * its bytes, a prune drops the oldest first and reclamation then frees
 * them, a dropped version says so, and a full pool drops them all. */
int ll_history_selftest(bool verbose)
{
    char dir[] = "/tmp/ll-history-selftest-XXXXXX", err[512], pool_path[128];
    ll_store_t *st = NULL;
    ll_store_entry_t *e = NULL;
    ll_pool_map_t *map = NULL;
    char *text = NULL;
    int rc = 1;
    if (!mkdtemp(dir))
        return 1;
    snprintf(pool_path, sizeof pool_path, "/dev/shm/ll-history-selftest-%d.pool", (int) getpid());
    ll_store_opts_t opts = {
        .pool_bytes = 8 * LL_STORE_R, .pool_path = pool_path, .reserve_bytes = -1};
    st = ll_store_open(dir, "selftest", &opts, err, sizeof err);
    if (!st)
        fprintf(stderr, "ll_history selftest: open: %s\n", err);
    S_REQUIRE(st, fail);
    S_REQUIRE(ll_history_set(st, true) == 0, fail);
    uint64_t v[4];
    for (int i = 0; i < 3; i++)
        S_REQUIRE(s_test_commit(st, "w", 2, 'a' + i, &v[i]) == 0, fail);
    S_REQUIRE(ll_store_gc(st) == 0 && s_used(st) == 6, fail);
    S_REQUIRE(ll_history_op(st, "fetch", "w", v[0], &text, &e) == 0 && e &&
                  strcmp(text, "kept") == 0,
              fail);
    map = ll_store_map(st, e->prefs[0], false);
    S_REQUIRE(map && ((const char *) ll_pool_map_addr(map))[LL_STORE_R] == 'a', fail);
    ll_pool_unmap(&map);
    ll_store_entries_free(e, 1);
    e = NULL;
    free(text);
    S_REQUIRE(ll_history_op(st, "prune", NULL, 2 * LL_STORE_R + 100, &text, NULL) == 0, fail);
    char want[64];
    snprintf(want, sizeof want, "%llu\tw\n", (unsigned long long) v[0]);
    S_REQUIRE(strcmp(text, want) == 0, fail);
    free(text);
    S_REQUIRE(ll_store_gc(st) == 2 && s_used(st) == 4, fail);
    S_REQUIRE(ll_history_op(st, "fetch", "w", v[0], &text, &e) == 0 && !e &&
                  strncmp(text, "dropped ", 8) == 0,
              fail);
    free(text);
    text = NULL;
    /* 4 regions used, 4 free: a 6-region save drops the kept old version. */
    S_REQUIRE(s_test_commit(st, "x", 6, 'x', &v[3]) == 0 && s_used(st) == 8, fail);
    S_REQUIRE(ll_history_op(st, "list", "w", 0, &text, NULL) == 0 && strstr(text, "\t1\tc\n") &&
                  !strstr(text, "\t0\tc\n"),
              fail);
    S_REQUIRE(ll_store_delete_session(st) == 0, fail);
    if (verbose)
        printf("(redis in %s) ", dir);
    rc = 0;
fail:
    free(text);
    ll_store_entries_free(e, e ? 1 : 0);
    ll_pool_unmap(&map);
    ll_store_destroy(&st);
    unlink(pool_path);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "ll_history selftest: could not remove %s\n", dir);
    return rc;
}

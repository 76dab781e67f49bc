/* ll_check: the checks of the C self-tests (each `int X_selftest(bool
 * verbose)`, run by build/ll_selftest from tests/selftest.c's table), so
 * that every self-test reports a failed check the same way, on stderr:
 *
 *     policy/ll_greedydual.c:172: check failed: l1 < l2
 *
 * Two macros, named for what happens after a failed check:
 *
 * S_CHECK(cond): the test goes on.  The self-test keeps `int fails = 0;`
 *   and returns `fails ? 1 : 0`; a false COND is reported and counted, so
 *   one run names every check that fails.  For checks of separate facts:
 *   nearly every self-test.
 *
 * S_REQUIRE(cond, label): the test stops.  A false COND is reported, then
 *   the test jumps to LABEL, named at the call site, which frees what the
 *   test holds and returns failure.  For a sequence whose every step needs
 *   the one before (a pool that did not open, a redis-server that did not
 *   start: going on would only crash or report the same failure again), as
 *   in the self-tests of store/, base/ll_stream.c and gateway/ll_exec.c.
 *
 * Neither returns from the function behind the caller's back. */
#ifndef LL_CHECK_H
#define LL_CHECK_H

#include <stdio.h>

/* Report that check COND at FILE:LINE failed. */
static inline void ll_check_failed(const char *file, int line, const char *cond)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", file, line, cond);
}

#define S_CHECK(cond)                                   \
    do {                                                \
        if (!(cond)) {                                  \
            ll_check_failed(__FILE__, __LINE__, #cond); \
            fails++;                                    \
        }                                               \
    } while (0)

#define S_REQUIRE(cond, label)                          \
    do {                                                \
        if (!(cond)) {                                  \
            ll_check_failed(__FILE__, __LINE__, #cond); \
            goto label;                                 \
        }                                               \
    } while (0)

#endif

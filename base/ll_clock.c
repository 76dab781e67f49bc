/* ll_clock: see ll_clock.h.  Any thread, any process. */
#include "base/ll_clock.h"

#include <stdio.h>

int64_t ll_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double ll_clock_ms(void)
{
    return (double) ll_clock_ns() / 1e6;
}

double ll_clock_s(void)
{
    return (double) ll_clock_ns() / 1e9;
}

struct timespec ll_clock_deadline(double ms)
{
    int64_t at = ll_clock_ns() + (int64_t) (ms > 0 ? ms * 1e6 : 0);
    struct timespec ts = {(time_t) (at / 1000000000), (long) (at % 1000000000)};
    return ts;
}

/* ---- self-test ----------------------------------------------------------- */

int ll_clock_selftest(bool verbose)
{
    int64_t a = ll_clock_ns();
    double ms = ll_clock_ms(), s = ll_clock_s();
    int64_t b = ll_clock_ns();
    /* Monotonic, and the three units agree within the calls' own spacing. */
    if (b < a || ms * 1e6 < (double) a - 1 || ms * 1e6 > (double) b + 1 ||
        s * 1e9 < (double) a - 1e3)
        return -1;
    struct timespec d = ll_clock_deadline(250);
    int64_t dn = (int64_t) d.tv_sec * 1000000000 + d.tv_nsec;
    if (d.tv_nsec < 0 || d.tv_nsec >= 1000000000 || dn < b + 250000000 ||
        dn > ll_clock_ns() + 250000000)
        return -1;
    struct timespec now = ll_clock_deadline(-5); /* a past deadline is now */
    if ((int64_t) now.tv_sec * 1000000000 + now.tv_nsec < b)
        return -1;
    if (verbose)
        printf("(monotonic, units, deadlines) ");
    return 0;
}

/* ll_clock: the one clock every LooseLeaf process measures time with.
 *
 * CLOCK_MONOTONIC, so intervals, timeouts and deadlines never jump with the
 * wall clock.  Values are only meaningful as differences within one boot
 * (processes of a host compare them freely: the pool and its workers do).
 * Wall-clock time for humans (log lines, message dates) is not here.
 *
 * Threads: any; async-signal-safe (clock_gettime is). */
#ifndef LL_CLOCK_H
#define LL_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Now, in nanoseconds / milliseconds / seconds. */
int64_t ll_clock_ns(void);
double ll_clock_ms(void);
double ll_clock_s(void);

/* The CLOCK_MONOTONIC instant MS milliseconds from now, as a timespec for
 * pthread_cond_timedwait on a condition whose clock is CLOCK_MONOTONIC. */
struct timespec ll_clock_deadline(double ms);

int ll_clock_selftest(bool verbose);

#endif

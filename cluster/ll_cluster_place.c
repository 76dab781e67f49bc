/* ll_cluster_place: the placement rule of ll_place.h (consolidation: the
 * most loaded host with a free slot) exposed to the cluster's Python
 * placer (cluster/looseleaf_cluster/place.py, through ctypes) as one call
 * over flat arrays, so the cluster and the simulator run the same C rule
 * and Python never mirrors the struct's layout: a change to
 * ll_place_host_t breaks this file's build, not a silent ctypes mismatch.
 * Linked into build/cluster/libllplace.so with ll_place's object (see
 * cluster/cluster.mk); not part of the looseleaf binary.  Runs in the
 * server's placer process (Python, any thread: it is pure and reentrant,
 * its only state the caller's arrays). */
#include "policy/ll_place.h"

#include <stdlib.h>

/* The host for a job among N hosts described column by column (ACCEPTING
 * non-zero: takes jobs; MEM_FREE may be NULL: unbounded), the session's
 * home HOME (-1: none) and whether its worker holds a slot there, the
 * bytes its state needs elsewhere; the rule that chose it in *HOW
 * (ll_place_how_t; may be NULL).  -1: no host can take it (or N < 0). */
int ll_cluster_place(int n, const int *accepting, const int *slots, const int *busy,
                     const int *warm, const int *staged, const int *queued, const double *mem_free,
                     int home, int home_slot, double state_bytes, int *how)
{
    if (n < 0 || n > 4096)
        return -1;
    ll_place_host_t *h = calloc(n > 0 ? (size_t) n : 1, sizeof *h);
    if (!h)
        return -1;
    for (int i = 0; i < n; i++) {
        h[i].accepting = accepting[i] != 0;
        h[i].slots = slots[i];
        h[i].busy = busy[i];
        h[i].warm = warm[i];
        h[i].staged = staged[i];
        h[i].queued = queued[i];
        h[i].mem_free = mem_free ? mem_free[i] : 1e300;
    }
    ll_place_ask_t ask = {.home = home, .home_slot = home_slot != 0, .state_bytes = state_bytes};
    ll_place_how_t chose = LL_PLACE_NONE;
    int r = ll_place_choose(h, n, &ask, &chose);
    free(h);
    if (how)
        *how = (int) chose;
    return r;
}

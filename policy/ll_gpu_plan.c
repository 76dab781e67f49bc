/* ll_gpu_plan: a host's slots laid out over its devices (see
 * ll_gpu_plan.h).  Pure; scripted by the self-test. */
#include "policy/ll_gpu_plan.h"
#include "base/ll_check.h"

#include <stdio.h>
#include <string.h>

int ll_gpu_plan(int ngpu, int per_gpu, int total, double fraction, ll_gpu_plan_t *plan)
{
    memset(plan, 0, sizeof *plan);
    if (ngpu < 1)
        return -1;
    if (ngpu > LL_GPU_MAX)
        ngpu = LL_GPU_MAX;
    int n = per_gpu > 0 ? ngpu * per_gpu : total > 0 ? total : ngpu;
    if (n > LL_GPU_MAX_SLOTS)
        n = LL_GPU_MAX_SLOTS;
    plan->nslots = n;
    for (int s = 0; s < n; s++) {
        plan->slot_dev[s] = s % ngpu;
        plan->per_dev[s % ngpu]++;
    }
    for (int s = 0; s < n; s++) {
        int k = plan->per_dev[plan->slot_dev[s]];
        plan->mem_fraction[s] = fraction >= 0 ? fraction : k > 1 ? 0.95 / k : 0;
    }
    return 0;
}

/* Self-test: the plans.                                              */

int ll_gpu_plan_selftest(bool verbose)
{
    int fails = 0;
    /* Plans: one per device by default, uncapped. */
    ll_gpu_plan_t p;
    S_CHECK(ll_gpu_plan(0, 0, 0, -1, &p) == -1);
    S_CHECK(ll_gpu_plan(1, 0, 0, -1, &p) == 0 && p.nslots == 1 && p.slot_dev[0] == 0 &&
            p.mem_fraction[0] == 0);
    /* Three per device on two devices: six slots, alternating, each capped at a third. */
    S_CHECK(ll_gpu_plan(2, 3, 0, -1, &p) == 0 && p.nslots == 6);
    S_CHECK(p.slot_dev[0] == 0 && p.slot_dev[1] == 1 && p.slot_dev[4] == 0 && p.slot_dev[5] == 1);
    S_CHECK(p.per_dev[0] == 3 && p.per_dev[1] == 3);
    S_CHECK(p.mem_fraction[2] > 0.3166 && p.mem_fraction[2] < 0.3167);
    /* A total (LL_POOL_SLOTS) spread unevenly: caps follow each device's share. */
    S_CHECK(ll_gpu_plan(2, 0, 3, -1, &p) == 0 && p.nslots == 3 && p.per_dev[0] == 2 &&
            p.per_dev[1] == 1);
    S_CHECK(p.mem_fraction[0] == 0.475 && p.mem_fraction[1] == 0 && p.mem_fraction[2] == 0.475);
    /* The per-device count wins over the total; an explicit fraction (0: none) over the default. */
    S_CHECK(ll_gpu_plan(1, 4, 2, 0, &p) == 0 && p.nslots == 4 && p.mem_fraction[3] == 0);
    S_CHECK(ll_gpu_plan(1, 2, 0, 0.3, &p) == 0 && p.mem_fraction[0] == 0.3);
    S_CHECK(ll_gpu_plan(8, 16, 0, -1, &p) == 0 && p.nslots == LL_GPU_MAX_SLOTS);

    if (verbose)
        fprintf(stderr, "ll_gpu_plan: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}

/* ll_gpu_plan: how a host's slots lie over its CUDA devices (several
 * workers per device, each with a memory cap).  Pure: the device count
 * comes from the caller (base/ll_gpu.h detects it), so the host pool and
 * the broker (ll_hostd_policy_plan) lay slots out the same way and a
 * self-test can script it. */
#ifndef LL_GPU_PLAN_H
#define LL_GPU_PLAN_H

#include "base/ll_gpu.h"

#define LL_GPU_MAX_SLOTS 64 /* slots planned, at most (LL_SCHED_MAX_SLOTS) */

/* How the slots lie over the devices. */
typedef struct {
    int nslots;                            /* slots */
    int slot_dev[LL_GPU_MAX_SLOTS];        /* slot -> device index (among the visible ones) */
    int per_dev[LL_GPU_MAX];               /* workers sharing each device */
    double mem_fraction[LL_GPU_MAX_SLOTS]; /* cap of slot's worker, a share of its device's
                                              memory (torch.cuda.set_per_process_memory_fraction);
                                              0: none */
} ll_gpu_plan_t;

/* The slots for NGPU devices (> 0): PER_GPU workers on each when > 0; else
 * TOTAL (> 0) spread round-robin (slot s on device s % NGPU); else one per
 * device.  At most LL_GPU_MAX_SLOTS.  Each worker of a device shared by k
 * gets a cap of FRACTION when >= 0 (0: no cap), else 0.95 / k when k > 1
 * (what its CUDA context and libraries take beside the allocator is left
 * over), none when alone.  0, or -1 when NGPU < 1. */
int ll_gpu_plan(int ngpu, int per_gpu, int total, double fraction, ll_gpu_plan_t *plan);

#endif

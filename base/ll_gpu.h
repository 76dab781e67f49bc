/* ll_gpu: how many CUDA devices this host has, asked of the driver in a
 * short-lived child, and how a device index is named to a worker
 * (CUDA_VISIBLE_DEVICES).  Below both the host pool and the broker, which
 * each detect at their start; how slots are laid out over the devices is
 * a pure decision, policy/ll_gpu_plan.h.  Run by the process's one thread
 * at its start.
 *
 * Why a child: cuInit in the pool would give it a CUDA context it does not
 * need, and a broken driver may hang or crash in it; the child is killed
 * after a timeout, and the pool goes on with no device (logged).
 *
 * Why the driver (libcuda.so.1) and not the runtime: the runtime
 * (libcudart.so.13 for CUDA 13) comes with each framework, often off the
 * loader path (pip puts it under site-packages/nvidia/...), while the
 * driver is installed with the kernel module and always on it.  The
 * runtime's names are still tried when no driver library loads.
 * LL_CUDA_DRIVER names the library to load instead (tests give a fake one;
 * an unusual install its path). */
#ifndef LL_GPU_H
#define LL_GPU_H

#include <stdbool.h>
#include <stddef.h>

#define LL_GPU_MAX 64 /* devices looked at, at most */

/* What the detection found. */
typedef struct {
    int count;          /* CUDA devices (0: none, or none could be counted: WHY says) */
    int driver_version; /* e.g. 13000 for CUDA 13.0 (0: unknown) */
    char via[128];      /* the library that answered ("libcuda.so.1", ...), "" none */
    char why[256];      /* count 0: the reason (no driver, cuInit's error, a timeout) */
    double ms;          /* how long the detection took */
    struct {
        char name[96];    /* cuDeviceGetName */
        size_t mem_bytes; /* cuDeviceTotalMem */
    } dev[LL_GPU_MAX];
} ll_gpu_info_t;

/* Count the CUDA devices in a child process (killed after TIMEOUT_MS), as
 * CUDA_VISIBLE_DEVICES of this process shows them.  Fills *OUT; returns
 * its count.  Forks: call it while the process is single-threaded. */
int ll_gpu_detect(ll_gpu_info_t *out, int timeout_ms);

/* The child's answer TEXT (lines "count N", "version V", "via LIB",
 * "dev I BYTES NAME", "error WHY") into *OUT.  0, or -1 when it says
 * nothing usable (OUT->why then says so). */
int ll_gpu_parse(const char *text, ll_gpu_info_t *out);

/* The CUDA_VISIBLE_DEVICES value for device index DEV (among the visible
 * ones) given the pool's own VISIBLE (NULL or "": every device, by index):
 * its DEV-th comma-separated entry, else DEV itself.  Into BUF (LEN). */
void ll_gpu_visible_entry(const char *visible, int dev, char *buf, size_t len);

#endif

/* A stub CUDA driver (soname libcuda.so.1) for the tests: the host a GPU
 * machine is, without its GPU.  It exports the part of the driver API that
 * torch, cudart and LooseLeaf's own detection (base/ll_gpu.c) touch when
 * they load the driver, initialise it and count devices, and records which
 * process called what, so a test can tell "the driver is mapped" (cuBLASLt
 * and cuSPARSELt dlopen it at `import torch`) from "the driver was
 * initialised" (cuInit: what makes a fork unsafe, and what caches the device
 * count for the process's life).  It runs no kernel and allocates nothing:
 * creating a context fails with CUDA_ERROR_NOT_SUPPORTED.
 *
 * Like the real driver:
 *   - every call but cuDriverGetVersion, cuGetProcAddress and the error
 *     strings returns CUDA_ERROR_NOT_INITIALIZED (3) before cuInit;
 *   - cuInit reads CUDA_VISIBLE_DEVICES once: the devices it lists (indices
 *     or UUIDs, GPU-4c4c5354-5542-0000-0000-0000000000NN for device NN, or
 *     unique prefixes of them, up to the first entry that is not a valid
 *     one), none when it is empty;
 *     the outcome (the count, or CUDA_ERROR_NO_DEVICE) is kept for the rest of
 *     the process, whatever CUDA_VISIBLE_DEVICES says later;
 *   - cuGetProcAddress(_v2) hands out the entry points it has (cudart 12+
 *     takes every driver function through it), CUDA_ERROR_NOT_FOUND otherwise.
 *
 * Environment:
 *   LL_CUDA_STUB_DEVICES  devices on the "host" (default 1)
 *   LL_CUDA_STUB_MEM_MIB  memory per device in MiB (default 81920)
 *   LL_CUDA_STUB_LOG      a file that gets "<pid> <call>" per call (appended
 *                         with O_APPEND: lines of several processes do not mix);
 *                         "<pid> load" when the library is mapped. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;

enum {
    S_SUCCESS = 0,
    S_INVALID_VALUE = 1,
    S_NOT_INITIALIZED = 3,
    S_NO_DEVICE = 100,
    S_INVALID_DEVICE = 101,
    S_NOT_FOUND = 500,
    S_NOT_SUPPORTED = 801,
};

#define S_MAX_DEV 64

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static int s_init_rc = -1;        /* cuInit's outcome, -1 before the first call */
static int s_count;               /* visible devices after cuInit */
static int s_physical[S_MAX_DEV]; /* visible ordinal -> the host's device index */

static void s_record(const char *call)
{
    const char *path = getenv("LL_CUDA_STUB_LOG");
    if (!path || !*path)
        return;
    int saved = errno;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        char line[160];
        int n = snprintf(line, sizeof line, "%d %s\n", (int) getpid(), call);
        if (write(fd, line, (size_t) n) < 0) {
            /* nothing to do: the record is best effort */
        }
        close(fd);
    }
    errno = saved;
}

__attribute__((constructor)) static void s_loaded(void)
{
    s_record("load");
}

static int s_host_devices(void)
{
    const char *v = getenv("LL_CUDA_STUB_DEVICES");
    int n = v && *v ? atoi(v) : 1;
    return n < 0 ? 0 : n > S_MAX_DEV ? S_MAX_DEV : n;
}

/* Device D's UUID as CUDA_VISIBLE_DEVICES and nvidia-smi write it:
 * GPU-4c4c5354-5542-0000-0000-0000000000DD ("LLSTUB", then D). */
static void s_uuid_text(int d, char *buf, size_t len)
{
    snprintf(buf, len, "GPU-4c4c5354-5542-0000-0000-0000000000%02x", d & 0xff);
}

/* The host device an entry of CUDA_VISIBLE_DEVICES (P, N bytes) names: an
 * index, or a UUID or a unique prefix of one (GPU-...); -1 if none. */
static int s_entry_device(const char *p, size_t n, int host)
{
    if (n > 4 && strncmp(p, "GPU-", 4) == 0) {
        int found = -1;
        for (int d = 0; d < host; d++) {
            char u[64];
            s_uuid_text(d, u, sizeof u);
            if (n <= strlen(u) && strncmp(p, u, n) == 0) {
                if (found >= 0)
                    return -1; /* ambiguous prefix */
                found = d;
            }
        }
        return found;
    }
    char *end;
    long d = strtol(p, &end, 10);
    if (end == p || (size_t) (end - p) != n || d < 0 || d >= host)
        return -1;
    return (int) d;
}

/* CUDA_VISIBLE_DEVICES as the driver reads it: indices or UUIDs up to the
 * first invalid or repeated entry; unset: every device. */
static void s_visible(void)
{
    int host = s_host_devices();
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    s_count = 0;
    if (!vis) {
        for (int i = 0; i < host; i++)
            s_physical[s_count++] = i;
        return;
    }
    const char *p = vis;
    while (*p && s_count < S_MAX_DEV) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, ", ");
        int d = s_entry_device(p, n, host);
        if (d < 0)
            return;
        for (int i = 0; i < s_count; i++)
            if (s_physical[i] == d)
                return;
        s_physical[s_count++] = d;
        p += n;
        while (*p == ' ')
            p++;
        if (*p != ',')
            return;
        p++;
    }
}

static CUresult s_ready(void)
{
    pthread_mutex_lock(&s_lock);
    int rc = s_init_rc < 0 ? S_NOT_INITIALIZED : s_init_rc;
    pthread_mutex_unlock(&s_lock);
    return rc;
}

static CUresult s_device(CUdevice d)
{
    int rc = s_ready();
    if (rc != S_SUCCESS)
        return rc;
    return d >= 0 && d < s_count ? S_SUCCESS : S_INVALID_DEVICE;
}

S_EXPORT CUresult cuInit(unsigned int flags)
{
    s_record("cuInit");
    if (flags != 0)
        return S_INVALID_VALUE;
    pthread_mutex_lock(&s_lock);
    if (s_init_rc < 0) {
        s_visible();
        s_init_rc = s_count > 0 ? S_SUCCESS : S_NO_DEVICE;
    }
    int rc = s_init_rc;
    pthread_mutex_unlock(&s_lock);
    return rc;
}

S_EXPORT CUresult cuDriverGetVersion(int *version)
{
    s_record("cuDriverGetVersion");
    if (!version)
        return S_INVALID_VALUE;
    const char *v = getenv("LL_CUDA_STUB_VERSION");
    *version = v && *v ? atoi(v) : 13000;
    return S_SUCCESS;
}

S_EXPORT CUresult cuDeviceGetCount(int *count)
{
    s_record("cuDeviceGetCount");
    int rc = s_ready();
    if (rc == S_NOT_INITIALIZED)
        return rc;
    if (!count)
        return S_INVALID_VALUE;
    *count = rc == S_SUCCESS ? s_count : 0;
    return S_SUCCESS;
}

S_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    s_record("cuDeviceGet");
    int rc = s_device(ordinal);
    if (rc == S_SUCCESS)
        *dev = ordinal;
    return rc;
}

S_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    s_record("cuDeviceGetName");
    int rc = s_device(dev);
    if (rc != S_SUCCESS)
        return rc;
    if (!name || len <= 0)
        return S_INVALID_VALUE;
    snprintf(name, (size_t) len, "LooseLeaf Stub GPU %d", s_physical[dev]);
    return S_SUCCESS;
}

static size_t s_mem(void)
{
    const char *v = getenv("LL_CUDA_STUB_MEM_MIB");
    size_t mib = v && *v ? strtoull(v, NULL, 10) : 81920;
    return mib << 20;
}

S_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    s_record("cuDeviceTotalMem_v2");
    int rc = s_device(dev);
    if (rc == S_SUCCESS)
        *bytes = s_mem();
    return rc;
}

/* The CUDA 3.1 signature (32 bits), still exported by the real driver. */
S_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    s_record("cuDeviceTotalMem");
    int rc = s_device(dev);
    if (rc == S_SUCCESS)
        *bytes = (unsigned int) (s_mem() > 0xffffffffu ? 0xffffffffu : s_mem());
    return rc;
}

/* A Hopper-like device: what libraries read before they pick kernels. */
S_EXPORT CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    s_record("cuDeviceGetAttribute");
    int rc = s_device(dev);
    if (rc != S_SUCCESS)
        return rc;
    switch (attrib) {
    case 1: /* max threads per block */ *value = 1024; break;
    case 2:
    case 3: /* max block dim x, y */ *value = 1024; break;
    case 4: /* max block dim z */ *value = 64; break;
    case 5: /* max grid dim x */ *value = 2147483647; break;
    case 6:
    case 7: /* max grid dim y, z */ *value = 65535; break;
    case 8: /* shared memory per block */ *value = 49152; break;
    case 10: /* warp size */ *value = 32; break;
    case 16: /* multiprocessors */ *value = 132; break;
    case 33: /* PCI bus id */ *value = 16 + s_physical[dev]; break;
    case 75: /* compute capability major */ *value = 9; break;
    case 76: /* compute capability minor */ *value = 0; break;
    default: *value = 0;
    }
    return S_SUCCESS;
}

S_EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    s_record("cuDeviceComputeCapability");
    int rc = s_device(dev);
    if (rc == S_SUCCESS) {
        *major = 9;
        *minor = 0;
    }
    return rc;
}

static CUresult s_uuid(unsigned char *uuid, CUdevice dev)
{
    int rc = s_device(dev);
    if (rc != S_SUCCESS)
        return rc;
    memset(uuid, 0, 16); /* s_uuid_text's bytes */
    memcpy(uuid, "LLSTUB", 6);
    uuid[15] = (unsigned char) s_physical[dev];
    return S_SUCCESS;
}

S_EXPORT CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev)
{
    s_record("cuDeviceGetUuid");
    return s_uuid(uuid, dev);
}

S_EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice dev)
{
    s_record("cuDeviceGetUuid_v2");
    return s_uuid(uuid, dev);
}

S_EXPORT CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev)
{
    s_record("cuDeviceGetPCIBusId");
    int rc = s_device(dev);
    if (rc == S_SUCCESS)
        snprintf(bus, (size_t) len, "0000:%02x:00.0", 16 + s_physical[dev]);
    return rc;
}

/* No context can exist: the primary context is inactive and cannot be made. */
S_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    s_record("cuDevicePrimaryCtxGetState");
    int rc = s_device(dev);
    if (rc == S_SUCCESS) {
        *flags = 0;
        *active = 0;
    }
    return rc;
}

S_EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice dev)
{
    s_record("cuDevicePrimaryCtxRetain");
    int rc = s_device(dev);
    return rc == S_SUCCESS ? S_NOT_SUPPORTED : rc;
}

S_EXPORT CUresult cuCtxGetCurrent(void **ctx)
{
    s_record("cuCtxGetCurrent");
    int rc = s_ready();
    if (rc == S_SUCCESS)
        *ctx = NULL;
    return rc;
}

/* cudart asks for the driver's private tables (by UUID) at its first call
 * and cannot go on without them: through the stub, the runtime's
 * initialisation (torch.cuda.device_count, is_available, init) calls cuInit
 * and then fails with CUDA_ERROR_NOT_SUPPORTED, so torch sees no device, as
 * it would on a host whose driver is too old.  What counts devices through
 * the driver API (LooseLeaf's pool, a library using ctypes) sees the stub's. */
S_EXPORT CUresult cuGetExportTable(const void **table, const void *id)
{
    s_record("cuGetExportTable");
    return S_NOT_SUPPORTED;
}

static const char *s_error_name(int rc)
{
    switch (rc) {
    case S_SUCCESS: return "CUDA_SUCCESS";
    case S_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case S_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case S_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case S_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case S_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case S_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    }
    return NULL;
}

S_EXPORT CUresult cuGetErrorName(int rc, const char **s)
{
    s_record("cuGetErrorName");
    *s = s_error_name(rc);
    return *s ? S_SUCCESS : S_INVALID_VALUE;
}

S_EXPORT CUresult cuGetErrorString(int rc, const char **s)
{
    s_record("cuGetErrorString");
    switch (rc) {
    case S_NO_DEVICE: *s = "no CUDA-capable device is detected"; return S_SUCCESS;
    case S_NOT_INITIALIZED: *s = "initialization error"; return S_SUCCESS;
    case S_NOT_SUPPORTED:
        *s = "operation not supported (LooseLeaf's stub CUDA driver runs nothing)";
        return S_SUCCESS;
    }
    *s = s_error_name(rc);
    return *s ? S_SUCCESS : S_INVALID_VALUE;
}

S_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                      unsigned long long flags, int *status);

/* cuGetProcAddress's table: the newest variant of each entry point there is. */
static const struct {
    const char *name;
    void *fn;
} s_procs[] = {
    {"cuInit", (void *) cuInit},
    {"cuDriverGetVersion", (void *) cuDriverGetVersion},
    {"cuDeviceGetCount", (void *) cuDeviceGetCount},
    {"cuDeviceGet", (void *) cuDeviceGet},
    {"cuDeviceGetName", (void *) cuDeviceGetName},
    {"cuDeviceTotalMem", (void *) cuDeviceTotalMem_v2},
    {"cuDeviceGetAttribute", (void *) cuDeviceGetAttribute},
    {"cuDeviceComputeCapability", (void *) cuDeviceComputeCapability},
    {"cuDeviceGetUuid", (void *) cuDeviceGetUuid_v2},
    {"cuDeviceGetPCIBusId", (void *) cuDeviceGetPCIBusId},
    {"cuDevicePrimaryCtxGetState", (void *) cuDevicePrimaryCtxGetState},
    {"cuDevicePrimaryCtxRetain", (void *) cuDevicePrimaryCtxRetain},
    {"cuCtxGetCurrent", (void *) cuCtxGetCurrent},
    {"cuGetExportTable", (void *) cuGetExportTable},
    {"cuGetErrorName", (void *) cuGetErrorName},
    {"cuGetErrorString", (void *) cuGetErrorString},
    {"cuGetProcAddress", (void *) cuGetProcAddress_v2},
};

S_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                      unsigned long long flags, int *status)
{
    if (!symbol || !pfn)
        return S_INVALID_VALUE;
    for (size_t i = 0; i < sizeof s_procs / sizeof s_procs[0]; i++)
        if (strcmp(symbol, s_procs[i].name) == 0) {
            *pfn = s_procs[i].fn;
            if (status)
                *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
            return S_SUCCESS;
        }
    *pfn = NULL;
    if (status)
        *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return S_NOT_FOUND;
}

/* The CUDA 11.3 signature. */
S_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                   unsigned long long flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

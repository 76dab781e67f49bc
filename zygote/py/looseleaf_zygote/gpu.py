"""looseleaf_zygote.gpu: a worker's device, from the pool's job (policy/ll_gpu_plan.h lays the slots out).

Runs in a worker (after the fork), on the thread that runs cells, called by zyg.worker_prepare.

  assign(job)      first thing of every preparation, before anything may touch CUDA: the worker sees only its
                   slot's device (CUDA_VISIBLE_DEVICES = the job's `cuda_visible`), or, staged (no slot yet) or
                   on a host without CUDA slots, no device at all (""): no GPU work ever runs without a slot,
                   and no context lands on a device another worker holds.
  start(job, rep)  once the worker has a slot and torch is imported: CUDA initialised on that device, the
                   worker's memory cap (`mem_fraction`: torch.cuda.set_per_process_memory_fraction, when several
                   workers share a device), cuBLAS warmed by one small product, so the cell's first matmul
                   does not pay the handle's creation and the kernel's loading.  What it did goes into REP
                   (`cuda_init_ms`, `cublas_warm_ms`, `mem_fraction`, `cuda_error`).  Without CUDA (torch's CPU
                   build, no device) nothing is done and nothing is reported but why.
  broken()         after each cell: whether the device context is still usable.  A device-side assert (or an
                   illegal address, a launch failure) is a *sticky* CUDA error: every later call of the
                   process fails with it, so a worker whose context broke must not stay warm.
                   Only frameworks that already started CUDA here are asked (asking must never start it).

  driver_initialized()  why this process counts as having initialised the CUDA driver, or None (see below).
                   The zygote's pre-fork check (zygote/ll_zygote.c), the CUDA-safety probe (probe.py) and a
                   staged worker (zyg.worker_prepare) ask it.

What makes a process unfit to fork, or unfit to take a device later, is an initialised driver: cuInit reads
CUDA_VISIBLE_DEVICES once and the process keeps that device count (0, in a staged worker) for its life, and
a context does not survive fork.  A mapped driver is not: a CUDA build of torch maps libcuda.so.1 at
`import torch` (cuBLASLt and cuSPARSELt dlopen it when they load) and never calls it.  So the driver itself
is asked: cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED until cuInit was called, and does nothing else.

Why the cap is torch's and not MPS: MPS needs a control daemon per host, run by whoever owns the GPU, and a
fatal fault in one client can reach the others; the allocator's cap needs nothing.  It bounds what PyTorch's
caching allocator takes; memory that other libraries allocate themselves (CuPy, JAX, a raw cudaMalloc) and
each worker's CUDA context (~0.5 GiB) are outside it, which is why the default leaves 5% of the device over.
"""
import os
import sys
import time

_started = False  # CUDA was started here for the worker's device (once per worker)
_device = None    # the device index (among the pool's visible ones) this worker got, once it has one


def assign(job):
    """Show this worker only what its job allows (see the module's text).  Does nothing once CUDA started:
    a context cannot move to another device."""
    if _started or _initialized():
        return
    vis = job.get("cuda_visible")
    if vis is None:  # a pool that does not say (older binary): its device index, as before
        dev = job.get("device")
        if dev is None:
            return
        vis = str(dev)
    os.environ["CUDA_VISIBLE_DEVICES"] = vis


def _initialized():
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return False


_CUDA_ERROR_NOT_INITIALIZED = 3


def _mapped_driver():
    """The CUDA driver if this process maps it already (by its soname, else by the path a library loaded it
    from), without loading it: a ctypes handle, or None."""
    import ctypes
    mode = os.RTLD_NOLOAD | os.RTLD_LAZY
    try:
        return ctypes.CDLL("libcuda.so.1", mode=mode)
    except OSError:
        pass
    try:
        with open("/proc/self/maps") as f:
            paths = [ln.split(None, 5)[5].strip() for ln in f if "/libcuda.so" in ln and len(ln.split()) >= 6]
    except OSError:
        return None
    for path in paths:
        if os.path.basename(path).startswith("libcuda.so"):
            try:
                return ctypes.CDLL(path, mode=mode)
            except OSError:
                continue
    return None


def driver_initialized():
    """Why this process counts as having initialised the CUDA driver, or None: torch initialised CUDA, the
    process holds or maps an NVIDIA device (the real driver opens and maps /dev/nvidia* at cuInit), or the
    mapped driver answers that cuInit was called (successfully or not: a failed cuInit sticks too)."""
    if _initialized():
        return "torch.cuda is initialized"
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink("/proc/self/fd/" + fd)
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                return "opened " + target
        with open("/proc/self/maps") as f:
            for line in f:
                if " /dev/nvidia" in line:
                    return "maps " + line.split()[-1]
    except OSError:
        pass
    drv = _mapped_driver()
    if drv is None:
        return None
    import ctypes
    try:
        count = drv.cuDeviceGetCount
    except AttributeError:
        return None
    n = ctypes.c_int(0)
    rc = count(ctypes.byref(n))
    if rc == _CUDA_ERROR_NOT_INITIALIZED:
        return None
    return "the CUDA driver was initialised (cuInit called: cuDeviceGetCount answers CUresult %d)" % rc


def start(job, rep, on_started=None):
    """CUDA on the job's device, once per worker, when torch is imported.  ON_STARTED (no arguments) runs
    right after the initialisation (the session's CUDA generator states).  Returns whether it started now."""
    global _started, _device
    dev = job.get("device")
    torch = sys.modules.get("torch")
    if _started or dev is None or torch is None:
        return False
    if _initialized():
        # Touched while staged (no device visible): a context cannot be given a device afterwards.
        rep["cuda_error"] = ("CUDA was initialised in this worker before it had a device (an import touched "
                             "it while the worker was staged); it cannot use its slot's device")
        return False
    _started, _device = True, dev
    t0 = time.perf_counter()
    try:
        torch.cuda.init()
        torch.cuda.set_device(0)
        frac = job.get("mem_fraction")
        if frac:
            torch.cuda.set_per_process_memory_fraction(float(frac), 0)
            rep["mem_fraction"] = float(frac)
        if on_started is not None:
            on_started()
    except Exception as e:  # noqa: BLE001 - reported; the cell then fails on its own CUDA use
        rep["cuda_error"] = "%s: %s" % (type(e).__name__, e)
        rep["cuda_init_ms"] = (time.perf_counter() - t0) * 1e3
        return True
    t1 = time.perf_counter()
    rep["cuda_init_ms"] = (t1 - t0) * 1e3
    rep["cublas_warm_ms"] = warm_cublas(torch)
    return True


def warm_cublas(torch):
    """One small product on the current device: cuBLAS's handle and workspace exist afterwards.  Returns
    the ms it took, or None when it failed (the cell will meet the same error itself)."""
    t0 = time.perf_counter()
    try:
        a = torch.ones(64, 64, device="cuda")
        (a @ a).sum().item()
        b = a.to(torch.bfloat16)  # half-precision products go through cuBLASLt: its handle too
        (b @ b).sum().item()
    except Exception:  # noqa: BLE001
        return None
    return (time.perf_counter() - t0) * 1e3


def broken():
    """Why this worker's CUDA context can no longer be used (a sticky error), or None.  Synchronising surfaces
    an asynchronous error of the cell's last kernels too; it costs nothing when the device is idle (the save
    would wait for the same work).  Asks torch when it initialised CUDA, and CuPy when it has a context
    current (its driver call answers "not initialised" rather than starting CUDA)."""
    torch = sys.modules.get("torch")
    if _initialized():
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any failure here means the context cannot be trusted
            return "%s: %s" % (type(e).__name__, e)
    cupy = sys.modules.get("cupy")
    cuda = getattr(cupy, "cuda", None)
    if cuda is not None:
        try:
            current = cuda.driver.ctxGetCurrent()
        except Exception:  # noqa: BLE001 - CUDA never started through the driver: nothing to check
            current = 0
        if current:
            try:
                cuda.runtime.deviceSynchronize()
            except Exception as e:  # noqa: BLE001
                return "%s: %s" % (type(e).__name__, e)
    return None

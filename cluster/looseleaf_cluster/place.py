"""The placement rule (consolidation: the session's home, else the most loaded host with a free slot, else an
idle warm worker to evict, else the shortest queue) is ll_place's C (policy/ll_place.h, the simulator's), called
through build/cluster/libllplace.so (cluster/ll_cluster_place.c, built by ``make all``): Python never
re-implements it, so the cluster and ``looseleaf simulate`` place alike."""
import ctypes
import os

# ll_place_how_t
HOW = {0: "none", 1: "home", 2: "free", 3: "evict", 4: "queue"}

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_lib = None


def library_path():
    return os.environ.get("LL_CLUSTER_PLACE_LIB") or os.path.join(_REPO, "build", "cluster", "libllplace.so")


def _load():
    global _lib
    if _lib is None:
        path = library_path()
        if not os.path.exists(path):
            raise RuntimeError("the placement library %s is missing: run `make all`" % path)
        lib = ctypes.CDLL(path)
        ip, dp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double)
        lib.ll_cluster_place.argtypes = [ctypes.c_int, ip, ip, ip, ip, ip, ip, dp, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_double, ip]
        lib.ll_cluster_place.restype = ctypes.c_int
        _lib = lib
    return _lib


def choose(hosts, home=-1, home_slot=False, state_bytes=0.0):
    """(index, how) of the host for a job among HOSTS (dicts with ``slots``, ``busy``, ``warm``, and
    optionally ``accepting`` (default True), ``staged``, ``queued``, ``mem_free``); index -1 and how
    "none" when no host can take it."""
    lib = _load()
    n = len(hosts)
    col = lambda key, default: (ctypes.c_int * max(n, 1))(*[int(h.get(key, default)) for h in hosts])
    mem = (ctypes.c_double * max(n, 1))(*[float(h.get("mem_free", 1e300)) for h in hosts])
    how = ctypes.c_int(0)
    i = lib.ll_cluster_place(n, col("accepting", 1), col("slots", 0), col("busy", 0), col("warm", 0),
                             col("staged", 0), col("queued", 0), mem, int(home), int(bool(home_slot)),
                             float(state_bytes), ctypes.byref(how))
    return i, HOW.get(how.value, "none")

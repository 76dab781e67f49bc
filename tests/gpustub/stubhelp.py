"""Helpers of the stub-driver suite: a pool environment on the stub CUDA driver (tests/cudastub/cudastub.c) and
its call record ("<pid> <call>" lines, LL_CUDA_STUB_LOG)."""
import importlib.util
import os
import re

from zyghelp import Env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB = os.path.join(REPO, "build", "cudastub", "libcuda.so.1")

# The zygote head of a GPU host (the pool's default head has torch first): torch, the CUDA build.
TORCH_HEAD = "torch,numpy,IPython,looseleaf_kernel,looseleaf_store"

# A cell that asks the driver itself (ctypes, the driver API) what this process sees: its device count and
# the first device's name.  torch cannot tell: through the stub its runtime's initialisation fails
# (tests/cudastub/cudastub.c, cuGetExportTable).
ASK_DRIVER = r"""
import ctypes
_cu = ctypes.CDLL("libcuda.so.1")
_rc = _cu.cuInit(0)
_n = ctypes.c_int(-1)
_cu.cuDeviceGetCount(ctypes.byref(_n))
_name = ctypes.create_string_buffer(64)
if _n.value > 0:
    _cu.cuDeviceGetName(_name, 64, 0)
print("driver", _rc, _n.value, _name.value.decode())
"""


def torch_cuda_build():
    """(whether this Python's torch is a CUDA build, what it is), read from torch/version.py without importing
    torch (1-2 s, and it would map the host's driver into the test process)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False, "no torch"
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        return False, "cannot read %s: %s" % (path, e)
    cuda = re.search(r"^cuda\b[^=]*=\s*'([^']+)'", text, re.M)
    version = re.search(r"^__version__\s*=\s*'([^']+)'", text, re.M)
    what = "torch %s, CUDA %s" % (version.group(1) if version else "?", cuda.group(1) if cuda else "none")
    return bool(cuda), what


class StubEnv(Env):
    """A pool environment (zyghelp.Env) on the stub driver with DEVICES devices."""

    def __init__(self, tmp, devices=2):
        super().__init__(tmp)
        self.calls_path = os.path.join(tmp, "cuda-calls.log")
        ld = self.environ.get("LD_LIBRARY_PATH")
        self.environ["LD_LIBRARY_PATH"] = os.path.dirname(STUB) + (":" + ld if ld else "")
        self.environ["LL_CUDA_STUB_DEVICES"] = str(devices)
        self.environ["LL_CUDA_STUB_LOG"] = self.calls_path
        for k in ("CUDA_VISIBLE_DEVICES", "LL_CUDA_DRIVER", "LL_POOL_NO_CUDA", "LL_POOL_GPU_SLOTS"):
            self.environ.pop(k, None)

    def calls(self, pid=None):
        """The stub's record: [(pid, call)], of process PID alone when given."""
        try:
            with open(self.calls_path) as f:
                lines = [ln.split() for ln in f if ln.strip()]
        except FileNotFoundError:
            return []
        out = [(int(p), c) for p, c in lines]
        return [x for x in out if pid is None or x[0] == pid]

    def called(self, pid, call):
        return (pid, call) in self.calls(pid)

    def zygote_pids(self, client):
        return [n["pid"] for n in client.stats()["nodes"] if n.get("pid")]

    def write_module(self, name, text):
        """A module NAME (TEXT) on the pool's PYTHONPATH (a directory of the test's own)."""
        mods = os.path.join(self.tmp, "mods")
        os.makedirs(mods, exist_ok=True)
        with open(os.path.join(mods, name + ".py"), "w") as f:
            f.write(text)
        pp = self.environ.get("PYTHONPATH", "")
        if mods not in pp.split(":"):
            self.environ["PYTHONPATH"] = mods + (":" + pp if pp else "")
        return mods

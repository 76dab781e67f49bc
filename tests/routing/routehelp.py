"""Helpers for the GPU-routing tests (tests/routing/): run cells on a looseleaf kernel and on ipykernel side
by side, read the routing report in execute_reply.metadata.looseleaf, send execute requests with the fault
hook's metadata, and find the processes of a host pool and a kernel's checkpoint store (its directory and its
redis-server).

Runs in the pytest process.  Builds on tests/integration/itest_util.py (the Kernel helper, normalisation)
and tests/llpool_util.py (pool processes, liveness, wait_for), both put on sys.path here.  Every wait is a
poll with a deadline.
"""
import glob
import os
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(TESTS, "integration"), TESTS]

from itest_util import (REPLY_TIMEOUT, Kernel, _error_text, norm_text, normalized,  # noqa: E402,F401
                        stream_text, strip_ansi)
from llpool_util import alive, cmdline, pool_pids, ppid, stop_pool, wait_for  # noqa: E402,F401

# GPU cells start workers (fork, restore, save) on 2 shared cores: give them room.
GPU_TIMEOUT = 120


def ll_md(reply):
    """execute_reply.metadata.looseleaf (asserted present)."""
    md = reply["metadata"].get("looseleaf")
    assert isinstance(md, dict), "no metadata.looseleaf in %s" % reply["metadata"]
    return md


def execute(k, code, metadata=None, timeout=GPU_TIMEOUT, on_msg=None, **kw):
    """Run CODE on kernel K with request METADATA; returns (execute_reply, iopub messages through idle)."""
    msg_id = send_execute(k, code, metadata, **kw)
    reply = k.reply(msg_id, timeout=timeout)
    msgs = k.iopub_until_idle(msg_id, timeout, on_msg=on_msg)
    return reply, msgs


def send_execute(k, code, metadata=None, **kw):
    """Send an execute_request (with request METADATA) without waiting; returns its msg_id."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}
    content.update(kw)
    msg = k.kc.session.msg("execute_request", content, metadata=metadata or {})
    k.kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def run_route(k, code, route, timeout=GPU_TIMEOUT, **kw):
    """Run CODE on looseleaf kernel K, assert it succeeded on ROUTE ("cpu"/"gpu"); returns (reply, msgs)."""
    reply, msgs = execute(k, code, timeout=timeout, **kw)
    assert reply["content"]["status"] == "ok", "%r failed: %s" % (code, _error_text(reply, msgs))
    got = ll_md(reply).get("route")
    assert got == route, "%r ran on %s, expected %s: %s" % (code, got, route, ll_md(reply))
    return reply, msgs


def comparable(reply, msgs):
    """What a frontend sees of one cell, normalised: status, error name/value/traceback, outputs."""
    c = reply["content"]
    out = {"status": c["status"], "outputs": normalized(msgs)}
    if c["status"] == "error":
        out["error"] = [c["ename"], norm_text(c["evalue"])]
    for _, content in out["outputs"]:
        if isinstance(content.get("data"), dict):
            # Images by presence only: their text/plain says what was drawn; the bytes are no kernel property.
            content["data"] = {m: v if m.startswith("text/") or m == "application/json" else "<%s>" % m
                               for m, v in content["data"].items()}
        if "traceback" in content:
            content["traceback"] = [strip_ansi(line) for line in content["traceback"]]
    return out


class Pair:
    """A looseleaf kernel and an ipykernel reference running the same cells."""

    def __init__(self, ll, ref):
        self.ll, self.ref = ll, ref

    def cell(self, code, route):
        """Run CODE on both; assert the frontend-visible results are equal and that looseleaf ran it on
        ROUTE ("cpu", "gpu"; None: either).  Returns (looseleaf reply, looseleaf msgs)."""
        r_ref, m_ref = execute(self.ref, code)
        r_ll, m_ll = execute(self.ll, code)
        md = ll_md(r_ll)
        if route is not None:
            assert md.get("route") == route, "%r ran on %s, expected %s: %s" % (
                code, md.get("route"), route, {k: v for k, v in md.items() if k not in ("cell", "closure")})
        assert "fallback" not in md, "%r fell back to the kernel: %s" % (code, md["fallback"])
        a, b = comparable(r_ll, m_ll), comparable(r_ref, m_ref)
        assert a == b, "%r differs (route %s):\nlooseleaf: %s\nipykernel: %s" % (code, md.get("route"), a, b)
        return r_ll, m_ll

    def cells(self, pairs):
        """Run [(code, route), ...] in order through cell()."""
        return [self.cell(code, route) for code, route in pairs]

    def burst(self, pairs):
        """Send every cell of [(code, route), ...] at once (as a frontend does with Run All), then compare
        each one's results as cell() does; an aborted request (after an error) has no routing report."""
        got = {}
        for k in (self.ref, self.ll):
            ids = [send_execute(k, code) for code, _ in pairs]
            got[k] = [(k.reply(i, timeout=GPU_TIMEOUT), k.iopub_until_idle(i, GPU_TIMEOUT)) for i in ids]
        for (code, route), (r_ll, m_ll), (r_ref, m_ref) in zip(pairs, got[self.ll], got[self.ref]):
            if route is not None:
                got_route = ll_md(r_ll).get("route")
                assert got_route == route, "%r ran on %s, expected %s" % (code, got_route, route)
            a, b = comparable(r_ll, m_ll), comparable(r_ref, m_ref)
            assert a == b, "%r differs:\nlooseleaf: %s\nipykernel: %s" % (code, a, b)


def cold_warm_fixtures(tmp_prefix):
    """The fixtures of a module whose comparisons run twice, on a pool of their own each time: "cold"
    (LL_POOL_WARM_IDLE_S=0: a GPU cell forks a fresh worker and restores from the store) and "warm" (the
    session's worker stays).  Returns (pool_mode, ll, ref); the module binds them under those names, where
    they replace conftest.py's ll and ref (conftest.py's pair then pairs these: one pair per mode).  The
    reference depends on the mode too, so each mode starts from a fresh ipykernel as from a fresh looseleaf
    kernel.  TMP_PREFIX names the pool's temporary directory."""

    @pytest.fixture(scope="module", params=["cold", "warm"])
    def pool_mode(request):
        return request.param

    @pytest.fixture(scope="module")
    def ll(pool_mode, jupyter_env, tmp_path_factory):
        pool_dir = str(tmp_path_factory.mktemp(tmp_prefix + pool_mode) / "pool")
        k = Kernel("looseleaf", env={"LOOSELEAF_POOL_DIR": pool_dir,
                                     "LL_POOL_WARM_IDLE_S": "0" if pool_mode == "cold" else "300"})
        yield k
        k.stop()
        stop_pool(pool_dir)

    @pytest.fixture(scope="module")
    def ref(pool_mode, jupyter_env):
        k = Kernel("python3")
        yield k
        k.stop()

    return pool_mode, ll, ref


# ---- host pool processes (finding and stopping a pool: llpool_util) ---------------------------------------
def zygotes(pool_dir):
    """{node id: pid} of the `looseleaf zygote` children of POOL_DIR's pool (a respawned base gets a new id)."""
    pools = set(pool_pids(pool_dir))
    out = {}
    for pid in os.listdir("/proc"):
        argv = cmdline(pid) if pid.isdigit() else None
        if argv and argv[1:2] == ["zygote"] and "--node" in argv[:-1] and ppid(pid) in pools:
            out[int(argv[argv.index("--node") + 1])] = int(pid)
    return out


# ---- a kernel's checkpoint store (coherence.py): its directory and redis-server ---------------------------
def store_dirs():
    """looseleaf-store-* dirs of this uid where kernels put them (XDG_RUNTIME_DIR, /dev/shm, tmp)."""
    out = []
    for base in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm", tempfile.gettempdir()):
        if base and os.path.isdir(base):
            out += glob.glob(os.path.join(base, "looseleaf-store-*"))
    return out


def owner_of(d):
    """(kernel pid, session) of store dir D, or None."""
    try:
        with open(os.path.join(d, "owner")) as f:
            fields = f.read().split()
        return int(fields[0]), fields[1]
    except (OSError, ValueError, IndexError):
        return None


def store_dirs_of(pid):
    """The store dirs whose owner is the kernel PID (a kernel has one once it ran a GPU cell)."""
    return [d for d in store_dirs() if (owner_of(d) or (None,))[0] == pid]


def redis_processes(d):
    """pids of live redis-servers whose command line names store dir D."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"redis-server" in cmd and d.encode() in cmd and alive(int(pid)):
            out.append(int(pid))
    return out

"""Warm workers and prefetch leave the kernel's semantics unchanged (issue 6): a mixed CPU/GPU session whose
GPU cells run on the session's warm worker (several prefetched by hints) gives ipykernel's outputs, and a warm
worker killed with SIGKILL (after a cell, or after a prefetch prepared it) loses nothing: the next cell forks
anew and sees the last committed values."""
import os
import signal

import pytest

from pfhelp import Kernel, hint_inspect, run_cpu, run_gpu, wait_for
from routehelp import Pair

CELLS = [
    ("import torch\ntorch.manual_seed(0)\nt = torch.arange(6.)", "gpu"),
    ("n = 3\nn", "cpu"),
    ("t = t * n\nprint(t)", "gpu"),
    ("n = n + 2", "cpu"),
    ("t.sum() * n", "gpu"),
    ("def f(a):\n    return (a * 2).tolist()", "cpu"),
    ("print(f(t))\nr = torch.rand(2)\nr", "gpu"),
    ("print(sorted(k for k in ('t', 'n', 'f', 'r') if k in dir()))\ndel n", None),
    ("t + n", "gpu"),
    ("t.add_(1)\nt[:2]", "gpu"),
    ("print(t.tolist(), r.tolist())", None),
]


@pytest.fixture(scope="module")
def pair(pool):
    ll, ref = pool.kernel(), Kernel("python3")
    yield Pair(ll, ref)
    ll.stop()
    ref.stop()


def test_pf_mixed_session_matches_ipykernel(pool, pair):
    gpu = []
    for code, route in CELLS:
        if route == "gpu" and gpu:
            before = len(pool.prefetches())
            hint_inspect(pair.ll, code)  # the user looks at the cell before Run
            pool.wait_prepared(before)
        reply, _ = pair.cell(code, route)
        if route == "gpu":
            gpu.append(reply["metadata"]["looseleaf"])
    pids = {md["worker_pid"] for md in gpu}
    assert len(pids) == 1 and all(md["warm_hit"] for md in gpu[1:]), [
        (md["worker_pid"], md["warm_hit"]) for md in gpu]
    assert all(md["prepared_by_prefetch"] for md in gpu[1:]), [md["prepared_by_prefetch"] for md in gpu]


def _kill(pool, pid):
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: pid not in [w["pid"] for w in pool.workers()], 30, "killed worker %d to leave" % pid)


def test_pf_killed_warm_worker_loses_nothing(pool):
    k = pool.kernel()
    try:
        run_gpu(k, "import torch\nv = torch.arange(5)\nv += 1")
        md, out = run_gpu(k, "v *= 2\nprint(v.tolist())")
        assert out == "[2, 4, 6, 8, 10]\n" and md["warm_hit"] and md["stays_warm"], md
        _kill(pool, md["worker_pid"])
        run_cpu(k, "k2 = 10")
        md2, out = run_gpu(k, "print(v.tolist(), int(v.sum()) + k2)")
        assert out == "[2, 4, 6, 8, 10] 40\n"
        assert not md2["warm_hit"] and md2["fork_ms"] > 0 and md2["worker_pid"] != md["worker_pid"], md2
        # A warm worker that a prefetch had prepared, killed before Run.
        run_cpu(k, "k2 = 20")
        before = len(pool.prefetches())
        code = "v += k2\nprint(v.tolist())"
        hint_inspect(k, code)
        pool.wait_prepared(before)
        _kill(pool, md2["worker_pid"])
        md3, out = run_gpu(k, code)
        assert out == "[22, 24, 26, 28, 30]\n"
        assert not md3["warm_hit"] and not md3["prepared_by_prefetch"], md3
        assert run_cpu(k, "%%cpu\nprint(v.tolist(), k2)") == "[22, 24, 26, 28, 30] 20\n"
    finally:
        k.stop()

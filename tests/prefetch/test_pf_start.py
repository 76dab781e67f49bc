"""The host pool started ahead of the session's first GPU cell (issue 14): a kernel whose environment says
LOOSELEAF_POOL_START_MS (what `looseleaf install` writes: 200) connects to the user's host pool that long after
it starts, starting the pool if none runs, so the pool's base zygote imports torch and the rest of its head
while the user writes the first GPU cell, and that cell does not wait seconds for it.  Without the variable
(a kernelspec of one's own, and the suite's) nothing starts before the first GPU cell."""
import os
import time

from pfhelp import run_gpu
from routehelp import Kernel, pool_pids, stop_pool, zygotes


def _wait_for(cond, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_pool_starts_ahead_of_the_first_gpu_cell(jupyter_env, tmp_path):
    ahead, lazy = str(tmp_path / "ahead"), str(tmp_path / "lazy")
    k = Kernel("looseleaf", env={"LOOSELEAF_POOL_DIR": ahead, "LOOSELEAF_POOL_START_MS": "200"})
    k2 = Kernel("looseleaf", env={"LOOSELEAF_POOL_DIR": lazy})
    try:
        # No cell ran: the pool and its base zygote start all the same.
        assert _wait_for(lambda: pool_pids(ahead) and zygotes(ahead), 60), "no pool started ahead"
        time.sleep(1.0)
        assert not pool_pids(lazy), "a kernel without LOOSELEAF_POOL_START_MS started a pool"
        pool = set(pool_pids(ahead))
        md, out = run_gpu(k, "import torch\nprint(int(torch.ones(3).sum()))")
        assert out == "3\n" and set(pool_pids(ahead)) == pool, "the first GPU cell used the pool started ahead"
    finally:
        k.stop()
        k2.stop()
        stop_pool(ahead)
        stop_pool(lazy)

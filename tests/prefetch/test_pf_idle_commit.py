"""The idle commit: once a session has a store, what a CPU cell changed is committed when the kernel has stayed
idle LOOSELEAF_IDLE_COMMIT_MS (250) after it, so a GPU cell whose edit window was too short for a prefetch
finds nothing to commit at Run.  Values that may be slow to save (a big array, an arbitrary object) are left
to the Run (the others are committed all the same); 0 turns it off."""
import time

from pfhelp import run_cpu, run_gpu


def test_idle_commit_takes_small_values_off_the_run(pool):
    k = pool.kernel()
    try:
        run_gpu(k, "import torch\nw = torch.ones(4)")
        run_cpu(k, "lr = 0.5\nhist = ['a', 'b']\ncfg = {'depth': 3}")
        time.sleep(1.0)
        md, out = run_gpu(k, "print(float(w.sum() * lr), hist, cfg)")
        assert out == "2.0 ['a', 'b'] {'depth': 3}\n"
        assert md["kernel_saved"] == [], md
        assert {"lr", "hist", "cfg"} <= set(md["restored"]), md
        # A big array: the Run commits it; what is quick to save beside it is committed when idle all the
        # same (a crash loses as little as it can).
        run_cpu(k, "import numpy as np\nbig = np.ones(5_000_000)\nlr = 0.25")
        time.sleep(1.0)
        md, out = run_gpu(k, "print(int(big.sum()), float(w.sum() * lr))")
        assert out == "5000000 1.0\n"
        assert md["kernel_saved"] == ["big"], md
        # Deleted on the CPU side: the idle commit deletes it from the store too.
        run_cpu(k, "del hist")
        time.sleep(1.0)
        md, out = run_gpu(k, "print('hist' in dir(), float(w.sum()))")
        assert out == "False 4.0\n" and md["kernel_saved"] == [], md
    finally:
        k.stop()


def test_no_idle_commit_when_turned_off(pool):
    k = pool.kernel(LOOSELEAF_IDLE_COMMIT_MS="0")
    try:
        run_gpu(k, "import torch\nw = torch.ones(4)")
        run_cpu(k, "lr = 0.5")
        time.sleep(1.0)
        md, out = run_gpu(k, "print(float(w.sum() * lr))")
        assert out == "2.0\n" and md["kernel_saved"] == ["lr"], md
    finally:
        k.stop()

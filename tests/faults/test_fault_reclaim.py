"""Superseded versions are reclaimed as soon as no reader can need them (issue 23, part 3, item 4), through
the real kernel: a GPU cell `x, y, n = x + 1, y + 1, n + 1` over live arrays alternating with a CPU cell that
reads them (so the kernel refreshes them from the store, and its old mappings go).  Before the fix, the
session's payload pool grew by a version per round until it was full (half of RAM by default); now it holds
the live version, the one being written or still read, and a reserve the size of a save."""
import os

import pytest

from faulthelp import execute, gpu_kernel, new_pool_dir, run_route, stream_text, wait_for

MIB = 1 << 20
SIZES = {"rc_x": 32, "rc_y": 24, "rc_n": 16}  # MiB each: 72 MiB of live state
LIVE = sum(SIZES.values()) * MIB


def pool_memory(pid):
    """Bytes the payload pool of kernel PID holds in memory: the blocks of the pool file it keeps open (a memfd,
    or a /dev/shm file it unlinked), read through its /proc fd link."""
    total = 0
    d = "/proc/%d/fd" % pid
    for fd in os.listdir(d):
        try:
            target = os.readlink(os.path.join(d, fd))
        except OSError:
            continue
        if "looseleaf-pool" in target or (target.startswith("/dev/shm/looseleaf-") and ".pool" in target):
            total += os.stat(os.path.join(d, fd)).st_blocks * 512
    return total


@pytest.mark.parametrize("history_mib", [0, 80])
def test_alternating_gpu_and_cpu_cells_keep_the_pool_bounded(history_mib):
    """Without a history (LL_HISTORY_BYTES=0) the pool holds about twice the live state; with one (issue 28)
    the superseded versions it keeps add at most its budget (80 MiB: one superseded version of the 72)."""
    first = "import numpy as np\n" + "\n".join(
        "%s = np.zeros(%d << 20, np.uint8)" % (name, mib) for name, mib in SIZES.items())
    bound = 2.5 * LIVE + history_mib * MIB
    with gpu_kernel("%%gpu\n" + first, new_pool_dir(), env={"LL_HISTORY_BYTES": "%dM" % history_mib}) as k:
        peak = pool_memory(k.pid)
        assert peak > 0, "no pool found for kernel %d" % k.pid
        for rnd in range(8):
            run_route(k, "%%gpu\nrc_x, rc_y, rc_n = rc_x + 1, rc_y + 1, rc_n + 1", "gpu")
            peak = max(peak, pool_memory(k.pid))
            _, msgs = run_route(k, "%%cpu\nprint(int(rc_x[-1]) + int(rc_y[0]) + int(rc_n[5]))", "cpu")
            assert stream_text(msgs) == "%d\n" % (3 * (rnd + 1))
            peak = max(peak, pool_memory(k.pid))
        # The kernel's idle reclamation sees the last refresh let go of the old version.
        wait_for(lambda: pool_memory(k.pid) <= bound, timeout=30, what="the pool to shrink")
        assert peak <= bound, "the pool held %d MiB for %d MiB of live state" % (peak // MIB, LIVE // MIB)
        # Every variable is still whole, in the kernel and on a worker.
        reply, msgs = execute(k, "%%gpu\nprint(int(rc_x.sum() + rc_y.sum() + rc_n.sum()))")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert stream_text(msgs) == "%d\n" % (8 * LIVE)

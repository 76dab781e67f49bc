"""Write tracking of this process's own big payloads (userfaultfd async write-protect + PAGEMAP_SCAN):
saves of unchanged or partly changed arrays hash only what was written, and never miss a write - by
the cell, by the kernel on its behalf (read(2) into the buffer), or by another process into shared
memory (which is never tracked)."""
import builtins
import os

import numpy as np
import pytest
import torch

from looseleaf_store import Checkpointer, wptrack

MiB = 1 << 20

pytestmark = pytest.mark.skipif(not wptrack.tracker().available(),
                                reason="no userfaultfd async write-protect here (%s): saves hash instead"
                                % wptrack.tracker().error)


def fresh(store):
    ns = {"__name__": "__main__", "__builtins__": builtins}
    return ns, Checkpointer(store, ns)


def save_ok(cp, names):
    rep = cp.save(names)
    assert rep.error is None and not rep.failed, rep
    return rep


def restored(store, name):
    ns, cp = fresh(store)
    r = cp.restore([name])
    assert not r.failed, r
    return ns[name]


def test_own_numpy_array_writes_are_found(store):
    ns, cp = fresh(store)
    ns["a"] = np.arange(32 * MiB // 8, dtype=np.float64)
    save_ok(cp, ["a"])
    assert cp._state["a"].track, "the array's memory should be write-tracked"
    rep = save_ok(cp, ["a"])
    assert rep.bytes_written == 0 and rep.unchanged == ["a"]
    ns["a"][3 * MiB // 8] = -1.0  # region 1
    ns["a"][(20 * MiB + 100) // 8] = -2.0  # region 10
    rep = save_ok(cp, ["a"])
    assert rep.bytes_written == 2 * 2 * MiB, rep
    b = restored(store, "a")
    assert np.array_equal(b, ns["a"])
    with open("/dev/urandom", "rb", buffering=0) as f:  # the kernel writes into the buffer for us
        f.readinto(memoryview(ns["a"]).cast("B")[25 * MiB:25 * MiB + 4096])
    rep = save_ok(cp, ["a"])
    assert rep.bytes_written == 2 * MiB, rep
    assert restored(store, "a").tobytes() == ns["a"].tobytes()  # random bytes: NaNs, compare bytes


def test_own_tensor_writes_are_found(store):
    ns, cp = fresh(store)
    ns["t"] = torch.zeros(16 * MiB // 4)
    ns["v"] = ns["t"][MiB // 4:]  # a view of the same storage in another variable
    save_ok(cp, ["t", "v"])
    rep = save_ok(cp, ["t", "v"])
    assert rep.bytes_written == 0
    ns["v"][0] = 5.0  # byte offset 1 MiB: region 0
    ns["t"][-1] = 6.0
    rep = save_ok(cp, ["t", "v"])
    assert rep.bytes_written == 2 * 2 * MiB, rep
    ns2, cp2 = fresh(store)
    assert not cp2.restore(["v", "t"]).failed
    assert torch.equal(ns2["t"], ns["t"]) and ns2["v"].data_ptr() == ns2["t"].data_ptr() + MiB


def test_write_by_another_process_to_shared_memory_is_not_missed(store):
    ns, cp = fresh(store)
    ns["shared"] = torch.zeros(16 * MiB // 4).share_memory_()
    save_ok(cp, ["shared"])
    pid = os.fork()
    if pid == 0:  # another process writes the shared pages: no fault in ours (numpy: no torch after fork)
        ns["shared"].numpy()[10] = 42.0
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    rep = save_ok(cp, ["shared"])
    assert rep.bytes_written == 2 * MiB and "shared" in rep.saved, rep
    assert restored(store, "shared")[10].item() == 42.0


class _CommitFailsOnce:
    """The real store, whose next commit raises (as when Redis goes away at that moment)."""

    def __init__(self, store):
        self._store = store
        self.fail = False

    def __getattr__(self, name):
        return getattr(self._store, name)

    def commit(self, *args, **kwargs):
        if self.fail:
            self.fail = False
            raise RuntimeError("injected commit failure")
        return self._store.commit(*args, **kwargs)


def test_regions_reported_by_a_failed_save_are_not_forgotten(store):
    proxy = _CommitFailsOnce(store)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    cp = Checkpointer(proxy, ns)
    ns["a"] = np.zeros(16 * MiB // 8)
    save_ok(cp, ["a"])
    ns["a"][(6 * MiB) // 8] = 1.0
    proxy.fail = True
    rep = cp.save(["a"])
    assert rep.error and "injected" in rep.error
    rep = save_ok(cp, ["a"])  # the scan that reported region 3 re-protected it: it must be carried
    assert rep.bytes_written == 2 * MiB and "a" in rep.saved, rep
    assert restored(store, "a")[(6 * MiB) // 8] == 1.0


def test_two_checkpointers_tracking_one_array_both_see_every_write(store):
    ns1 = {"__name__": "__main__", "__builtins__": builtins}
    cp1 = Checkpointer(store, ns1)
    ns1["a"] = np.zeros(16 * MiB // 8)
    ns2 = {"__name__": "__main__", "__builtins__": builtins, "b": ns1["a"]}  # the same array
    cp2 = Checkpointer(store, ns2)
    save_ok(cp1, ["a"])
    save_ok(cp2, ["b"])
    ns1["a"][(4 * MiB) // 8] = 1.0
    rep1 = save_ok(cp1, ["a"])  # this scan re-protects the page ...
    rep2 = save_ok(cp2, ["b"])  # ... and cp2 must still learn about it
    assert rep1.bytes_written == 2 * MiB and rep2.bytes_written == 2 * MiB, (rep1, rep2)
    assert restored(store, "b")[(4 * MiB) // 8] == 1.0


def test_tracking_backs_off_from_an_array_rewritten_wholesale_and_comes_back(store):
    ns, cp = fresh(store)
    ns["a"] = np.zeros(16 * MiB // 8)
    save_ok(cp, ["a"])
    assert cp._state["a"].track[0].sub is not None
    ns["a"] += 1  # every region
    rep = save_ok(cp, ["a"])
    assert rep.bytes_written == 16 * MiB
    assert cp._state["a"].track[0].sub is None  # no longer tracked: the next cell's writes do not fault
    ns["a"][5] = 7.0  # while untracked, saves hash: still exact
    rep = save_ok(cp, ["a"])
    assert rep.bytes_written == 2 * MiB
    assert cp._state["a"].track[0].sub is None
    rep = save_ok(cp, ["a"])  # unchanged: calm again ...
    assert rep.bytes_written == 0 and 0 not in cp._state["a"].track
    rep = save_ok(cp, ["a"])  # ... so tracked again (armed before this save's hashing)
    assert rep.bytes_written == 0 and cp._state["a"].track[0].sub is not None
    ns["a"][(9 * MiB) // 8] = 3.0
    rep = save_ok(cp, ["a"])
    assert rep.bytes_written == 2 * MiB
    b = restored(store, "a")
    assert b[5] == 7.0 and b[(9 * MiB) // 8] == 3.0 and b[1] == 1.0

"""Saves of device memory (issue 15, item 10), run here on CPU tensors: the same code as on CUDA (devsave.py)
hashes 2 MiB regions where the tensor lives, copies only the changed ones through a fixed pair of staging
buffers pipelined with the store's writer, and hashes restored payloads so that an unchanged one moves no byte.
LL_STORE_DEVSAVE=cpu sends CPU storages that way; on a GPU host tests/gpu/e2e.sh runs it on CUDA."""
import builtins

import pytest

torch = pytest.importorskip("torch")

from looseleaf_store import Checkpointer, devsave  # noqa: E402

R = devsave.REGION


@pytest.fixture
def cpu_as_device(monkeypatch):
    monkeypatch.setenv("LL_STORE_DEVSAVE", "cpu")
    # Small staging buffers (2 regions each), so a save of a few MiB runs the pipeline through many groups.
    monkeypatch.setattr(devsave, "_STAGE_REGIONS", 2)
    monkeypatch.setattr(devsave, "_staging", None)
    monkeypatch.setattr(devsave, "_HASH_CHUNK", 3)


def _ns(**kw):
    ns = {"__name__": "__main__", "__builtins__": builtins}
    ns.update(kw)
    return ns


def test_region_hashes_see_every_change_and_only_where_it_is():
    g = torch.Generator().manual_seed(1)
    u = torch.randint(0, 256, (5 * R + 6,), dtype=torch.uint8, generator=g)  # a short, unaligned tail
    h = devsave.region_hashes(torch, u)
    assert h.shape == (6,) and torch.equal(h, devsave.region_hashes(torch, u.clone()))
    for pos in (0, R - 1, 3 * R + 12345, 5 * R + 5):
        v = u.clone()
        v[pos] ^= 0x80
        d = (devsave.region_hashes(torch, v) != h).nonzero().flatten().tolist()
        assert d == [pos // R], (pos, d)
    # Two sign flips of float64 values cancel in a linear sum; not here.
    f = torch.randn(R // 8 * 2, dtype=torch.float64, generator=g)
    fu = f.view(torch.uint8)
    hf = devsave.region_hashes(torch, fu)
    f2 = f.clone()
    f2[10] = -f2[10]
    f2[20] = -f2[20]
    assert not torch.equal(devsave.region_hashes(torch, f2.view(torch.uint8)), hf)
    # Swapping two words of a region changes its hash too.
    s = u.clone()
    w = s[:R].view(torch.int32)
    w[[1, 2]] = w[[2, 1]].clone()
    assert (devsave.region_hashes(torch, s) != h).nonzero().flatten().tolist() == [0]


class _Counting:
    """A store that records the dirty lists of its payload writers."""

    def __init__(self, store):
        self.store = store
        self.writers = []

    def payload_writer(self, *a, **kw):
        self.writers.append(kw.get("dirty"))
        return self.store.payload_writer(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_only_changed_regions_move_and_unchanged_state_costs_nothing(store, cpu_as_device):
    store = _Counting(store)
    writers = store.writers
    t = torch.randn(5 * R // 4 + 100)  # 5 regions and a bit
    n = t.numel() * 4
    ns = _ns(t=t)
    cp = Checkpointer(store, ns)
    rep = cp.save(["t"])
    assert not rep.failed and rep.bytes_written == n, rep
    assert writers == [None]
    # Unchanged: hashed on the "device", nothing written, no writer at all.
    rep = cp.save(["t"])
    assert rep.bytes_written == 0 and rep.unchanged == ["t"] and len(writers) == 1, rep
    # One element in region 3 changed: one region written.
    t[3 * R // 4 + 5] += 1
    rep = cp.save(["t"])
    assert rep.bytes_written == R and writers[-1] == [3], (rep, writers)
    # A restore elsewhere gets the bytes, and hashes them: saved unchanged, nothing moves.
    ns2 = _ns()
    cp2 = Checkpointer(store, ns2)
    r = cp2.restore(["t"])
    assert not r.failed and torch.equal(ns2["t"], t)
    rep = cp2.save(["t"])
    assert rep.bytes_written == 0 and not rep.failed, rep
    # Changes in several regions from the restoring process: just those.
    ns2["t"][0] = 7
    ns2["t"][-1] = 7
    rep = cp2.save(["t"])
    assert rep.bytes_written == R + (n - 5 * R), rep
    ns3 = _ns()
    Checkpointer(store, ns3).restore(["t"])
    assert torch.equal(ns3["t"], ns2["t"])


def test_the_staging_pair_is_fixed_whatever_the_sizes(store, cpu_as_device):
    ns = _ns(a=torch.zeros(R // 4 * 9), b=torch.ones(R // 4))
    cp = Checkpointer(store, ns)
    assert not cp.save(["a", "b"]).failed
    st = devsave._staging
    assert st is not None and [b.numel() for b in st.bufs] == [2 * R, 2 * R]
    ns["c"] = torch.full((R // 4 * 20,), 3.0)
    assert not cp.save(["c"]).failed
    assert devsave._staging is st
    ns2 = _ns()
    Checkpointer(store, ns2).restore(["a", "b", "c"])
    assert torch.equal(ns2["a"], ns["a"]) and torch.equal(ns2["c"], ns["c"])


def test_views_and_sharing_survive_the_device_path(store, cpu_as_device):
    base = torch.arange(R // 2, dtype=torch.float32)  # 2 regions
    ns = _ns(base=base, view=base[100:200].view(10, 10))
    cp = Checkpointer(store, ns)
    assert not cp.save(["base", "view"]).failed
    ns2 = _ns()
    Checkpointer(store, ns2).restore(["view"])
    assert ns2["view"].data_ptr() == ns2["base"].data_ptr() + 400
    assert torch.equal(ns2["view"], ns["view"])


def test_to_device_round_trip_through_the_staging_pair(cpu_as_device):
    import numpy as np
    src = np.random.default_rng(3).integers(0, 256, 7 * R + 11, dtype=np.uint8)
    out = devsave.to_device(torch, src, "cpu")
    assert out.numpy().tobytes() == src.tobytes()

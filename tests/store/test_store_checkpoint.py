"""Round-trip and identity tests of looseleaf_store.Checkpointer over the real _llstore.

Each test plays a notebook: cells are exec'd in a namespace dict (module __main__, as in the kernel),
variables are saved from it and restored - separately, as GPU workers do - into fresh namespaces.
"""
import builtins
import os
import socket
import threading

import numpy as np
import pytest
import torch

from cphelp import fresh, new_ns, restore_ok, run, save_ok
from looseleaf_store import BIG_BYTES, Checkpointer

MiB = 1 << 20


# ---- sharing ---------------------------------------------------------------------------------------

def test_two_names_one_list_restored_separately(store):
    ns, cp = fresh(store)
    run(ns, "a = [1, 2, {'k': 3}]; b = a; c = {'inner': a}; d = [a[2]]")
    save_ok(cp, ["a", "b", "c", "d"])
    ns2, cp2 = fresh(store)
    for name in ["d", "b", "c", "a"]:  # one restore call per variable, in an unhelpful order
        cp2.restore([name])
    assert ns2["a"] is ns2["b"] is ns2["c"]["inner"]
    assert ns2["d"][0] is ns2["a"][2]
    ns2["a"].append(4)
    assert ns2["c"]["inner"][-1] == 4


def test_references_payload_refs_and_version_of_held_versions(store):
    ns, cp = fresh(store)
    run(ns, "import numpy as np\nbig = np.ones(BIG, dtype=np.uint8)\nholder = {'arr': big}\nsmall = 3"
        .replace("BIG", str(max(BIG_BYTES, 1 << 16))))
    save_ok(cp, ["big", "holder", "small"])
    assert cp.references("holder") == ("big",) and cp.references("big") == () and cp.references("small") == ()
    assert len(cp.payload_refs("big")) == 1 and cp.payload_refs("holder") == () and cp.payload_refs("small") == ()
    assert cp.references("nothing") == () and cp.payload_refs("nothing") == ()
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["holder"])  # pulls in big
    assert cp2.references("holder") == ("big",) and cp2.payload_refs("big") == cp.payload_refs("big")
    # version(): what this Checkpointer saved or restored, bound in the namespace or not
    v = cp.versions()
    assert cp.version("small") == v["small"] and cp2.version("holder") == v["holder"] and cp2.version("small") is None
    del ns2["holder"]
    assert cp2.version("holder") == v["holder"] and "holder" not in cp2.held()


def test_cycles_within_and_across_variables(store):
    ns, cp = fresh(store)
    run(ns, """
        x = []; x.append(x)
        d = {}; d['self'] = d
        p = []; q = [p]; p.append(q)
    """)
    save_ok(cp, ["x", "d", "p", "q"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["q"])
    restore_ok(cp2, ["x", "d"])
    assert ns2["x"][0] is ns2["x"]
    assert ns2["d"]["self"] is ns2["d"]
    assert ns2["q"][0] is ns2["p"] and ns2["p"][0] is ns2["q"]


MODEL_CELL = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    X = torch.randn(64, 6)
    Y = torch.randn(64, 1)
    def step():
        opt.zero_grad()
        loss = ((model(X) - Y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.item()
    losses = [step() for _ in range(3)]
"""


def test_model_and_adam_restored_separately_train_identically(store):
    ns, cp = fresh(store)
    run(ns, MODEL_CELL)
    save_ok(cp, ["model", "opt", "X", "Y", "step"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["model"])
    restore_ok(cp2, ["opt"])
    m, o = ns2["model"], ns2["opt"]
    assert o.param_groups[0]["params"][0] is m[0].weight
    assert [id(p) for p in o.param_groups[0]["params"]] == [id(p) for p in m.parameters()]
    assert all(p in o.state for p in m.parameters())  # Adam state keyed by the very parameters
    assert all(o.state[p]["exp_avg"].shape == p.shape for p in m.parameters())
    restore_ok(cp2, ["step"])
    expected = [ns["step"]() for _ in range(5)]  # the unrestored run
    got = [ns2["step"]() for _ in range(5)]
    assert got == expected
    for p, q in zip(ns["model"].parameters(), m.parameters()):
        assert torch.equal(p, q)


def test_optimizer_saved_in_a_later_cell_pulls_in_its_model(store):
    ns, cp = fresh(store)
    run(ns, "import torch; torch.manual_seed(1); model = torch.nn.Linear(3, 2)")
    save_ok(cp, ["model"])
    run(ns, "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)")
    rep = save_ok(cp, ["opt"])
    assert rep.added == ["model"] and rep.unchanged == ["model"] and list(rep.saved) == ["opt"], rep
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["opt"])  # brings model along
    assert ns2["opt"].param_groups[0]["params"][0] is ns2["model"].weight


def test_rebinding_an_owner_resaves_its_dependents(store):
    ns, cp = fresh(store)
    run(ns, "a = [1]; b = [a]")
    save_ok(cp, ["a", "b"])
    run(ns, "a = [2]")  # b still holds the old list
    rep = save_ok(cp, ["a"])
    assert "b" in rep.saved  # its reference to a's old object had to be rewritten
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["b", "a"])
    assert ns2["a"] == [2] and ns2["b"] == [[1]]
    assert ns2["b"][0] is not ns2["a"]


def test_tensor_views_share_storage_across_variables(store):
    ns, cp = fresh(store)
    run(ns, """
        import torch
        base = torch.arange(24, dtype=torch.float32)
        v = base[4:12].view(2, 4)
        t = v.t()
        same_storage_other_var = base.view(4, 6)[1]
    """)
    save_ok(cp, ["t", "v", "same_storage_other_var", "base"])
    ns2, cp2 = fresh(store)
    for n in ["t", "same_storage_other_var", "v", "base"]:
        restore_ok(cp2, [n])
    base, v, t, o = ns2["base"], ns2["v"], ns2["t"], ns2["same_storage_other_var"]
    assert torch.equal(base, ns["base"]) and torch.equal(t, ns["t"]) and torch.equal(o, ns["same_storage_other_var"])
    assert t.stride() == ns["t"].stride() and v.storage_offset() == 4
    base[5] = 100.0
    assert v[0, 1].item() == 100.0 and t[1, 0].item() == 100.0
    assert o.data_ptr() == base.data_ptr() + 6 * 4
    base[6] = -1.0
    assert o[0].item() == -1.0
    # Views stay views of their base, as in the process that made them.
    assert v._base is base and t._base is base and o._base is base


# ---- numpy -----------------------------------------------------------------------------------------

NUMPY_CASES = {
    "zero_d": "np.array(3.5)",
    "empty": "np.zeros((0, 3), dtype=np.int16)",
    "f16": "np.linspace(0, 1, 17, dtype=np.float16)",
    "f64_3d": "np.arange(60, dtype=np.float64).reshape(3, 4, 5)",
    "fortran": "np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))",
    "noncontig": "np.arange(40, dtype=np.int64)[::3]",
    "transposed": "np.arange(12.0).reshape(3, 4).T",
    "boolean": "np.array([True, False, True])",
    "complex": "np.array([1 + 2j, 3 - 4j], dtype=np.complex64)",
    "uint8_big": "np.arange(3 * 1024 * 1024, dtype=np.uint32).astype(np.uint8)",
    "structured": "np.array([(1, 2.5, b'ab'), (3, 4.5, b'cd')], dtype=[('i', '<i4'), ('f', '<f8'), ('s', 'S2')])",
    "objects": "np.array([{'a': 1}, [1, 2], 'text', None], dtype=object)",
    "datetime": "np.array(['2026-11-30', '1999-01-01'], dtype='datetime64[D]')",
    "strings": "np.array(['alpha', 'beta'])",
    "readonly": "np.frombuffer(b'12345678' * 4, dtype=np.int64)",
}


def test_numpy_dtypes_and_shapes(store):
    ns, cp = fresh(store)
    run(ns, "import numpy as np\n" + "\n".join("%s = %s" % kv for kv in NUMPY_CASES.items()))
    save_ok(cp, list(NUMPY_CASES))
    ns2, cp2 = fresh(store)
    restore_ok(cp2, list(NUMPY_CASES))
    for name in NUMPY_CASES:
        a, b = ns[name], ns2[name]
        assert type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape, name
        if a.dtype.hasobject:
            assert a.tolist() == b.tolist()
        else:
            assert np.array_equal(a, b), name
    assert ns2["fortran"].flags.f_contiguous
    assert not ns2["readonly"].flags.writeable
    assert ns2["f64_3d"].flags.writeable


def test_restored_array_is_private_copy_on_write(store):
    ns, cp = fresh(store)
    run(ns, "import numpy as np; arr = np.arange(4 * MiB // 8, dtype=np.float64)".replace("MiB", str(MiB)))
    save_ok(cp, ["arr"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["arr"])
    ns2["arr"][:10] = -1  # a user writing to a restored array ...
    ns3, cp3 = fresh(store)
    restore_ok(cp3, ["arr"])
    assert ns3["arr"][0] == 0.0 and np.array_equal(ns3["arr"], ns["arr"])  # ... does not change the store


def test_restored_object_never_changes_when_the_store_changes(store):
    ns, cp = fresh(store)
    run(ns, "import numpy as np, torch; arr = np.ones(1 << 20); t = torch.ones(1 << 20)")
    save_ok(cp, ["arr", "t"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["arr", "t"])
    for _ in range(3):  # new versions overwrite nothing; space of old ones may be reclaimed, not reused under us
        run(ns, "arr *= 2; t *= 3")
        save_ok(cp, ["arr", "t"])
        store.gc()
    assert float(ns2["arr"].sum()) == 1 << 20 and float(ns2["t"].sum()) == 1 << 20
    ns3, cp3 = fresh(store)
    restore_ok(cp3, ["arr", "t"])
    assert ns3["arr"][0] == 8.0 and ns3["t"][0].item() == 27.0


# ---- torch -----------------------------------------------------------------------------------------

TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def test_torch_dtypes_shapes_grad(store):
    ns, cp = fresh(store)
    names = []
    for i, dt in enumerate(TORCH_DTYPES):
        ns["t%d" % i] = (torch.arange(30) % 7).to(dt).reshape(5, 6)
        names.append("t%d" % i)
    run(ns, """
        import torch
        scalar = torch.tensor(2.5)
        empty = torch.empty(0, 3)
        nc = torch.arange(20.0).reshape(4, 5)[:, 1::2]
        leaf = torch.randn(3, 3, requires_grad=True)
        (leaf * 2).sum().backward()
        param = torch.nn.Parameter(torch.ones(2, 2))
        frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    """)
    names += ["scalar", "empty", "nc", "leaf", "param", "frozen"]
    save_ok(cp, names)
    ns2, cp2 = fresh(store)
    restore_ok(cp2, names)
    for n in names:
        a, b = ns[n], ns2[n]
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape, n
        assert a.stride() == b.stride() and a.requires_grad == b.requires_grad, n
        assert torch.equal(a, b), n
    assert torch.equal(ns2["leaf"].grad, torch.full((3, 3), 2.0))
    assert ns2["leaf"].is_leaf and isinstance(ns2["param"], torch.nn.Parameter)
    assert not ns2["frozen"].requires_grad
    ns2["t2"][0, 0] = 99  # restored tensors are writable, privately
    ns3, cp3 = fresh(store)
    restore_ok(cp3, ["t2"])
    assert ns3["t2"][0, 0].item() == 0


def test_module_with_buffers_and_state(store):
    ns, cp = fresh(store)
    run(ns, """
        import torch
        torch.manual_seed(2)
        net = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.BatchNorm1d(4))
        net(torch.randn(8, 2, 10))  # moves the running stats
        net.eval()
    """)
    save_ok(cp, ["net"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["net"])
    x = torch.randn(3, 2, 10)
    assert torch.equal(ns["net"](x), ns2["net"](x))
    assert not ns2["net"].training
    assert ns2["net"][1].num_batches_tracked.item() == 1


# ---- python objects, functions, classes ------------------------------------------------------------

def test_cell_functions_and_classes_by_value(store):
    ns, cp = fresh(store)
    run(ns, """
        import math
        scale = 10
        def f(x):
            return math.floor(x) * scale
        class Point:
            def __init__(self, x, y):
                self.x, self.y = x, y
            def norm(self):
                return math.hypot(self.x, self.y)
        def make_adder(k):
            return lambda v: v + k
        add3 = make_adder(3)
        pts = [Point(3, 4), Point(6, 8)]
        registry = {'f': f, 'cls': Point}
    """)
    save_ok(cp, ["scale", "f", "Point", "add3", "pts", "registry"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["registry"])
    restore_ok(cp2, ["pts", "add3"])
    assert "scale" in ns2  # a global the function reads came along
    assert ns2["registry"]["f"](2.7) == 20
    ns2["scale"] = 100  # the restored function reads the namespace, like any cell function
    assert ns2["f"](2.7) == 200
    assert ns2["registry"]["f"] is ns2["f"]
    assert type(ns2["pts"][0]) is ns2["Point"] is ns2["registry"]["cls"]
    assert ns2["pts"][1].norm() == 10.0 and ns2["add3"](4) == 7
    assert ns2["__builtins__"] is builtins


def test_pandas_frame_payloads_leave_the_stream(store):
    pd = pytest.importorskip("pandas")
    ns, cp = fresh(store)
    ns["df"] = pd.DataFrame({"a": np.arange(100000, dtype=np.float64), "b": np.arange(100000) % 7,
                             "s": ["x%d" % (i % 5) for i in range(100000)]})
    rep = save_ok(cp, ["df"])
    assert rep.payload_bytes >= 2 * 100000 * 8  # the numeric blocks went to the pool
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["df"])
    pd.testing.assert_frame_equal(ns["df"], ns2["df"])


def test_large_bytes_and_shared_bytearray(store):
    ns, cp = fresh(store)
    ns["blob"] = bytes(range(256)) * (BIG_BYTES // 128)
    ns["buf"] = bytearray(b"z" * (BIG_BYTES * 2))
    ns["holder"] = {"buf": ns["buf"], "small": b"tiny"}
    rep = save_ok(cp, ["blob", "buf", "holder"])
    assert rep.payload_bytes >= len(ns["blob"]) + len(ns["buf"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["holder"])
    restore_ok(cp2, ["blob", "buf"])
    assert ns2["blob"] == ns["blob"] and type(ns2["blob"]) is bytes
    assert ns2["holder"]["buf"] is ns2["buf"] and ns2["buf"] == ns["buf"]


# ---- what cannot be saved --------------------------------------------------------------------------

def test_unsaveable_variables_are_named_and_others_saved(store, tmp_path):
    ns, cp = fresh(store)
    ns["fh"] = 1
    save_ok(cp, ["fh"])  # an earlier, saveable version
    f = open(tmp_path / "x.txt", "w")
    s = socket.socket()
    ns.update(fh=f, sock=s, gen=(i for i in range(3)), lock=threading.Lock(), ok=[1, 2, 3],
              holds_file={"f": f})
    try:
        rep = cp.save(["fh", "sock", "gen", "lock", "ok", "holds_file"])
        assert rep.error is None
        assert set(rep.failed) == {"fh", "sock", "gen", "lock", "holds_file"}
        assert "TextIOWrapper" in rep.failed["fh"] and "generator" in rep.failed["gen"]
        assert "lock" in rep.failed["lock"] and "socket" in rep.failed["sock"]
        assert list(rep.saved) == ["ok"]
        ns2, cp2 = fresh(store)
        restore_ok(cp2, ["ok", "fh"])
        assert ns2["ok"] == [1, 2, 3] and ns2["fh"] == 1  # the committed version is intact
        assert set(cp2.restore(["gen"]).missing) == {"gen"}
    finally:
        f.close()
        s.close()


def test_in_memory_buffers_are_values(store):
    # IPython's %%capture keeps output in StringIOs: contents and position come back, shared once.
    import io
    ns, cp = fresh(store)
    ns["s"] = io.StringIO("captured text")
    ns["s"].seek(9)
    ns["b"] = io.BytesIO(b"\x00\x01bytes")
    ns["both"] = [ns["s"], ns["s"]]
    closed = io.StringIO("x")
    closed.close()
    ns["closed"] = closed
    rep = cp.save(["s", "b", "both", "closed"])
    assert set(rep.failed) == {"closed"}, rep
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["s", "b", "both"])
    assert ns2["s"].read() == "text" and ns2["b"].getvalue() == b"\x00\x01bytes"
    assert ns2["both"][0] is ns2["both"][1] is ns2["s"]


# ---- incremental save, versions, restore skipping ---------------------------------------------------

def test_incremental_save_writes_only_changed_regions(store):
    ns, cp = fresh(store)
    run(ns, "import numpy as np; big = np.zeros(32 * %d // 8); small = [1, 2]" % MiB)
    rep = save_ok(cp, ["big", "small"])
    assert rep.bytes_written >= 32 * MiB
    v1 = store.versions()
    rep = save_ok(cp, ["big", "small"])
    assert rep.bytes_written == 0 and sorted(rep.unchanged) == ["big", "small"] and not rep.saved
    assert store.versions() == v1  # no new versions for unchanged variables
    ns["big"][3 * MiB // 8] = 1.0  # one 2 MiB region dirty
    rep = save_ok(cp, ["big", "small"])
    assert rep.bytes_written == 2 * MiB and list(rep.saved) == ["big"]
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["big"])
    assert ns2["big"][3 * MiB // 8] == 1.0 and ns2["big"].sum() == 1.0


def test_restored_payload_saved_again_costs_nothing(store):
    ns, cp = fresh(store)
    run(ns, "import torch; w = torch.ones(16 * %d // 4); other = torch.zeros(10)" % MiB)
    save_ok(cp, ["w", "other"])
    ns2, cp2 = fresh(store)  # a worker: restore, run a cell that does not touch w, save
    restore_ok(cp2, ["w", "other"])
    run(ns2, "other += 1")
    rep = save_ok(cp2, ["w", "other"])
    assert rep.bytes_written <= 40  # only `other` (40 bytes); w was neither copied nor hashed
    assert "w" in rep.unchanged and "other" in rep.saved
    run(ns2, "w[5] = 7.0")
    rep = save_ok(cp2, ["w"])
    assert rep.bytes_written == 2 * MiB and "w" in rep.saved
    ns3, cp3 = fresh(store)
    restore_ok(cp3, ["w", "other"])
    assert ns3["w"][5].item() == 7.0 and ns3["w"].sum().item() == 16 * MiB // 4 + 6
    assert ns3["other"].sum().item() == 10


def test_versions_move_forward_and_restore_skips_held(store):
    ns, cp = fresh(store)
    ns.update(x=1, y=[1])
    save_ok(cp, ["x", "y"])
    v = cp.versions()
    assert v["x"] == v["y"] > 0
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["x", "y"])
    rep = restore_ok(cp2, ["x", "y"])
    assert sorted(rep.skipped) == ["x", "y"] and not rep.restored
    ns["x"] = 2
    save_ok(cp, ["x"])
    assert cp.versions()["x"] > v["x"] and cp.versions()["y"] == v["y"]
    y_before = ns2["y"]
    rep = restore_ok(cp2, ["x", "y"])
    assert rep.restored == {"x": cp.versions()["x"]} and ns2["x"] == 2 and ns2["y"] is y_before
    rep = cp2.restore(["x"], held={})  # the caller says it holds nothing
    assert "x" in rep.restored


def test_owner_reloaded_brings_held_dependents_along(store):
    ns, cp = fresh(store)
    run(ns, "a = {'n': 1}; b = [a]")
    save_ok(cp, ["a", "b"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["a", "b"])
    run(ns, "a['n'] = 2")
    save_ok(cp, ["a"])
    rep = restore_ok(cp2, ["a"])
    assert "b" in rep.restored  # b held the old a; it is reloaded so identity holds
    assert ns2["b"][0] is ns2["a"] and ns2["a"]["n"] == 2


def test_worker_round_trip_keeps_sharing(store):
    ns, cp = fresh(store)
    run(ns, MODEL_CELL)
    save_ok(cp, ["model", "opt", "X", "Y", "step", "losses"])
    ns_w, cp_w = fresh(store)  # worker: restore closure, run a cell, save
    restore_ok(cp_w, ["step", "losses"])
    run(ns_w, "losses += [step() for _ in range(2)]")
    save_ok(cp_w, ["model", "opt", "losses"])
    rep = restore_ok(cp, ["model", "opt", "losses"])  # the kernel catches up
    assert set(rep.restored) >= {"model", "opt", "losses"}
    run(ns, "losses.append(step())")
    run(ns_w, "losses.append(step())")
    assert ns["losses"] == ns_w["losses"]
    assert ns["opt"].param_groups[0]["params"][0] is ns["model"][0].weight


def test_delete_and_missing(store):
    ns, cp = fresh(store)
    ns.update(keep=1, gone=2)
    save_ok(cp, ["keep", "gone"])
    del ns["gone"]
    rep = save_ok(cp, ["gone"])
    assert rep.deleted == ["gone"]
    assert "gone" not in cp.versions()
    ns2, cp2 = fresh(store)
    rep = cp2.restore(["keep", "gone", "never"])
    assert rep.missing == ["gone", "never"] and ns2["keep"] == 1


def test_deleting_an_owner_keeps_dependents_restorable(store):
    ns, cp = fresh(store)
    run(ns, "owner = [1, 2]; dep = {'o': owner}")
    save_ok(cp, ["owner", "dep"])
    del ns["owner"]
    rep = save_ok(cp, ["owner"])
    assert rep.deleted == ["owner"] and "dep" in rep.saved
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["dep"])
    assert ns2["dep"] == {"o": [1, 2]} and "owner" not in ns2


def test_foreign_or_corrupt_entry_is_a_clear_failure(store):
    store.commit("junk", {"bad": (b"not a looseleaf blob", [], [])})
    ns2, cp2 = fresh(store)
    rep = cp2.restore(["bad"])
    assert "bad" in rep.failed and "not a LooseLeaf blob" in rep.failed["bad"]
    assert "bad" not in ns2


def test_delete_from_a_worker(store):
    ns, cp = fresh(store)
    run(ns, "import numpy as np; arr = np.ones(1 << 20)")
    save_ok(cp, ["arr"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["arr"])
    del ns2["arr"]
    rep = save_ok(cp2, ["arr"])
    assert rep.deleted == ["arr"]
    assert "arr" not in cp.versions()


def test_numpy_views_share_memory_with_a_saved_base(store):
    ns, cp = fresh(store)
    run(ns, """
        import numpy as np
        base = np.arange(100, dtype=np.float64)
        window = base[10:20]
        grid = base.reshape(10, 10)
        cols = grid[:, ::3]
        both = {'b': base, 'w': base[50:]}
        tiny = np.arange(10 ** 6)[5:8]  # a small view of an array nobody saves: stored as a copy
    """)
    save_ok(cp, ["window", "cols", "grid", "base", "both", "tiny"])
    ns2, cp2 = fresh(store)
    for n in ["window", "cols", "both", "grid", "base", "tiny"]:
        restore_ok(cp2, [n])
    for n in ["window", "cols", "grid", "base", "tiny"]:
        assert np.array_equal(ns[n], ns2[n]) and ns[n].strides == ns2[n].strides, n
    # restored arrays saved again unchanged keep their blobs (no new versions), views included
    rep = save_ok(cp2, ["base", "window", "grid"])
    assert not rep.saved and rep.bytes_written == 0 and set(rep.unchanged) >= {"base", "grid", "window"}, rep
    ns2["base"][15] = -5
    assert ns2["window"][5] == -5 and ns2["grid"][1, 5] == -5 and ns2["both"]["b"] is ns2["base"]
    ns2["base"][3] = -7
    assert ns2["cols"][0, 1] == -7
    ns2["base"][55] = -9
    assert ns2["both"]["w"][5] == -9
    assert ns2["tiny"].base is None or ns2["tiny"].base.nbytes < 10 ** 5
    rep = save_ok(cp2, ["base"])  # written through the views: the owner's payload changed
    assert rep.bytes_written == 800 and set(rep.saved) >= {"window"}, rep


def test_worker_rebinding_an_owner_it_restored_keeps_an_unrestored_dependent_valid(store):
    ns, cp = fresh(store)
    run(ns, "a = [1, 2]; b = {'a': a, 'tag': 'b'}")
    save_ok(cp, ["a", "b"])
    ns_w, cp_w = fresh(store)  # a worker that only needed `a`
    restore_ok(cp_w, ["a"])
    assert "b" not in ns_w
    run(ns_w, "a = ['new']")
    rep = save_ok(cp_w, ["a"])  # b referenced the old a: it is restored here and re-saved with it
    assert "b" in rep.added and "b" in rep.saved, rep
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["b", "a"])
    assert ns2["a"] == ["new"] and ns2["b"] == {"a": [1, 2], "tag": "b"}
    assert ns2["b"]["a"] is not ns2["a"]


def test_restore_brings_the_current_globals_a_function_reads(store):
    ns, cp = fresh(store)
    run(ns, "rate = 2\ndef f(x):\n    return x * rate\n")
    save_ok(cp, ["rate", "f"])
    run(ns, "rate = 5")
    save_ok(cp, ["rate"])
    ns2, cp2 = fresh(store)
    rep = restore_ok(cp2, ["f"])
    assert set(rep.restored) == {"f", "rate"} and ns2["f"](3) == 15


def test_bad_arguments_are_clear_errors(store):
    ns, cp = fresh(store)
    with pytest.raises(TypeError, match="list of variable names"):
        cp.save("x")
    with pytest.raises(TypeError, match="must be str"):
        cp.restore([1])
    with pytest.raises(TypeError, match="namespace must be a dict"):
        Checkpointer(store, [])


def test_untouched_restored_payload_is_committed_without_a_put(store):
    if not os.access("/proc/self/pagemap", os.R_OK):
        pytest.skip("no /proc/self/pagemap here: restored payloads are hashed instead")
    ns, cp = fresh(store)
    ns["w"] = np.arange(16 * MiB // 8, dtype=np.float64)
    save_ok(cp, ["w"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["w"])
    float(ns2["w"].sum())  # reading maps pages in; only writing makes them this process's own
    puts = store.stats()["puts"]
    rep = save_ok(cp2, ["w"])
    assert rep.unchanged == ["w"] and store.stats()["puts"] == puts  # not even hashed
    from looseleaf_store import pagemap
    addr = ns2["w"].__array_interface__["data"][0]
    assert pagemap.written_regions(addr, ns2["w"].nbytes, 2 * MiB) == []
    ns2["w"][(2 * MiB + 8) // 8] = -1.0
    ns2["w"][(10 * MiB) // 8 + 3] = -2.0
    assert pagemap.written_regions(addr, ns2["w"].nbytes, 2 * MiB) == [1, 5]
    rep = save_ok(cp2, ["w"])
    assert rep.bytes_written == 2 * 2 * MiB and "w" in rep.saved
    ns3, cp3 = fresh(store)
    restore_ok(cp3, ["w"])
    assert ns3["w"][(2 * MiB + 8) // 8] == -1.0 and ns3["w"][(10 * MiB) // 8 + 3] == -2.0
    assert ns3["w"][0] == 0.0 and ns3["w"][-1] == 16 * MiB // 8 - 1


def test_big_structure_goes_to_the_pool_not_redis(store):
    ns, cp = fresh(store)
    run(ns, "shared = {'k': 1}\nbig = [float(i) for i in range(300000)] + [shared]\n")
    rep = save_ok(cp, ["shared", "big"])
    assert rep.payload_bytes > 300000 * 9
    assert len(store.fetch(["big"])["big"][1]) < 4096  # the Redis blob is only a header
    rep = save_ok(cp, ["shared", "big"])
    assert rep.bytes_written == 0 and sorted(rep.unchanged) == ["big", "shared"]
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["big"])
    assert ns2["big"][:-1] == ns["big"][:-1] and ns2["big"][-1] is ns2["shared"]


class _MapGoneOnce:
    """The real store, whose next map_payload raises PayloadGoneError, as when another process's commit
    and reclamation free a payload between our fetch and our map."""

    def __init__(self, store):
        self._store = store
        self.armed = True

    def __getattr__(self, name):
        return getattr(self._store, name)

    def map_payload(self, ref, writable=False):
        if self.armed:
            self.armed = False
            import _llstore
            raise _llstore.PayloadGoneError("payload %s was reclaimed (injected)" % ref)
        return self._store.map_payload(ref, writable=writable)


def test_restore_reads_again_when_a_payload_was_reclaimed_under_it(store):
    ns, cp = fresh(store)
    ns["arr"] = np.arange(1000.0)
    ns["other"] = [1]
    save_ok(cp, ["arr", "other"])
    ns2 = new_ns()
    rep = Checkpointer(_MapGoneOnce(store), ns2).restore(["arr", "other"])
    assert not rep.failed and set(rep.restored) == {"arr", "other"}, rep
    assert np.array_equal(ns2["arr"], ns["arr"])


def test_forget_drops_local_knowledge_only(store):
    ns, cp = fresh(store)
    run(ns, "a = [1]; b = {'a': a}")
    save_ok(cp, ["a", "b"])
    assert cp.held() == cp.versions()
    cp.forget(["a"])
    assert "a" not in cp.held() and "b" in cp.held()
    cp.forget()
    assert cp.held() == {} and set(cp.versions()) == {"a", "b"}
    ns.clear()
    ns.update(new_ns())
    rep = restore_ok(cp, ["b"])
    assert set(rep.restored) == {"a", "b"} and ns["b"]["a"] is ns["a"]


def test_owner_is_not_committed_when_a_dependent_cannot_come_along(store):
    ns, cp = fresh(store)
    run(ns, "a = [{'x': 1}, {'y': 2}]; d = [a[1]]")
    save_ok(cp, ["a", "d"])
    entry = store.fetch(["d"])["d"]
    store.commit("corrupt-d", {"d": (b"LLS1garbage", [], list(entry[3]))})  # d can no longer be loaded
    ns_w, cp_w = fresh(store)  # a worker that holds only `a`
    restore_ok(cp_w, ["a"])
    run(ns_w, "a.reverse()")  # a's memo indices now name other objects
    rep = cp_w.save(["a"])
    assert "a" in rep.failed and "d" in rep.failed["a"] and "a" not in rep.saved, rep
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["a"])
    assert ns2["a"] == [{'x': 1}, {'y': 2}]  # the committed a is untouched

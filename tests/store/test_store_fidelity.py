"""What the Checkpointer keeps for issue 13 (GPU cells indistinguishable from ipykernel), over the real _llstore:

* values with a state protocol go through the one registry of reducers (torch.Generator);
* a tensor's backward hooks, requires_grad, is_leaf and .grad survive; a value with autograd history is saved
  with its data and reported (SaveReport.graphs); a value no pickle takes can be committed as a stand-in;
* memory shared between variables stays shared after they are restored separately (torch.from_numpy,
  Tensor.numpy, np.frombuffer), whichever is pickled first, and saving one commits the other too;
* a user module's globals are a variable of their own (usermods.py), reloaded where the code differs;
* homes.tied finds what a home value reaches (the parameters under a loss's graph, a generator's locals).

Each test plays a notebook as tests/store/test_store_checkpoint.py does: cells exec'd in a namespace dict,
variables saved, then restored into fresh namespaces (as GPU workers and the kernel do).
"""
import importlib
import sys

import numpy as np
import pytest
import torch

from cphelp import fresh, restore_ok, run, save_ok
from looseleaf_store import homes, serial, usermods


# ---- state protocols ---------------------------------------------------------------------------------------

def test_torch_generator_goes_through_its_state(store):
    ns, cp = fresh(store)
    run(ns, "import torch\ng = torch.Generator().manual_seed(3)\nfirst = torch.rand(2, generator=g)")
    want = torch.rand(3, generator=ns["g"].clone_state()) if hasattr(ns["g"], "clone_state") else None
    expect_g = torch.Generator().manual_seed(3)
    torch.rand(2, generator=expect_g)
    save_ok(cp, ["g", "first"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["g"])
    assert type(ns2["g"]) is torch.Generator and ns2["g"].device.type == "cpu"
    assert torch.equal(torch.rand(3, generator=ns2["g"]), torch.rand(3, generator=expect_g))
    del want


def test_registry_is_consulted_for_any_type(store):
    class Stateful:
        def __init__(self):
            self.state = 41

        def __reduce__(self):
            raise TypeError("cannot pickle 'Stateful' object")

    Stateful.__module__ = "ll_test_registry"
    serial.register_reducer("ll_test_registry", Stateful.__qualname__,
                            lambda v: (dict, ([("state", v.state + 1)],)))
    try:
        ns, cp = fresh(store)
        ns["s"] = Stateful()
        save_ok(cp, ["s"])
        ns2, cp2 = fresh(store)
        restore_ok(cp2, ["s"])
        assert ns2["s"] == {"state": 42}
    finally:
        del serial.REDUCERS[("ll_test_registry", Stateful.__qualname__)]


# ---- autograd ------------------------------------------------------------------------------------------------

def test_hooks_requires_grad_and_grad_survive(store):
    ns, cp = fresh(store)
    run(ns, """
        import torch
        w = torch.ones(2, requires_grad=True)
        h = w.register_hook(lambda g: g * 2)
        (w * 3).sum().backward()
        frozen = torch.zeros(2)
    """)
    save_ok(cp, ["w", "h", "frozen"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["w", "h", "frozen"])
    run(ns2, """
        import torch
        g1 = w.grad.clone()
        (w * 3).sum().backward()
        g2 = w.grad.clone()
        h.remove()
        (w * 3).sum().backward()
        g3 = w.grad.clone()
    """)
    assert ns2["w"].requires_grad and ns2["w"].is_leaf and not ns2["frozen"].requires_grad
    assert ns2["g1"].tolist() == [6.0, 6.0]          # the grad, hooked, as saved
    assert ns2["g2"].tolist() == [12.0, 12.0]        # accumulates, through the hook
    assert ns2["g3"].tolist() == [15.0, 15.0]        # the handle removed the restored hook


def test_values_with_autograd_history_are_reported(store):
    ns, cp = fresh(store)
    run(ns, "import torch\nw = torch.ones(2, requires_grad=True)\nloss = (w * 2).sum()\nalias = [loss]\n"
            "hist = [(w * 5).sum()]\nplain = w.detach()")
    rep = save_ok(cp, ["w", "loss", "alias", "hist", "plain"])
    assert sorted(rep.graphs) == ["hist", "loss"]  # (alias references loss's tensor: loss holds it)
    rep = save_ok(cp, ["loss", "plain"])
    assert rep.graphs == ["loss"] and "loss" in rep.unchanged  # reported when unchanged too


def test_stand_in_for_a_value_no_pickle_takes(store):
    ns, cp = fresh(store)
    run(ns, "gen = (i for i in range(3))\nholds = {'g': gen}\nok = [1]")
    asked = []

    def stand_in(name, value, why):
        asked.append(name)
        return homes.HomeRef(123, "tok", homes.describe(value, why))

    rep = cp.save(["gen", "holds", "ok"], stand_in=stand_in)
    assert rep.error is None and not rep.failed and sorted(rep.standins) == ["gen", "holds"], rep
    assert ns["gen"] is not None and sorted(asked) == ["gen", "holds"]
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["gen", "holds", "ok"])
    assert ns2["gen"] == homes.HomeRef(123, "tok", "a generator")
    assert ns2["holds"].what == "a dict holding a generator" and ns2["ok"] == [1]
    # The same stand-in again is no new version.
    rep = cp.save(["gen"], stand_in=lambda n, v, w: homes.HomeRef(123, "tok", homes.describe(v, w)))
    assert rep.unchanged == ["gen"], rep


# ---- shared memory ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [["a", "t"], ["t", "a"]])
def test_from_numpy_shares_memory_after_separate_restores(store, order):
    ns, cp = fresh(store)
    run(ns, "import numpy as np, torch\na = np.zeros(4)\nt = torch.from_numpy(a)[1:]")
    save_ok(cp, order)
    for restore_order in (["t", "a"], ["a", "t"]):
        ns2, cp2 = fresh(store)
        restore_ok(cp2, restore_order)
        run(ns2, "t.add_(1)\na += 10")
        assert ns2["a"].tolist() == [10, 11, 11, 11] and ns2["t"].tolist() == [11, 11, 11]


def test_a_write_through_one_name_commits_the_other(store):
    """The kernel holds a, a worker t (over a's memory): the worker's write through t and its save of t alone
    moves a's version too, and a restore of a elsewhere sees the write."""
    ns, cp = fresh(store)
    run(ns, "import numpy as np, torch\na = np.zeros(3)\nt = torch.from_numpy(a)\nu = torch.zeros(2)\nb = u.numpy()")
    v0 = save_ok(cp, ["a", "t", "u", "b"]).saved
    worker, cpw = fresh(store)
    restore_ok(cpw, ["t", "b"])
    run(worker, "t.mul_(0).add_(5)\nb[1] = 9")
    rep = save_ok(cpw, ["t", "b"])
    assert rep.saved["a"] > v0["a"] and rep.saved["u"] > v0["u"], rep  # the owners moved with them
    kernel2, cpk = fresh(store)
    restore_ok(cpk, ["a", "u"])
    assert kernel2["a"].tolist() == [5, 5, 5] and kernel2["u"].tolist() == [0, 9]


def test_tensor_numpy_and_frombuffer_share_memory(store):
    ns, cp = fresh(store)
    run(ns, """
        import numpy as np, torch
        u = torch.arange(4.0)
        b = u.numpy()[::2]
        buf = bytearray(b"abcd")
        f = np.frombuffer(buf, dtype=np.uint8)[1:]
        whole = bytes(100)
        ro = np.frombuffer(whole, dtype=np.uint8)
    """)
    save_ok(cp, ["b", "u", "f", "buf", "ro", "whole"])
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["b", "f", "ro", "u", "buf"])
    run(ns2, "u[2] = 40\nbuf[2] = 0")
    assert ns2["b"].tolist() == [0.0, 40.0] and ns2["f"].tolist() == [98, 0, 100]
    assert not ns2["ro"].flags.writeable and ns2["ro"].nbytes == 100


# ---- user modules ------------------------------------------------------------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in a directory of the user's (on sys.path), imported; removed from sys.modules after."""
    name = "ll_user_mod_%d" % id(tmp_path)
    path = tmp_path / (name + ".py")
    path.write_text("counter = 0\ncache = {}\n\ndef bump():\n    global counter\n    counter += 1\n    return counter\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    yield mod, path
    sys.modules.pop(name, None)


def test_user_module_globals_are_a_variable(store, user_module):
    mod, path = user_module
    assert usermods.is_user_module(mod) and not usermods.is_user_module(np) and not usermods.is_user_module(serial)
    ns, cp = fresh(store)
    ns["shared"] = mod.cache
    mod.bump()
    mod.bump()
    mod.extra = [1, 2]
    usermods.bind_all(ns)
    entries = [usermods.entry(mod.__name__)]
    assert entries[0] in ns and ns[entries[0]] is mod
    save_ok(cp, entries + ["shared"])
    # Another process: the module as freshly imported (counter 0), then restored.
    mod.counter, mod.cache = 0, {}
    del mod.extra
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["shared"] + entries)
    assert mod.counter == 2 and mod.extra == [1, 2] and ns2["shared"] is mod.cache
    assert ns2[entries[0]] is mod and mod.bump() == 3


def test_user_module_reloads_where_its_code_differs(store, user_module):
    mod, path = user_module
    ns, cp = fresh(store)
    path.write_text(path.read_text().replace("return counter", "return counter * 100"))
    importlib.reload(mod)  # (the saving process reloaded the edited file; counter is 0 again)
    mod.bump()
    usermods.bind_all(ns)
    entries = [usermods.entry(mod.__name__)]
    save_ok(cp, entries)
    fp = usermods.fingerprint(mod)
    # A process that still runs the old code (as this one did before the edit).
    old = compile("def bump():\n    global counter\n    counter += 1\n    return counter\n", str(path), "exec")
    exec(old, mod.__dict__)
    assert usermods.fingerprint(mod) != fp
    ns2, cp2 = fresh(store)
    restore_ok(cp2, entries)
    assert usermods.fingerprint(mod) == fp and mod.counter == 1 and mod.bump() == 200


# ---- homes ---------------------------------------------------------------------------------------------------

def test_tied_finds_what_a_home_value_reaches(store):
    ns, cp = fresh(store)
    run(ns, """
        import torch
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = [torch.ones(2), torch.zeros(2)]
        other = [1, 2]
        def gen():
            for x in data:
                yield x
    """)
    save_ok(cp, ["model", "opt", "data", "other", "gen"])
    run(ns, "loss = model(torch.ones(2)).sum()\nit = gen()\nnext(it)")
    owner, graph = cp.sharing()
    assert homes.tied(owner, ns, ["loss"], graph) == {"model", "opt"}
    assert homes.tied(owner, ns, ["it"], graph) == {"data"}
    assert homes.describe(ns["it"], "TypeError: cannot pickle 'generator' object") == "a generator"

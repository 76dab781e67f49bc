"""Fault tests, end to end through looseleaf_store: a saving process SIGKILLed at each step of a save
(`LL_STORE_FAULT`, the C store's fault injection) leaves the last committed cell restorable and never a
torn cell; a pool too small for a save gives a clear error and keeps the old versions.
"""
import builtins
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from looseleaf_store import Checkpointer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SAVER = textwrap.dedent("""
    import builtins, os, sys
    sys.path[:0] = [os.path.join(%(repo)r, "build", "py"), os.path.join(%(repo)r, "store", "py")]
    import numpy as np, _llstore
    from looseleaf_store import Checkpointer
    st = _llstore.Store(%(rt)r, %(sid)r, pool_bytes=1 << 28)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    cp = Checkpointer(st, ns)
    ns["a"] = np.full(3 << 20, 1.0)          # several regions
    ns["b"] = {"cell": 1, "a": ns["a"]}      # shares a
    rep = cp.save(["a", "b"], cell_id="cell-1")
    assert not rep.failed and rep.error is None, rep
    print("committed", flush=True)
    ns["a"][:] = 2.0
    ns["b"]["cell"] = 2
    ns["c"] = [ns["b"]]
    os.environ["LL_STORE_FAULT"] = %(step)r
    rep = cp.save(["a", "b", "c"], cell_id="cell-2")
    print("survived", rep, flush=True)
""")


@pytest.mark.parametrize("step", ["after_payload", "before_commit", "after_commit"])
def test_sigkill_while_saving_leaves_last_commit(session, runtime_dir, step):
    store = session(pool_bytes=1 << 28)
    code = SAVER % {"repo": REPO, "rt": runtime_dir, "sid": session.session_id, "step": step}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    assert "committed" in p.stdout and "survived" not in p.stdout
    ns = {"__name__": "__main__", "__builtins__": builtins}
    cp = Checkpointer(store, ns)
    rep = cp.restore(["a", "b", "c"])
    assert not rep.failed, rep
    cell = 2 if step == "after_commit" else 1
    assert ns["b"]["cell"] == cell and ns["b"]["a"] is ns["a"]
    assert float(ns["a"].min()) == float(ns["a"].max()) == float(cell)  # no torn payload
    assert len(set(rep.restored.values())) == 1  # one cell's versions, never a mix
    if cell == 1:
        assert rep.missing == ["c"]
    else:
        assert ns["c"][0] is ns["b"]
    # the store goes on working: this process saves over whatever the dead one left
    ns["a"][:] = 3.0
    rep = cp.save(["a", "b"])
    assert not rep.failed and rep.error is None, rep
    store.gc()
    ns2 = {"__name__": "__main__", "__builtins__": builtins}
    assert not Checkpointer(store, ns2).restore(["b"]).failed
    assert float(ns2["b"]["a"].sum()) == 3.0 * (3 << 20)


def test_pool_full_is_a_clear_error_and_keeps_old_versions(session):
    store = session(pool_bytes=16 << 20)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    cp = Checkpointer(store, ns)
    ns["x"] = np.ones(4 << 20, dtype=np.uint8)
    ns["y"] = [1, 2]
    rep = cp.save(["x", "y"])
    assert not rep.failed, rep
    ns["x"] = np.full(64 << 20, 7, dtype=np.uint8)  # four times the pool
    ns["y"] = [ns["x"], 3]
    rep = cp.save(["x", "y"])
    assert rep.error is None
    assert set(rep.failed) == {"x", "y"}, rep
    assert "full" in rep.failed["x"].lower(), rep.failed["x"]
    assert "x" in rep.failed["y"]
    ns2 = {"__name__": "__main__", "__builtins__": builtins}
    r = Checkpointer(store, ns2).restore(["x", "y"])
    assert not r.failed and ns2["y"] == [1, 2] and int(ns2["x"].sum()) == 4 << 20


WORKER = textwrap.dedent("""
    import builtins, os, sys
    sys.path[:0] = [os.path.join(%(repo)r, "build", "py"), os.path.join(%(repo)r, "store", "py")]
    import _llstore
    from looseleaf_store import Checkpointer
    st = _llstore.Store(%(rt)r, %(sid)r, pool_bytes=1 << 28)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    cp = Checkpointer(st, ns)
    r = cp.restore(["train"])
    assert not r.failed and {"model", "opt", "train"} <= set(r.restored), r
    assert ns["opt"].param_groups[0]["params"][0] is ns["model"][0].weight
    ns["losses"] = [ns["train"]() for _ in range(3)]
    rep = cp.save(["model", "opt", "losses"])
    assert not rep.failed and rep.error is None, rep
    print("worker", rep, flush=True)
    st.close()
""")


def test_worker_process_restores_trains_and_saves(session, runtime_dir):
    store = session(pool_bytes=1 << 28)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    exec(textwrap.dedent("""
        import torch
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        X = torch.randn(16, 5); Y = torch.randn(16, 1)
        def train():
            opt.zero_grad()
            loss = ((model(X) - Y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.item()
        train()
    """), ns)
    cp = Checkpointer(store, ns)
    rep = cp.save(["model", "opt", "X", "Y", "train"])
    assert not rep.failed, rep
    code = WORKER % {"repo": REPO, "rt": runtime_dir, "sid": session.session_id}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "worker" in p.stdout, (p.stdout, p.stderr)
    expected = [ns["train"]() for _ in range(3)]  # the same steps, in this process
    r = cp.restore(["model", "opt", "losses"])
    assert not r.failed and {"model", "opt", "losses"} <= set(r.restored), r
    assert ns["losses"] == expected
    assert ns["opt"].param_groups[0]["params"][0] is ns["model"][0].weight
    # the function restored earlier reads the namespace: it now trains the restored model
    before = [p.clone() for p in ns["model"].parameters()]
    ns["train"]()
    assert any(not torch.equal(a, b) for a, b in zip(before, ns["model"].parameters()))

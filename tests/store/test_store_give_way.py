"""Checkpointer.save(give_way=check) (the kernel's background commit, coherence.commit_slow): CHECK is asked
between the ~64 MiB pieces of a large payload, and an exception it raises abandons the save: nothing is
committed, the committed version stays whole, the pieces already written are given back."""
import numpy as np
import pytest

from cphelp import fresh, restore_ok, save_ok
from looseleaf_store import checkpoint


class _Stop(BaseException):
    pass


def test_a_save_that_gives_way_mid_payload_publishes_nothing(session):
    store = session(pool_bytes=512 << 20)
    ns, cp = fresh(store)
    n = (2 * checkpoint._PIECE_BYTES + (8 << 20)) // 8  # three pieces
    ns["x"] = np.zeros(n)
    ns["y"] = {"a": [1, 2]}
    v1 = save_ok(cp, ["x", "y"]).saved["x"]
    used = store.stats()["regions_used"]

    ns["x"][:] = 7
    ns["y"]["a"].append(3)
    ns["z"] = np.ones(n)  # never saved: its write tracking starts with this save
    asked = []

    def check():
        asked.append(1)
        import sys
        if sys._getframe(1).f_code.co_name == "_put_in_pieces":
            raise _Stop()  # after the first piece of x was written

    with pytest.raises(_Stop):
        cp.save(["z", "x", "y"], give_way=check)
    assert store.versions()["x"] == v1 and cp.version("x") == v1 and "z" not in store.versions()
    store.gc()
    assert store.stats()["regions_used"] == used, store.stats()
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["x", "y"])
    assert float(ns2["x"].min()) == float(ns2["x"].max()) == 0.0 and ns2["y"] == {"a": [1, 2]}

    # Asked and never raising: the pieces make the same payload as one put.
    rep = save_ok(cp, ["x", "y"], give_way=lambda: asked.append(1))
    assert rep.saved["x"] > v1 and len(asked) > 4
    ns3, cp3 = fresh(store)
    restore_ok(cp3, ["x", "y"])
    assert ns3["x"].shape == (n,) and float(ns3["x"].min()) == float(ns3["x"].max()) == 7.0
    assert ns3["y"] == {"a": [1, 2, 3]}

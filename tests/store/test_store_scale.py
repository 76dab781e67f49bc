"""Scale tests of looseleaf_store over the real _llstore: a 2 GB array, 10,000 small variables.

Memory: the 2 GB test holds the array, its pool copy and (mapped copy-on-write, so shared with the pool)
the restored array: about 4 GiB of the machine's 24.
"""
import builtins

import numpy as np

from looseleaf_store import Checkpointer

GiB = 1 << 30


def new_ns():
    return {"__name__": "__main__", "__builtins__": builtins}


def test_2gb_array_round_trip(session):
    store = session(pool_bytes=3 * GiB)
    ns = new_ns()
    n = 2 * GiB // 4
    a = np.empty(n, dtype=np.float32)
    step = 1 << 24
    for i in range(0, n, step):  # distinct contents in every region, without a second 2 GB temporary
        a[i:i + step] = np.arange(min(step, n - i), dtype=np.float32) + float(i // step)
    ns["big"] = a
    cp = Checkpointer(store, ns)
    rep = cp.save(["big"])
    assert not rep.failed and rep.error is None, rep
    assert rep.bytes_written == a.nbytes
    ns2 = new_ns()
    cp2 = Checkpointer(store, ns2)
    r = cp2.restore(["big"])
    assert not r.failed and r.payload_bytes == a.nbytes, r
    b = ns2["big"]
    assert b.shape == a.shape and b.dtype == a.dtype
    for i in range(0, n, step):
        assert np.array_equal(a[i:i + step], b[i:i + step]), i
    rep = cp2.save(["big"])  # restored and untouched: nothing to write
    assert rep.bytes_written == 0 and rep.unchanged == ["big"], rep
    del ns2["big"], b
    rep = cp.save(["big"])
    assert rep.bytes_written == 0 and rep.unchanged == ["big"], rep


def test_10000_small_variables(store):
    ns = new_ns()
    names = ["v%05d" % i for i in range(10000)]
    for i, n in enumerate(names):
        ns[n] = {"i": i, "sq": [i * i], "name": n} if i % 3 else (i, float(i), str(i))
    ns["shared"] = [ns[names[1]], ns[names[2]]]
    cp = Checkpointer(store, ns)
    rep = cp.save(names + ["shared"])
    assert not rep.failed and len(rep.saved) == 10001, rep
    assert len(store.versions()) == 10001
    ns2 = new_ns()
    cp2 = Checkpointer(store, ns2)
    r = cp2.restore(names + ["shared"])
    assert not r.failed and not r.missing and len(r.restored) == 10001
    for n in names:
        assert ns2[n] == ns[n], n
    assert ns2["shared"][0] is ns2[names[1]] and ns2["shared"][1] is ns2[names[2]]
    rep = cp.save(names + ["shared"])  # nothing changed: nothing committed
    assert not rep.saved and len(rep.unchanged) == 10001, rep
    ns["v00004"]["sq"].append(0)
    rep = cp.save(names)
    assert list(rep.saved) == ["v00004"], rep

"""Scale: 10,000 small entries, and a 2 GB payload round trip (about 4.5 GiB of memory:
the array, the pool, and nothing more: mapping back copies nothing)."""
import numpy as np

import _llstore

R = _llstore.REGION_BYTES


def test_ten_thousand_small_entries(store):
    names = ["v%05d" % i for i in range(10000)]
    writes = {n: (n.encode() * 3, [], [names[(i + 1) % len(names)]]) for i, n in enumerate(names)}
    vers = store.commit("big-cell", writes)
    assert len(vers) == 10000 and set(vers.values()) == {1}
    got = store.fetch(names)
    assert len(got) == 10000
    assert got["v01234"] == (1, b"v01234" * 3, [], ["v01235"])
    assert len(store.versions()) == 10000
    # and 10,000 one-variable commits, each its own version
    for i, n in enumerate(names):
        assert store.commit("c%d" % i, {n: (b"x", [], [])}) == {n: i + 2}
    v = store.versions()
    assert v["v00000"] == 2 and v["v09999"] == 10001
    assert store.last_commit() == (10001, "c9999")


def test_two_gigabyte_payload(runtime_dir, redis_url, session, pool_path):
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path,
                        pool_bytes=(2 << 30) + 8 * R)
    try:
        n = (2 << 30) // 8
        a = np.arange(n, dtype=np.uint64)
        ref = st.put_payload(a)
        assert ref.nbytes == 2 << 30 and ref.written == 2 << 30
        st.commit("c1", {"big": (b"", [ref], [])})
        (v, blob, prefs, refs), = st.fetch(["big"]).values()
        b = np.frombuffer(st.map_payload(prefs[0]), np.uint64)
        assert b.shape == a.shape and np.array_equal(a, b)
        # unchanged: nothing written; one region changed: 2 MiB written
        assert st.put_payload(a, base=ref).written == 0
        a[n // 2] = 0
        r2 = st.put_payload(a, base=ref)
        assert r2.written == R
        del b
    finally:
        st.delete_session()
        st.close()

"""Kept versions (issue 28, time travel): with the session's history on, every committed version stays
readable after newer ones supersede it, reclamation leaves its regions alone, and a budget drops the oldest
superseded versions first (store/ll_history.c)."""
import os
import sys
import time

import numpy as np
import pytest

import _llstore

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "store", "py"))
from looseleaf_store import history  # noqa: E402

R = _llstore.REGION_BYTES


def commit_fill(st, name, nregions, fill, cell, base=None):
    a = np.full(nregions * R, fill, dtype=np.uint8)
    ref = st.put_payload(a, base=base)
    ver = st.commit(cell, {name: (b"blob-%d" % fill, [ref], [])})[name]
    return ref, ver


def bytes_of(st, entry):
    _ver, _blob, prefs, _refs = entry
    return np.frombuffer(st.map_payload(prefs[0]), dtype=np.uint8)


def test_superseded_versions_stay_readable_and_unreclaimed(store):
    history.enable(store)
    vers = []
    for i in range(4):
        _, v = commit_fill(store, "w", 2, 10 + i, "In[%d]" % (i + 1))
        vers.append(v)
    store.commit("x", {"other": (b"o", [], [])})
    # Reclamation runs, yet every kept version's bytes are intact.
    store.gc()
    assert store.stats()["regions_used"] == 8
    kept, dropped = history.versions(store, "w")
    assert [k.version for k in kept] == vers and dropped == []
    assert [k.current for k in kept] == [False, False, False, True]
    assert [k.cell for k in kept] == ["In[1]", "In[2]", "In[3]", "In[4]"]
    assert all(k.nbytes == 2 * R and k.time > 0 for k in kept)
    for i, v in enumerate(vers):
        e = history.fetch(store, "w", v)
        assert e[0] == v and e[1] == b"blob-%d" % (10 + i)
        b = bytes_of(store, e)
        assert b.size == 2 * R and b[0] == 10 + i and b[-1] == 10 + i
    with pytest.raises(history.HistoryError, match="is not a version of w"):
        history.fetch(store, "w", 999)
    # Every name, in commit order.
    everything, _ = history.versions(store)
    assert [k.name for k in everything] == ["w"] * 4 + ["other"]


def test_without_history_superseded_versions_go(store):
    for i in range(3):
        commit_fill(store, "w", 2, i, "c")
    store.gc()
    assert store.stats()["regions_used"] == 2
    assert history.versions(store, "w") == ([], [])


def test_budget_drops_oldest_first_and_reclaims(store):
    history.enable(store)
    vers = [commit_fill(store, "w", 2, 20 + i, "c%d" % i)[1] for i in range(5)]
    store.gc()
    assert store.stats()["regions_used"] == 10
    # Room for two superseded versions (4 regions, plus their small blobs).
    dropped = history.prune(store, 4 * R + 1000)
    assert dropped == [(vers[0], "w"), (vers[1], "w")]
    kept, gone = history.versions(store, "w")
    assert [k.version for k in kept] == vers[2:]
    assert [g[0] for g in gone] == vers[:2]
    with pytest.raises(history.HistoryError, match=r"w@%d was dropped from the history" % vers[0]):
        history.fetch(store, "w", vers[0])
    store.gc()
    assert store.stats()["regions_used"] == 6
    assert bytes_of(store, history.fetch(store, "w", vers[2]))[5] == 22
    # Within budget: nothing more goes; the current version never goes.
    assert history.prune(store, 4 * R + 1000) == []
    assert history.prune(store, 0) == [(vers[2], "w"), (vers[3], "w")]
    store.gc()
    assert store.stats()["regions_used"] == 2
    assert bytes_of(store, history.fetch(store, "w", vers[4]))[0] == 24


def test_shared_regions_count_once(store):
    """An incremental save shares unchanged regions with the version before: those cost the history
    nothing while the current version uses them, so a budget of one region keeps versions that differ
    from the current one in one region each only as far as it goes."""
    history.enable(store)
    a = np.zeros(4 * R, dtype=np.uint8)
    ref = store.put_payload(a)
    v1 = store.commit("c1", {"w": (b"b", [ref], [])})["w"]
    a[0] = 1  # region 0 changes; 1..3 are shared
    ref2 = store.put_payload(a, base=ref)
    assert ref2.written == R
    v2 = store.commit("c2", {"w": (b"b", [ref2], [])})["w"]
    store.gc()
    assert store.stats()["regions_used"] == 5
    assert history.prune(store, R + 100) == []  # v1 alone holds one region
    assert history.prune(store, R - 1) == [(v1, "w")]
    store.gc()
    assert store.stats()["regions_used"] == 4
    assert history.versions(store, "w")[0][0].version == v2


def test_other_process_commits_keep_history(store, runtime_dir, redis_url, session, pool_path):
    """A worker's Store (opened on the same session) reads the setting at its first commit."""
    history.enable(store)
    other = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path, reserve_bytes=0)
    try:
        _, v1 = commit_fill(other, "t", 1, 1, "w1")
        _, v2 = commit_fill(other, "t", 1, 2, "w2")
    finally:
        other.close()
    store.gc()
    assert [k.version for k in history.versions(store, "t")[0]] == [v1, v2]
    assert bytes_of(store, history.fetch(store, "t", v1))[0] == 1


def test_deleted_names_keep_their_versions(store):
    history.enable(store)
    _, v = commit_fill(store, "gone", 1, 7, "c")
    store.commit("d", {}, deletes=["gone"])
    store.gc()
    kept, _ = history.versions(store, "gone")
    assert [(k.version, k.current) for k in kept] == [(v, False)]
    assert bytes_of(store, history.fetch(store, "gone", v))[0] == 7
    assert history.prune(store, 0) == [(v, "gone")]


def test_version_cap_drops_oldest_small_values(store):
    """Small values cost next to nothing, yet a session that rebinds a counter every cell must not keep an
    unbounded number of versions: at most MAX superseded versions stay, oldest dropped first."""
    history.enable(store)
    vers = [store.commit("c%d" % i, {"step": (b"%d" % i, [], [])})["step"] for i in range(30)]
    store.commit("o", {"other": (b"x", [], [])})
    assert history.prune(store, 1 << 30, max_kept=10) == [(v, "step") for v in vers[:19]]
    kept, dropped = history.versions(store)
    assert [k.version for k in kept if k.name == "step"] == vers[19:]
    assert len(dropped) == 19
    assert history.fetch(store, "step", vers[25])[1] == b"25"


def test_full_pool_drops_history_before_failing_a_save(store, runtime_dir, redis_url, session, pool_path):
    """The fixture's pool holds 32 regions: a version of 8 regions, fully rewritten each time, fills it with
    history after four commits; the fifth save (by another process, as a worker's is) drops the kept old
    versions instead of failing with PoolFullError (before: PoolFullError)."""
    history.enable(store)
    vers = [commit_fill(store, "w", 8, 40 + i, "c%d" % i)[1] for i in range(4)]
    store.gc()
    assert store.stats()["regions_used"] == 32
    other = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path, reserve_bytes=0)
    try:
        _, v5 = commit_fill(other, "w", 8, 50, "c5")
    finally:
        other.close()
    kept, dropped = history.versions(store, "w")
    # Only as many as the save needs go, the oldest first (8 regions: the first version); the version
    # current while the save ran stays (the save superseded it only at its commit).
    assert [k.version for k in kept] == vers[1:] + [v5], (kept, dropped)
    assert [(d[0], d[3]) for d in dropped] == [(vers[0], "pool")]
    assert bytes_of(store, history.fetch(store, "w", v5))[0] == 50
    assert bytes_of(store, history.fetch(store, "w", vers[3]))[0] == 43
    with pytest.raises(history.HistoryError, match="dropped from the history at .* full pool"):
        history.fetch(store, "w", vers[0])


def test_big_commits_keep_only_payload_versions(store):
    """A commit of more than LL_HISTORY_SMALL_MAX (64) names keeps only the versions that have payloads."""
    history.enable(store)
    writes = {"s%d" % i: (b"%d" % i, [], []) for i in range(100)}
    writes["arr"] = (b"a", [store.put_payload(np.ones(10, np.uint8))], [])
    store.commit("big", writes)
    kept, _ = history.versions(store)
    assert [k.name for k in kept] == ["arr"]
    store.commit("small", {"s1": (b"x", [], [])})
    assert [k.name for k in history.versions(store)[0]] == ["arr", "s1"]


def _owner(tmp_path, name, **kw):
    """A Store that owns its redis-server, as a kernel's does (its idle hook runs on its pool's thread)."""
    d = str(tmp_path / ("rt-" + name))
    return _llstore.Store(d, name, pool_bytes=256 << 20, **kw), d


def _close(*owners):
    for st, d in owners:
        try:
            st.delete_session()
        except _llstore.StoreError:
            pass
        st.close()
        _llstore.stop_redis(d)


def test_save_at_the_cap_drops_the_oldest_versions_it_needs(tmp_path, monkeypatch):
    """A user near the cap with the history on still saves new values: a save the cap refuses drops the
    session's oldest kept versions, only as many as it needs, reclaims their regions and takes them (without
    counting them twice); the dropped ones say why.  Cap 40 MiB (20 regions), a 6-region value saved four
    times: the fourth save needs 4 regions more than the cap leaves, and the first version (6) gives them."""
    monkeypatch.setenv("LL_STORE_LEDGER", str(tmp_path / "ledger"))
    monkeypatch.setenv("LL_STORE_USER_CAP", "40M")
    k = _owner(tmp_path, "hc", reserve_bytes=0)
    st = k[0]
    try:
        history.enable(st)
        vers = [commit_fill(st, "w", 6, 60 + i, "c%d" % i)[1] for i in range(4)]
        kept, dropped = history.versions(st, "w")
        assert [v.version for v in kept] == vers[1:], (kept, dropped)
        assert [(d[0], d[3]) for d in dropped] == [(vers[0], "cap")]
        assert bytes_of(st, history.fetch(st, "w", vers[3]))[0] == 63
        assert bytes_of(st, history.fetch(st, "w", vers[1]))[0] == 61
        with pytest.raises(history.HistoryError, match="to make room for a save at your store cap"):
            history.fetch(st, "w", vers[0])
    finally:
        _close(k)


def test_kept_versions_never_fail_a_save_that_fits_without_them(tmp_path, monkeypatch):
    """Two kernels of one user under a 64 MiB cap (hostd's store-cap scenario, history on): the first saves
    40 MiB and deletes it, its history keeping the deleted value; the second's 40 MiB save, which fits once
    that value is gone, meets the cap: the first kernel's idle hook drops the kept version, reclaims its
    regions and gives their memory back to the ledger, so the save goes through (before: StoreQuotaExceeded).
    The first kernel's history says the version was dropped, and why."""
    ledger = str(tmp_path / "ledger")
    monkeypatch.setenv("LL_STORE_LEDGER", ledger)
    monkeypatch.setenv("LL_STORE_USER_CAP", "64M")
    k1 = _owner(tmp_path, "h1")
    k2 = _owner(tmp_path, "h2")
    try:
        history.enable(k1[0])
        _, vx = commit_fill(k1[0], "x", 20, 7, "In[1]")
        k1[0].commit("In[2]", {}, deletes=["x"])
        k1[0].gc()
        assert [v.version for v in history.versions(k1[0], "x")[0]] == [vx]
        ref = k2[0].put_payload(np.ones(20 * R, np.uint8))
        assert ref.nbytes == 20 * R
        k2[0].commit("In[1]", {"y": (b"", [ref], [])})
        kept, dropped = history.versions(k1[0], "x")
        assert kept == [] and [(d[0], d[3]) for d in dropped] == [(vx, "cap")], (kept, dropped)
        # What the kept version held is no longer counted: the user holds about the new value (and the
        # reserves, which stay empty while the cap presses).
        deadline = time.monotonic() + 30
        while k1[0].stats()["regions_used"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert k1[0].stats()["regions_used"] == 0
    finally:
        _close(k1, k2)


def test_making_room_keeps_versions_that_hold_nothing_of_their_own(tmp_path, monkeypatch):
    """A kept version whose regions the current version still uses (an incremental save that changed
    nothing) costs no memory: a save at the cap never drops it for room, nor counts its regions twice; the
    oldest version that does hold memory of its own goes instead.  Cap 40 MiB (20 regions): w (6 regions,
    saved twice unchanged: its first version shares all 6), x twice (6 + 6: the first holds 6 of its own),
    then a 4-region save needs 2 regions."""
    monkeypatch.setenv("LL_STORE_LEDGER", str(tmp_path / "ledger"))
    monkeypatch.setenv("LL_STORE_USER_CAP", "40M")
    k = _owner(tmp_path, "hs", reserve_bytes=0)
    st = k[0]
    try:
        history.enable(st)
        w = np.full(6 * R, 3, np.uint8)
        r1 = st.put_payload(w)
        w1 = st.commit("c1", {"w": (b"w1", [r1], [])})["w"]
        r2 = st.put_payload(w, base=r1)
        assert r2.written == 0
        w2 = st.commit("c2", {"w": (b"w2", [r2], [])})["w"]
        _, x1 = commit_fill(st, "x", 6, 1, "c3")
        _, x2 = commit_fill(st, "x", 6, 2, "c4")
        _, y = commit_fill(st, "y", 4, 5, "c5")
        kept, dropped = history.versions(st)
        assert [(d[1], d[0], d[3]) for d in dropped] == [("x", x1, "cap")], (kept, dropped)
        assert [(v.name, v.version) for v in kept] == [("w", w1), ("w", w2), ("x", x2), ("y", y)]
        assert history.fetch(st, "w", w1)[1] == b"w1"
    finally:
        _close(k)

"""_llstore round trips, incremental puts, atomic commits, leases and bad input.

Each test runs against its own redis-server (conftest) and a 64 MiB pool."""
import gc
import os
import pickle
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest

import _llstore
from llsc_helpers import child_env

R = _llstore.REGION_BYTES


def put_commit(st, name, data, cell="c", blob=b"blob", refs=()):
    ref = st.put_payload(data)
    ver = st.commit(cell, {name: (blob, [ref], list(refs))})
    return ref, ver[name]


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int64", "float32", "float64", "complex64", "bool"])
@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (R // 8 + 3,), (3, R // 4)])
def test_numpy_round_trip(store, dtype, shape):
    rng = np.random.default_rng(1)
    a = (rng.random(shape) * 100).astype(dtype)
    ref, _ = put_commit(store, "a", a)
    assert ref.nbytes == a.nbytes and ref.written == a.nbytes
    assert _llstore.ref_nbytes(ref) == a.nbytes
    (ver, blob, prefs, refs), = store.fetch(["a"]).values()
    assert prefs == [str(ref)] and blob == b"blob" and refs == []
    mv = store.map_payload(prefs[0])
    assert mv.readonly and mv.nbytes == a.nbytes and mv.format == "B"
    b = np.frombuffer(mv, dtype=dtype).reshape(shape)
    assert np.array_equal(a, b)


def test_bytes_bytearray_memoryview(store):
    for obj in (b"hello", bytearray(b"x" * (R + 1)), memoryview(b"abc" * 1000)):
        ref = store.put_payload(obj)
        assert bytes(store.map_payload(ref)) == bytes(obj)


def test_non_contiguous_buffer_is_refused(store):
    a = np.arange(100).reshape(10, 10)[:, ::2]
    with pytest.raises(TypeError, match="C-contiguous"):
        store.put_payload(a)
    with pytest.raises(TypeError):
        store.put_payload(12)


def test_incremental_put_shares_unchanged_regions(store):
    a = np.arange(5 * R // 4, dtype=np.float32)  # 5 regions
    r1 = store.put_payload(a)
    assert r1.written == a.nbytes
    r2 = store.put_payload(a, base=r1)
    assert r2.written == 0 and r2 == r1  # unchanged: same regions, no bytes
    a[R // 4 * 2 + 5] = -1  # dirties region 2 only
    r3 = store.put_payload(a, base=r1)
    assert r3.written == R
    assert np.array_equal(np.frombuffer(store.map_payload(r3), np.float32), a)
    # the base's bytes are untouched
    assert np.frombuffer(store.map_payload(r1), np.float32)[R // 4 * 2 + 5] == R // 4 * 2 + 5
    # a longer payload: the full regions are shared, the new tail is written
    b = np.concatenate([a, np.ones(10, np.float32)])
    r4 = store.put_payload(b, base=r3)
    assert r4.written == 40
    # and longer again: the base's last region differs in length, so it is rewritten
    c = np.concatenate([b, np.ones(10, np.float32)])
    r5 = store.put_payload(c, base=r4)
    assert r5.written == 80
    assert np.array_equal(np.frombuffer(store.map_payload(r5), np.float32), c)
    st = store.stats()
    assert st["bytes_shared"] >= 4 * R


def test_commit_versions_move_forward(store):
    v = store.commit("c1", {"x": (b"1", [], []), "y": (b"1", [], ["x"])})
    assert v == {"x": 1, "y": 1}
    v = store.commit("c2", {"x": (b"2", [], [])}, deletes=["y"])
    assert v == {"x": 2}
    assert store.versions() == {"x": 2}
    assert store.fetch(["y"]) == {}
    v = store.commit("c3", {"y": (b"3", [], [])})
    assert v["y"] == 3  # re-created: still above every earlier version
    assert store.last_commit() == (3, "c3")
    assert store.fetch(["x", "y"]) == {"x": (2, b"2", [], []), "y": (3, b"3", [], [])}


def test_base_versions_conflict_writes_nothing(store):
    store.commit("c1", {"x": (b"1", [], [])})
    with pytest.raises(_llstore.ConflictError, match="'x' is at version 1"):
        store.commit("c2", {"x": (b"2", [], []), "z": (b"z", [], [])}, base_versions={"x": 0})
    with pytest.raises(_llstore.ConflictError):
        store.commit("c2", {"z": (b"z", [], [])}, base_versions={"z": 5})
    assert store.versions() == {"x": 1}
    assert store.commit("c2", {"x": (b"2", [], [])}, base_versions={"x": 1, "new": None}) == {"x": 2}


def test_bad_commit_arguments(store):
    with pytest.raises(TypeError, match="tuple"):
        store.commit("c", {"x": b"blob"})
    with pytest.raises(TypeError, match="bytes-like"):
        store.commit("c", {"x": ("str blob", [], [])})
    with pytest.raises(ValueError, match="not a payload ref"):
        store.commit("c", {"x": (b"", ["nonsense"], [])})
    with pytest.raises(ValueError, match="not a payload ref"):
        store.commit("c", {"x": (b"", ["P1/10/0.1.0,0.1.0"], [])})
    with pytest.raises(ValueError, match="both written and deleted"):
        store.commit("c", {"x": (b"", [], [])}, deletes=["x"])
    with pytest.raises(ValueError, match="empty variable name"):
        store.commit("c", {"": (b"", [], [])})
    with pytest.raises(ValueError, match="not a payload ref"):
        store.map_payload("P1/zz/")
    with pytest.raises(TypeError):
        store.fetch("x")
    assert store.versions() == {}


def test_payload_ref_pickles_as_plain_str(store):
    ref = store.put_payload(b"abc")
    assert isinstance(ref, str)
    back = pickle.loads(pickle.dumps(ref))
    assert type(back) is str and back == ref


def test_mapped_bytes_never_change(store):
    a = np.full(3 * R, 7, np.uint8)
    ref, _ = put_commit(store, "a", a)
    view = np.frombuffer(store.map_payload(ref), np.uint8)
    del ref
    # supersede, reclaim, and fill the whole pool with other bytes
    put_commit(store, "a", np.zeros(R, np.uint8))
    store.gc()
    filled = []
    with pytest.raises(_llstore.PoolFullError):
        while True:
            filled.append(store.put_payload(np.full(R, 9, np.uint8)))
    assert (view == 7).all()
    assert store.stats()["regions_leased"] >= 3


def test_writable_mapping_is_private(store):
    ref, _ = put_commit(store, "a", np.arange(R, dtype=np.uint8))
    w = np.frombuffer(store.map_payload(ref, writable=True), np.uint8)
    assert w.flags.writeable
    w[:] = 1
    again = np.frombuffer(store.map_payload(ref), np.uint8)
    assert np.array_equal(again, np.arange(R, dtype=np.uint8))


def test_superseded_payload_is_reclaimed_once_unmapped(store):
    ref1, _ = put_commit(store, "a", np.ones(2 * R, np.uint8))
    mv = store.map_payload(ref1)
    put_commit(store, "a", np.zeros(2 * R, np.uint8))
    assert store.gc() == 0  # the mapping holds ref1's regions
    del mv
    gc.collect()
    assert store.gc() == 2
    with pytest.raises(_llstore.PayloadGoneError):
        store.map_payload(ref1)
    with pytest.raises(_llstore.PayloadGoneError):
        store.commit("c", {"b": (b"", [ref1], [])})


def test_uncommitted_payload_is_held_until_discarded(store):
    ref = store.put_payload(np.ones(R, np.uint8))
    assert store.gc() == 0
    assert store.stats()["pending"] == 1
    store.discard(ref)
    with pytest.raises(ValueError, match="not pending"):
        store.discard(ref)
    assert store.gc() == 1


def test_commit_releases_pending_and_keeps_payload(store):
    ref = store.put_payload(np.ones(R, np.uint8))
    store.commit("c", {"a": (b"", [ref], [])})
    assert store.stats()["pending"] == 0
    assert store.gc() == 0
    assert bytes(store.map_payload(ref)[:3]) == b"\x01\x01\x01"


def test_fetch_is_atomic_across_names(runtime_dir, redis_url, session, pool_path):
    """A reader never sees half of a cell: a and b are always written together."""
    writer = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path,
                            pool_bytes=16 << 20)
    reader = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path)
    stop = threading.Event()
    errors = []

    def write():
        i = 0
        while not stop.is_set():
            i += 1
            blob = str(i).encode()
            writer.commit("c%d" % i, {"a": (blob, [], []), "b": (blob, [], [])})

    t = threading.Thread(target=write)
    t.start()
    try:
        seen = 0
        while seen < 300:
            got = reader.fetch(["a", "b"])
            if len(got) == 2:
                seen += 1
                if got["a"] != got["b"]:
                    errors.append(got)
    finally:
        stop.set()
        t.join()
    assert not errors
    writer.delete_session()
    writer.close()
    reader.close()


def test_other_process_reads_committed_payload(store, runtime_dir, redis_url, session, pool_path):
    a = np.arange(R, dtype=np.int32)
    put_commit(store, "a", a)
    code = """
import sys, numpy as np, _llstore
st = _llstore.Store(sys.argv[1], sys.argv[2], redis_url=sys.argv[3], pool_path=sys.argv[4])
(v, blob, prefs, refs), = st.fetch(["a"]).values()
print(int(np.frombuffer(st.map_payload(prefs[0]), np.int32).sum()))
st.close()
"""
    out = subprocess.run([sys.executable, "-c", code, runtime_dir, session, redis_url, pool_path],
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == int(a.sum())


def test_store_after_fork_is_refused(store):
    pid = os.fork()
    if pid == 0:  # never return into pytest from the child
        code = 3
        try:
            store.versions()
            code = 1
        except _llstore.StoreError as e:
            code = 0 if "after fork" in str(e) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_closed_store_raises(store):
    store.close()
    store.close()
    with pytest.raises(_llstore.StoreError, match="closed"):
        store.versions()


def test_bad_session_and_pool_arguments(runtime_dir, redis_url):
    with pytest.raises(_llstore.StoreError, match="session id"):
        _llstore.Store(runtime_dir, "a:b", redis_url=redis_url)
    with pytest.raises(ValueError, match="pool_bytes"):
        _llstore.Store(runtime_dir, "s", redis_url=redis_url, pool_bytes=10)
    bogus = os.path.join(runtime_dir, "not-a-pool")
    with open(bogus, "wb") as f:
        f.write(b"x" * 4096)
    os.chmod(bogus, 0o600)
    with pytest.raises(_llstore.StoreError, match="not a LooseLeaf pool"):
        _llstore.Store(runtime_dir, "s2", redis_url=redis_url, pool_path=bogus)


def test_private_redis_is_private(runtime_dir):
    os.chmod(runtime_dir, 0o755)
    sock = _llstore.start_redis(runtime_dir)
    assert stat.S_IMODE(os.stat(runtime_dir).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) & 0o077 == 0
    assert _llstore.start_redis(runtime_dir) == sock  # already running: reused
    assert _llstore.stop_redis(runtime_dir) is True
    assert _llstore.stop_redis(runtime_dir) is False


def test_store_starts_and_stops_its_own_redis(runtime_dir, session, pool_path):
    st = _llstore.Store(runtime_dir, session, pool_path=pool_path, pool_bytes=8 << 20)
    assert st.stats()["redis_owned"]
    st.commit("c", {"x": (b"1", [], [])})
    st.close()
    assert not os.path.exists(os.path.join(runtime_dir, "redis.sock")) or \
        _llstore.stop_redis(runtime_dir) is False


def test_default_pool_is_shared_by_runtime_dir_and_session(runtime_dir, redis_url, session):
    a = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=8 << 20)
    b = _llstore.Store(runtime_dir, session, redis_url=redis_url)
    try:
        pa = a.stats()["pool_path"]
        assert pa == b.stats()["pool_path"] and pa.startswith("/dev/")
        assert stat.S_IMODE(os.stat(pa).st_mode) == 0o600
        ref = a.put_payload(b"shared")
        assert bytes(b.map_payload(ref)) == b"shared"
    finally:
        a.delete_session()
        a.close()
        b.close()
    assert not os.path.exists(pa)


def test_put_with_dirty_regions_shares_the_rest_unhashed(store):
    a = np.zeros(6 * R, np.uint8)
    base = store.put_payload(a)
    a[2 * R + 1] = 5  # region 2 changed
    a[4 * R] = 7      # region 4 changed but not declared: the caller vouched, so it is shared
    r = store.put_payload(a, base=base, dirty=[2, 3])
    assert r.written == R  # region 3 was hashed and found unchanged
    got = np.frombuffer(store.map_payload(r), np.uint8)
    assert got[2 * R + 1] == 5 and got[4 * R] == 0
    assert store.put_payload(a, base=base, dirty=[]).written == 0
    with pytest.raises(ValueError, match="out of range"):
        store.put_payload(a, base=base, dirty=[6])
    with pytest.raises(ValueError, match="same length"):
        store.put_payload(a[:-1], base=base, dirty=[0])
    with pytest.raises(ValueError, match="needs a base"):
        store.put_payload(a, dirty=[0])
    with pytest.raises(TypeError):
        store.put_payload(a, base=base, dirty=["x"])


def test_memfd_pool_is_found_by_other_processes(runtime_dir, redis_url, session):
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path="memfd:4k",
                        pool_bytes=8 << 20)
    try:
        share = st.stats()["pool_path"]
        assert share.startswith("/proc/%d/fd/" % os.getpid())
        st.commit("c", {"a": (b"", [st.put_payload(b"in a memfd")], [])})
        code = """
import sys, _llstore
st = _llstore.Store(sys.argv[1], sys.argv[2], redis_url=sys.argv[3])  # no pool_path: Redis knows
(v, blob, prefs, refs), = st.fetch(["a"]).values()
print(bytes(st.map_payload(prefs[0])).decode(), st.stats()["pool_path"])
"""
        out = subprocess.run([sys.executable, "-c", code, runtime_dir, session, redis_url],
                             env=child_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["in", "a", "memfd", share]
    finally:
        st.delete_session()
        st.close()


def test_refs_into_a_vanished_pool_read_as_gone(runtime_dir, redis_url, session, pool_path):
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path,
                        pool_bytes=8 << 20)
    ref = st.put_payload(b"old bytes")
    st.commit("c", {"a": (b"", [ref], [])})
    st.close()
    os.unlink(pool_path)  # e.g. /dev/shm was cleaned; Redis still has the entry
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path,
                        pool_bytes=8 << 20)
    try:
        new = st.put_payload(b"new bytes")  # the new pool reuses region 0, generation 1
        (v, blob, prefs, refs), = st.fetch(["a"]).values()
        assert prefs == [ref]
        with pytest.raises(_llstore.PayloadGoneError, match="another pool"):
            st.map_payload(ref)
        with pytest.raises(_llstore.PayloadGoneError, match="another pool"):
            st.commit("c2", {"b": (b"", [ref], [])})
        assert bytes(st.map_payload(new)) == b"new bytes"
        with pytest.raises(_llstore.StoreError, match="already uses pool"):
            _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path + "x")
    finally:
        st.delete_session()
        st.close()


def test_close_while_another_thread_uses_the_store(store):
    """close() refuses while a call runs without the GIL (no use after free)."""
    a = np.ones(24 * R, np.uint8)
    started = threading.Event()
    errors = []

    def put():
        started.set()
        try:
            for _ in range(3):
                store.discard(store.put_payload(a))
        except _llstore.StoreError as e:
            if "closed" not in str(e):  # closed between two calls: fine
                errors.append(e)
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    t = threading.Thread(target=put)
    t.start()
    started.wait()
    refused = 0
    while t.is_alive():
        try:
            store.close()
            break
        except _llstore.StoreError as e:
            assert "in use" in str(e)
            refused += 1
    t.join()
    assert not errors
    store.close()


def test_rewrites_reuse_reclaimed_prefaulted_regions(store):
    """A steady-state save lands in regions a superseded version freed (no first-touch
    faults), without waiting for the pool to fill up."""
    a = np.zeros(10 * R, np.uint8)
    used = []
    for i in range(6):
        a[:] = i
        ref = store.put_payload(a)
        store.commit("c%d" % i, {"a": (b"", [ref], [])})
        used.append(store.stats()["regions_used"])
    assert max(used) <= 20, used  # the pool has 32: it never filled up
    assert store.stats()["gc_runs"] >= 4
    (v, blob, prefs, refs), = store.fetch(["a"]).values()
    assert (np.frombuffer(store.map_payload(prefs[0]), np.uint8) == 5).all()


def test_prefault_ahead_of_a_save(store):
    store.set_reserve(0)  # no background prefaulting: the counts below are this test's own
    assert store.prefault(5 * R) == 5 * R
    assert store.stats()["regions_prefaulted"] == 5
    ref = store.put_payload(np.ones(5 * R, np.uint8))
    assert store.stats()["regions_prefaulted"] == 5  # the save used the prefaulted regions
    assert store.prefault(1 << 40) == 27 * R  # only what is free
    assert (np.frombuffer(store.map_payload(ref), np.uint8) == 1).all()
    with pytest.raises(OverflowError):
        store.prefault(-1)


def test_reclamation_follows_payloads_through_rewrites_and_deletes(store):
    ra = store.put_payload(np.ones(2 * R, np.uint8))
    rb = store.put_payload(np.ones(3 * R, np.uint8))
    store.commit("c1", {"a": (b"", [ra], []), "b": (b"", [rb], []), "small": (b"s", [], [])})
    assert store.gc() == 0
    store.commit("c2", {"a": (b"now small", [], [])})  # a loses its payload
    assert store.gc() == 2
    store.commit("c3", {"c": (b"", [rb], [])})  # c shares b's payload
    store.commit("c4", {}, deletes=["b"])
    assert store.gc() == 0  # c still uses it
    store.commit("c5", {}, deletes=["c"])
    assert store.gc() == 3
    assert store.stats()["regions_used"] == 0


def _regions(ref):
    return str(ref).split("/")[3].split(",")


def test_rewrite_is_copied_first_and_an_unchanged_region_is_still_shared(store):
    """When sampled regions all changed, a put copies without hashing first; a region that
    turns out unchanged (not among the samples) is shared with the base all the same."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 255, 16 * R, dtype=np.uint8)
    r1 = store.put_payload(a)
    b = a.copy()
    b.reshape(16, R)[:, 7] ^= 1
    b[R:2 * R] = a[R:2 * R]  # region 1 unchanged (the samples are 0, 4, 8, 12)
    r2 = store.put_payload(b, base=r1)
    assert r2.written == 15 * R
    assert _regions(r2)[1] == _regions(r1)[1]
    assert all(_regions(r2)[i] != _regions(r1)[i] for i in range(16) if i != 1)
    assert np.array_equal(np.frombuffer(store.map_payload(r2), np.uint8), b)
    assert np.array_equal(np.frombuffer(store.map_payload(r1), np.uint8), a)
    assert store.stats()["regions_used"] == 31  # the copy of region 1 was given back


def test_copy_first_without_room_falls_back_to_hashing_first(store):
    """Copying every candidate needs room for the unchanged ones too; when the pool lacks it
    the put gives those regions back and writes only what changed."""
    rng = np.random.default_rng(4)
    a = rng.integers(0, 255, 20 * R, dtype=np.uint8)
    r1 = store.put_payload(a)  # 20 of the pool's 32 regions, held (uncommitted)
    b = a.copy()
    changed = [0, 2, 3, 5, 10, 15]  # every sample (0, 5, 10, 15) changed
    for i in changed:
        b[i * R + 11] ^= 0xFF
    r2 = store.put_payload(b, base=r1)
    assert r2.written == len(changed) * R
    assert store.stats()["regions_used"] == 20 + len(changed)
    assert np.array_equal(np.frombuffer(store.map_payload(r2), np.uint8), b)
    # a rewrite that truly does not fit is still a clear error, and leaks nothing
    c = a ^ 1
    with pytest.raises(_llstore.PoolFullError):
        store.put_payload(c, base=r1)
    assert store.stats()["regions_used"] == 20 + len(changed)

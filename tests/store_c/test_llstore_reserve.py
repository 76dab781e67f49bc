"""The pool reserve: free pool space a background thread keeps prefaulted (at idle priority) so a
save after idle time copies at memcpy speed.  It must never hide a full pool, change committed
bytes, or outlive its store.  Each test has its own redis-server (conftest) and a 64 MiB pool."""
import os
import time

import numpy as np
import pytest

import _llstore

R = _llstore.REGION_BYTES


def wait_for(cond, timeout=30.0):
    """Poll COND until true (the reserve thread runs at idle priority: give a busy machine time)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_default_reserve_follows_the_largest_save(store):
    s = store.stats()
    assert s["reserve_bytes"] == 0  # not the session's owner: nothing until it saves
    a = np.full(8 * R, 1, np.uint8)
    ref = store.put_payload(a)
    store.commit("c1", {"a": (b"", [ref], [])})
    assert store.stats()["reserve_bytes"] == 8 * R
    assert wait_for(lambda: store.stats()["reserve_ready_bytes"] >= 8 * R), store.stats()
    s = store.stats()
    assert s["regions_used"] == 8  # reserved regions stay free
    assert s["regions_prefaulted"] == 16
    # the next save of a new variable lands in the reserve: nothing newly prefaulted for it
    store.set_reserve(0)  # (and no refill afterwards, so the count below is the save's own)
    b = np.full(8 * R, 2, np.uint8)
    ref_b = store.put_payload(b)
    assert store.stats()["regions_prefaulted"] == 16
    assert np.array_equal(np.frombuffer(store.map_payload(ref_b), np.uint8), b)
    assert np.array_equal(np.frombuffer(store.map_payload(ref), np.uint8), a)
    # capped at half the pool
    store.set_reserve(None)
    store.discard(ref_b)
    store.put_payload(np.ones(18 * R, np.uint8))
    assert store.stats()["reserve_bytes"] == 16 * R


def test_reserve_never_hides_a_full_pool(runtime_dir, redis_url, session, pool_path):
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=64 << 20,
                        pool_path=pool_path, reserve_bytes=1 << 40)
    try:
        assert st.stats()["reserve_bytes"] == 64 << 20  # at most the pool
        assert wait_for(lambda: st.stats()["regions_prefaulted"] == 32), st.stats()
        a = np.arange(20 * R, dtype=np.uint8)
        st.commit("c1", {"a": (b"a", [st.put_payload(a)], [])})
        with pytest.raises(_llstore.PoolFullError, match="full"):
            st.put_payload(np.ones(20 * R, np.uint8))
        assert st.stats()["regions_used"] == 20  # the failed put gave back what it took
        (v, blob, prefs, refs), = st.fetch(["a"]).values()
        assert v == 1 and np.array_equal(np.frombuffer(st.map_payload(prefs[0]), np.uint8), a)
        ref = st.put_payload(np.ones(12 * R, np.uint8))  # exactly what is left still fits
        assert ref.written == 12 * R
        st.delete_session()
    finally:
        st.close()


def test_reserve_off_and_bad_values(runtime_dir, redis_url, session, pool_path):
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=64 << 20,
                        pool_path=pool_path, reserve_bytes=0)
    try:
        st.put_payload(np.ones(8 * R, np.uint8))
        s = st.stats()
        assert s["reserve_bytes"] == 0 and s["regions_prefaulted"] == 8
        with pytest.raises(ValueError):
            st.set_reserve(-1)
        with pytest.raises(TypeError):
            st.set_reserve("lots")
        st.set_reserve(3 * R + 1)  # rounded up to regions
        assert st.stats()["reserve_bytes"] == 4 * R
        st.delete_session()
    finally:
        st.close()
    with pytest.raises(ValueError):
        _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=64 << 20,
                       pool_path=pool_path, reserve_bytes=-5)


def test_owner_reserves_ahead_of_its_first_save(runtime_dir, session, pool_path):
    st = _llstore.Store(runtime_dir, session, pool_path=pool_path, pool_bytes=64 << 20)
    try:
        assert st.stats()["redis_owned"]
        assert st.stats()["reserve_bytes"] == 16 << 20  # starts small (memory held ahead of use counts)...
        assert wait_for(lambda: st.stats()["reserve_ready_bytes"] == 16 << 20), st.stats()
        # ...and grows with what the session saves, capped at half this pool
        st.commit("c1", {"a": (b"", [st.put_payload(np.ones(24 * R, np.uint8))], [])})
        assert wait_for(lambda: st.stats()["reserve_bytes"] == 32 << 20), st.stats()
        st.delete_session()
    finally:
        st.close()


def test_fork_child_closes_a_store_with_a_reserve(store):
    store.set_reserve(32 << 20)
    pid = os.fork()
    if pid == 0:  # never return into pytest from the child
        code = 3
        try:
            store.close()  # the reserve thread exists only in the parent: nothing to join
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "fork child hung closing the store"
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert wait_for(lambda: store.stats()["reserve_ready_bytes"] == 32 << 20)  # parent's goes on

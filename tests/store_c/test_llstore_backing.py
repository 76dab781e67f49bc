"""A save whose pool memory runs out while its copy threads back fresh regions (ll_pool_back inside the
parallel copy): a clear PoolFullError, nothing committed or held, and the regions it had backed are free
again for the next put.  Needs a small tmpfs of its own (mount, so root); skipped where that is refused."""
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import _llstore

R = _llstore.REGION_BYTES


@pytest.fixture
def tiny_tmpfs():
    d = tempfile.mkdtemp(prefix="llsc-tmpfs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(d)
        pytest.skip("cannot mount a small tmpfs here: %s" % r.stderr.strip())
    yield d
    subprocess.run(["umount", "-l", d], check=True)  # -l: a mapping still open must not fail the test
    shutil.rmtree(d, ignore_errors=True)


def test_backing_failure_during_parallel_copy(runtime_dir, redis_url, session, tiny_tmpfs):
    # a 128 MiB pool (64 regions) on a 16 MiB tmpfs: the regions fit the pool, the memory does not
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=128 << 20,
                        pool_path=os.path.join(tiny_tmpfs, "p.pool"))
    try:
        a = np.arange(2 * R, dtype=np.uint8)
        st.commit("c1", {"a": (b"a", [st.put_payload(a)], [])})
        with pytest.raises(_llstore.PoolFullError, match="cannot back a 2 MiB region of the pool: No space"):
            st.put_payload(np.ones(40 * R, np.uint8))  # > 32 MiB: copied (and backed) on several threads
        assert st.versions() == {"a": 1}
        (v, blob, prefs, refs), = st.fetch(["a"]).values()
        assert np.array_equal(np.frombuffer(st.map_payload(prefs[0]), np.uint8), a)
        # the regions the failed put backed are free again: a put that needs no new memory succeeds
        b = np.full(4 * R, 7, np.uint8)
        ref = st.put_payload(b)
        assert ref.written == 4 * R
        st.commit("c2", {"b": (b"b", [ref], [])})
        (v, blob, prefs, refs), = st.fetch(["b"]).values()
        assert np.array_equal(np.frombuffer(st.map_payload(prefs[0]), np.uint8), b)
        st.delete_session()
    finally:
        st.close()


def test_history_gives_its_memory_to_a_save_the_host_cannot_back(runtime_dir, redis_url, session, tiny_tmpfs):
    """The pool has regions to spare but its tmpfs (the host's memory) has none: kept old versions hold it.
    A save whose regions cannot be backed drops the oldest kept versions, as many as hold the regions it
    lacks, gives their memory back and backs its regions then (before: PoolFullError while old versions
    held the memory).  16 MiB of tmpfs (8 regions): two 3-region versions of w (the first kept as history),
    then a 4-region save needs 2 regions the tmpfs does not have."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "store", "py"))
    from looseleaf_store import history
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=128 << 20,
                        pool_path=os.path.join(tiny_tmpfs, "p.pool"), reserve_bytes=0)
    try:
        history.enable(st)
        vers = [st.commit("c%d" % i, {"w": (b"w", [st.put_payload(np.full(3 * R, i, np.uint8))], [])})["w"]
                for i in range(2)]
        st.gc()
        b = np.full(4 * R, 9, np.uint8)
        ref = st.put_payload(b)
        v3 = st.commit("c3", {"x": (b"x", [ref], [])})["x"]
        kept, dropped = history.versions(st)
        assert [(k.name, k.version) for k in kept] == [("w", vers[1]), ("x", v3)], (kept, dropped)
        assert [(d[0], d[3]) for d in dropped] == [(vers[0], "pool")]
        (v, blob, prefs, refs), = st.fetch(["x"]).values()
        assert np.array_equal(np.frombuffer(st.map_payload(prefs[0]), np.uint8), b)
        st.delete_session()
    finally:
        st.close()

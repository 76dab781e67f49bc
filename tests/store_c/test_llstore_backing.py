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

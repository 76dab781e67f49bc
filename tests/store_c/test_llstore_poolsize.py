"""The payload pool's size (issue 15, item 11): LL_STORE_POOL_BYTES sets it; a new pool file is checked against
the room its file system has (a container's /dev/shm is often 64 MiB, and a sparse pool larger than that would
die of SIGBUS at the first save that reaches past it): a size that does not fit is a clear error at open, the
default shrinks to fit.  The small /dev/shm is a private tmpfs mounted in a mount namespace of the test's own
(unshare -m), skipped where that is not allowed."""
import os
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import os, sys
sys.path.insert(0, os.path.join(%(repo)r, "build", "py"))
import _llstore
rt = %(rt)r
try:
    st = _llstore.Store(rt, "poolsize")
except _llstore.StoreError as e:
    print("ERROR", e)
    _llstore.stop_redis(rt)
    sys.exit(0)
stats = st.stats()
ref = st.put_payload(b"x" * (8 << 20))
st.commit("c", {"v": (b"blob", [ref], [])})
print("OK", stats["pool_bytes"], stats["pool_path"])
st.delete_session()
st.close()
"""


def _in_small_shm(size, env_extra=None):
    with tempfile.TemporaryDirectory(prefix="ll-poolsize-") as rt:
        env = dict(os.environ)
        env.pop("LL_STORE_POOL_BYTES", None)
        env.update(env_extra or {})
        env["LL_STORE_PAGE_KIND"] = "4k"  # a /dev/shm file, whatever the host offers
        code = SCRIPT % {"repo": REPO, "rt": rt}
        cmd = ["unshare", "-m", "sh", "-c",
               'mount -t tmpfs -o size=%s tmpfs /dev/shm && exec "$0" -c "$1"' % size, sys.executable, code]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0 and ("Operation not permitted" in p.stderr or "unshare" in p.stderr):
            pytest.skip("no private mount namespace here: %s" % p.stderr.strip()[:200])
        assert p.returncode == 0, p.stderr
        return p.stdout.strip(), p.stderr


def test_the_default_pool_shrinks_to_a_small_dev_shm_with_a_warning():
    out, err = _in_small_shm("64m")
    assert out.startswith("OK "), (out, err)
    size = int(out.split()[1])
    assert 16 << 20 <= size <= 58 << 20, out
    assert "payload pool sized to" in err and "LL_STORE_POOL_BYTES" in err, err


def test_a_pool_size_that_does_not_fit_is_a_clear_error():
    out, err = _in_small_shm("64m", {"LL_STORE_POOL_BYTES": "1G"})
    assert out.startswith("ERROR"), (out, err)
    assert "do not fit in /dev/shm" in out and "LL_STORE_POOL_BYTES" in out and "--shm-size" in out, out


def test_too_small_a_dev_shm_even_for_the_default_is_a_clear_error():
    out, err = _in_small_shm("12m")
    assert out.startswith("ERROR") and "do not fit" in out, (out, err)


def test_the_knob_sets_the_size_and_is_checked():
    out, err = _in_small_shm("64m", {"LL_STORE_POOL_BYTES": "32M"})
    assert out.startswith("OK ") and int(out.split()[1]) == 32 << 20, (out, err)
    out, err = _in_small_shm("64m", {"LL_STORE_POOL_BYTES": "lots"})
    assert out.startswith("ERROR") and "LL_STORE_POOL_BYTES must be a size" in out, out

"""Kernels of two builds of LooseLeaf never share a host pool (issue 23, part 2): two checkouts, or an upgrade
while a pool runs.  The default runtime dir is per build (as it is per Python environment); a dir both name
(LOOSELEAF_POOL_DIR) is refused by the other build with a message that says so.  "Another build" here is a
copy of the binary with other bytes (one appended: an ELF file runs the same), which is what a build id
tells apart; two plain copies are one build and share."""
import glob
import os
import shutil
import tempfile

import pytest

from zyghelp import LOOSELEAF, Env, PoolClient, DRIVER, stop_pool


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path))
    yield e
    e.close()


def _builds(tmp):
    a = os.path.join(tmp, "a", "looseleaf")
    b = os.path.join(tmp, "b", "looseleaf")
    same = os.path.join(tmp, "same", "looseleaf")
    for p in (a, b, same):
        os.makedirs(os.path.dirname(p))
        shutil.copy2(LOOSELEAF, p)
    with open(b, "ab") as f:
        f.write(b"\0")
    return a, b, same


def _connect(env, pool_dir, exe, xdg=None):
    e = dict(env.environ, LL_POOL_EXE=exe)
    if xdg:
        e["XDG_RUNTIME_DIR"] = xdg
    return PoolClient(DRIVER, pool_dir, ["--slots", "1", "--idle-exit", "60", "--head", "IPython"], env=e)


def test_a_pool_dir_named_by_two_builds_is_refused_by_the_other(env):
    a, b, same = _builds(env.tmp)
    first = _connect(env, env.pool_dir, a)
    try:
        pid = first.stats()["pid"]
        with pytest.raises(AssertionError, match="another build of LooseLeaf"):
            _connect(env, env.pool_dir, b)
        # A copy of the same bytes is the same build: it shares the pool.
        again = _connect(env, env.pool_dir, same)
        assert again.stats()["pid"] == pid
        again.close()
    finally:
        first.close()


def test_two_builds_get_two_default_pools(env):
    a, b, same = _builds(env.tmp)
    xdg = tempfile.mkdtemp(prefix="llx-")  # (short: a socket path has at most 107 bytes)
    ca = _connect(env, "-", a, xdg)
    cb = _connect(env, "-", b, xdg)
    try:
        pa, pb = ca.stats()["pid"], cb.stats()["pid"]
        assert pa != pb
        dirs = sorted(glob.glob(os.path.join(xdg, "looseleaf-pool-*")))
        assert len(dirs) == 2, dirs
        for d in dirs:
            with open(os.path.join(d, "pool.build")) as f:
                assert len(f.read().strip()) == 16
        cs = _connect(env, "-", same, xdg)
        assert cs.stats()["pid"] == pa
        cs.close()
    finally:
        ca.close()
        cb.close()
        for d in glob.glob(os.path.join(xdg, "looseleaf-pool-*")):
            stop_pool(d)
        shutil.rmtree(xdg, ignore_errors=True)

"""Fixtures for the C store's tests: the _llstore extension from build/py, a private
redis-server per test in a short temp dir (unix socket paths are limited to 107 bytes),
and a Store on a small pool that is deleted afterwards."""
import os
import shutil
import sys
import tempfile
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llsc_helpers  # noqa: E402,F401  (puts build/py on sys.path)
import _llstore  # noqa: E402


@pytest.fixture
def runtime_dir():
    d = tempfile.mkdtemp(prefix="llsc-")
    yield d
    _llstore.stop_redis(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def redis_url(runtime_dir):
    sock = _llstore.start_redis(runtime_dir)
    return "unix://" + sock


@pytest.fixture
def session():
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def pool_path(session):
    path = "/dev/shm/llsc-test-%s.pool" % session
    yield path
    if os.path.exists(path):
        os.unlink(path)


@pytest.fixture
def store(runtime_dir, redis_url, session, pool_path):
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_bytes=64 << 20,
                        pool_path=pool_path)
    yield st
    try:
        st.delete_session()
    except _llstore.StoreError:
        pass
    st.close()

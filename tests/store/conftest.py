"""Fixtures for the store's Python tests (run by /usr/bin/python3 -m pytest).

Each test module gets its own private redis-server (started through `_llstore.start_redis` in a temp
runtime dir, stopped at the end); each test its own session id, whose keys and pool file are deleted
afterwards.  `_llstore` is the real C store built at build/py (make all); nothing here fakes it.
"""
import os
import shutil
import sys
import tempfile
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for p in (os.path.join(REPO, "store", "py"), os.path.join(REPO, "build", "py")):
    if p not in sys.path:
        sys.path.insert(0, p)

import _llstore  # noqa: E402

POOL_BYTES = 1 << 30


@pytest.fixture(scope="module")
def runtime_dir():
    d = tempfile.mkdtemp(prefix="ll-store-test-")
    _llstore.start_redis(d)
    yield d
    _llstore.stop_redis(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def session(runtime_dir):
    """A fresh session id; every Store opened on it is closed and the session deleted afterwards."""
    sid = "t" + uuid.uuid4().hex[:12]
    opened = []

    def open_store(pool_bytes=POOL_BYTES, **kw):
        st = _llstore.Store(runtime_dir, sid, pool_bytes=pool_bytes, **kw)
        opened.append(st)
        return st

    open_store.session_id = sid
    yield open_store
    if opened:
        try:
            opened[0].delete_session()
        finally:
            for st in opened:
                st.close()


@pytest.fixture
def store(session):
    return session()

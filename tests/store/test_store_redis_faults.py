"""Redis going away under a Checkpointer: a clear error in the report (never an exception or a SIGPIPE
death), and once Redis is back the same Checkpointer goes on (the C store reconnects)."""
import builtins
import shutil
import tempfile

import _llstore

from looseleaf_store import Checkpointer


def test_redis_down_then_restarted():
    rt = tempfile.mkdtemp(prefix="ll-store-redis-")
    _llstore.start_redis(rt)
    st = _llstore.Store(rt, "redisfault", pool_bytes=64 << 20)
    try:
        ns = {"__name__": "__main__", "__builtins__": builtins}
        cp = Checkpointer(st, ns)
        ns.update(a=[1, 2], b=b"x" * 100)
        rep = cp.save(["a", "b"])
        assert not rep.failed and rep.error is None, rep
        assert _llstore.stop_redis(rt)
        ns["a"].append(3)
        rep = cp.save(["a"])
        assert rep.error and "a" in rep.failed and "redis" in rep.error.lower(), rep
        ns2 = {"__name__": "__main__", "__builtins__": builtins}
        r = Checkpointer(st, ns2).restore(["a"])
        assert "a" in r.failed and "redis" in r.failed["a"].lower(), r
        _llstore.start_redis(rt)  # back (its append-only file kept the commits)
        rep = cp.save(["a"])
        assert not rep.failed and rep.error is None, rep
        r = Checkpointer(st, ns2).restore(["a", "b"])
        assert not r.failed and ns2["a"] == [1, 2, 3] and ns2["b"] == b"x" * 100, r
    finally:
        try:
            st.delete_session()
        finally:
            st.close()
            _llstore.stop_redis(rt)
            shutil.rmtree(rt, ignore_errors=True)


def test_redis_unavailable_is_a_clear_error():
    rt = tempfile.mkdtemp(prefix="ll-store-noredis-")
    try:
        try:
            _llstore.Store(rt, "x", redis_url="unix://%s/nothing.sock" % rt, pool_bytes=8 << 20)
        except _llstore.StoreError as e:
            assert "redis" in str(e).lower() and "nothing.sock" in str(e)
        else:
            raise AssertionError("a Store without Redis must not open")
    finally:
        shutil.rmtree(rt, ignore_errors=True)

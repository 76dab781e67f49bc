"""Faults: a saving process SIGKILLed at each step (LL_STORE_FAULT), a reader killed while
it holds a mapping, Redis restarted or killed mid-session, Redis unavailable, pool full."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import _llstore
from llsc_helpers import child_env

R = _llstore.REGION_BYTES

SAVER = r"""
import sys, numpy as np, _llstore
rd, session, url, pool = sys.argv[1:5]
st = _llstore.Store(rd, session, redis_url=url, pool_path=pool)
a = np.full(2 * _llstore.REGION_BYTES, 2, np.uint8)
b = np.full(2 * _llstore.REGION_BYTES + 7, 2, np.uint8)
ra = st.put_payload(a)
rb = st.put_payload(b)
st.commit("cell-2", {"a": (b"a2", [ra], ["b"]), "b": (b"b2", [rb], [])})
print("committed", flush=True)
"""


def payload_bytes(st, name):
    (ver, blob, prefs, refs), = st.fetch([name]).values()
    return ver, blob, np.frombuffer(st.map_payload(prefs[0]), np.uint8)


@pytest.mark.parametrize("step", ["after_payload", "before_commit", "after_commit"])
def test_saver_killed_at_each_step(store, runtime_dir, redis_url, session, pool_path, step):
    a1 = np.full(2 * R, 1, np.uint8)
    b1 = np.full(R + 3, 1, np.uint8)
    v1 = store.commit("cell-1", {"a": (b"a1", [store.put_payload(a1)], ["b"]),
                                 "b": (b"b1", [store.put_payload(b1)], [])})
    out = subprocess.run([sys.executable, "-c", SAVER, runtime_dir, session, redis_url, pool_path],
                         env=child_env(LL_STORE_FAULT=step), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert "committed" not in out.stdout
    committed = step == "after_commit"
    want = 2 if committed else 1
    vers = store.versions()
    assert vers["a"] == vers["b"] == (v1["a"] + 1 if committed else v1["a"])  # never torn
    va, blob_a, pa = payload_bytes(store, "a")
    vb, blob_b, pb = payload_bytes(store, "b")
    assert (blob_a, blob_b) == ((b"a2", b"b2") if committed else (b"a1", b"b1"))
    assert (pa == want).all() and (pb == want).all()
    assert len(pb) == (2 * R + 7 if committed else R + 3)
    # Reclamation frees what the dead saver left behind (or the superseded version),
    # never a committed region.
    store.gc()
    used = store.stats()["regions_used"]
    assert used == 5 if committed else used == 4
    assert (payload_bytes(store, "a")[2] == want).all()
    # and the session carries on
    v = store.commit("cell-3", {"a": (b"a3", [store.put_payload(a1)], [])},
                     base_versions={"a": va})
    assert v["a"] > va


def test_reader_killed_while_mapping_releases_its_lease(store, runtime_dir, redis_url, session,
                                                         pool_path):
    store.commit("c1", {"a": (b"", [store.put_payload(np.ones(3 * R, np.uint8))], [])})
    reader = subprocess.Popen(
        [sys.executable, "-c", r"""
import sys, numpy as np, _llstore
st = _llstore.Store(*sys.argv[1:3], redis_url=sys.argv[3], pool_path=sys.argv[4])
(v, blob, prefs, refs), = st.fetch(["a"]).values()
view = np.frombuffer(st.map_payload(prefs[0]), np.uint8)
print("mapped", int(view.sum()), flush=True)
sys.stdin.read()
""", runtime_dir, session, redis_url, pool_path], env=child_env(), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().split() == ["mapped", str(3 * R)]
        store.commit("c2", {"a": (b"", [store.put_payload(np.zeros(R, np.uint8))], [])})
        assert store.gc() == 0  # the reader still maps version 1
        reader.kill()
        reader.wait(timeout=30)
        assert store.gc() == 3  # its lease died with it
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()


def test_redis_restarted_mid_session(store, runtime_dir):
    ref = store.put_payload(np.arange(R, dtype=np.uint8))
    store.commit("c1", {"x": (b"x1", [ref], [])})
    assert _llstore.stop_redis(runtime_dir)
    with pytest.raises(_llstore.StoreError, match="Redis"):
        store.versions()
    _llstore.start_redis(runtime_dir)
    assert store.versions() == {"x": 1}  # reconnected; the AOF kept the commit
    assert store.commit("c2", {"y": (b"y", [], [])}) == {"y": 2}
    assert store.stats()["redis_reconnects"] >= 1
    (v, blob, prefs, refs), = store.fetch(["x"]).values()
    assert bytes(store.map_payload(prefs[0])) == bytes(range(256)) * (R // 256)


def test_redis_killed_keeps_acknowledged_commits(store, runtime_dir):
    for i in range(20):
        store.commit("c%d" % i, {"k%d" % i: (b"v", [], [])})
    with open(os.path.join(runtime_dir, "redis.pid")) as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGKILL)
    _llstore.start_redis(runtime_dir)  # reaps the old one when it is our child
    assert len(store.versions()) == 20
    assert store.last_commit() == (20, "c19")


RESTART_CHILD = r"""
import signal, sys, _llstore
signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # as in a C program: SIGPIPE would kill us
st = _llstore.Store(*sys.argv[1:3], redis_url=sys.argv[3], pool_path=sys.argv[4])
st.commit("c1", {"x": (b"1", [], [])})
print("ready", flush=True)
sys.stdin.readline()                            # the parent restarts Redis meanwhile
print(st.commit("c2", {"x": (b"2", [], [])})["x"], flush=True)
"""


def test_no_sigpipe_death_when_redis_restarts(runtime_dir, redis_url, session, pool_path):
    child = subprocess.Popen([sys.executable, "-c", RESTART_CHILD, runtime_dir, session,
                              redis_url, pool_path], env=child_env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        _llstore.stop_redis(runtime_dir)
        _llstore.start_redis(runtime_dir)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "2"
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_redis_unavailable_is_a_clear_error(runtime_dir, session):
    with pytest.raises(_llstore.StoreError,
                       match=r"cannot connect to Redis at unix:///nonexistent/x.sock: No such file"):
        _llstore.Store(runtime_dir, session, redis_url="unix:///nonexistent/x.sock")
    with pytest.raises(_llstore.StoreError, match=r"cannot connect to Redis at redis://127.0.0.1:1"):
        _llstore.Store(runtime_dir, session, redis_url="redis://127.0.0.1:1")
    with pytest.raises(_llstore.StoreError, match="bad Redis URL"):
        _llstore.Store(runtime_dir, session, redis_url="http://x")


def test_redis_that_cannot_start_is_a_clear_error(runtime_dir, session):
    env = dict(os.environ)
    os.environ["LL_REDIS_SERVER"] = "/nonexistent/redis-server"
    try:
        with pytest.raises(_llstore.StoreError, match="cannot start /nonexistent/redis-server"):
            _llstore.Store(runtime_dir, session)
    finally:
        os.environ.clear()
        os.environ.update(env)


def test_pool_full_is_a_clear_error_and_keeps_old_versions(store):
    # the pool has 32 regions
    a = np.arange(10 * R, dtype=np.uint64).view(np.uint8)[: 10 * R]
    store.commit("c1", {"a": (b"a", [store.put_payload(a)], [])})
    with pytest.raises(_llstore.PoolFullError, match="payload pool full"):
        store.put_payload(np.ones(40 * R, np.uint8))
    assert store.versions() == {"a": 1}
    (v, blob, prefs, refs), = store.fetch(["a"]).values()
    assert np.array_equal(np.frombuffer(store.map_payload(prefs[0]), np.uint8), a)
    # the failed put left nothing held: the space comes back by itself
    ref = store.put_payload(np.ones(22 * R, np.uint8))
    assert ref.written == 22 * R
    with pytest.raises(_llstore.PoolFullError):
        store.put_payload(np.ones(R, np.uint8))


def test_concurrent_starters_share_one_redis(runtime_dir):
    code = "import sys, _llstore; print(_llstore.start_redis(sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, runtime_dir], env=child_env(),
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1
    with open(os.path.join(runtime_dir, "redis.pid")) as f:
        pid = int(f.read())
    assert _llstore.stop_redis(runtime_dir)
    # exactly one server ran: no other redis-server holds this directory's AOF
    out = subprocess.run(["pgrep", "-f", "redis-server.*%s" % runtime_dir], capture_output=True,
                         text=True)
    assert out.stdout.split() == [] or out.stdout.split() == [str(pid)]


@pytest.mark.parametrize("fault", ["drop_after_exec", "lose_exec_reply"])
def test_commit_whose_reply_is_lost_lands_exactly_once(store, monkeypatch, fault):
    """The connection drops after EXEC was sent (before Redis ran it, or after): the commit
    record's token tells whether it ran, and a retry never commits the cell twice."""
    ref = store.put_payload(b"payload")
    monkeypatch.setenv("LL_STORE_FAULT", fault)
    v = store.commit("lost-reply", {"a": (b"1", [ref], []), "b": (b"1", [], [])})
    monkeypatch.delenv("LL_STORE_FAULT")
    assert v == {"a": 1, "b": 1}
    assert store.last_commit() == (1, "lost-reply")
    assert store.versions() == {"a": 1, "b": 1}
    assert store.stats()["redis_reconnects"] >= 1
    assert store.stats()["pending"] == 0
    assert store.commit("next", {"a": (b"2", [], [])}) == {"a": 2}

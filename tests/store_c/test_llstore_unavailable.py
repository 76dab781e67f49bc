"""Redis gone or silent under a Store (issue 16, items 1 and 3): the session's owner restarts a killed
redis-server on the same data and reaps the dead one; a stopped one (SIGSTOP) makes a call fail with
StoreUnavailable within the store's timeout instead of hanging, the owner kills and restarts it, and an
interrupt ends any wait at once.  The private server lets in only its ACL user."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import _llstore
from llsc_helpers import child_env


def _redis_pid(runtime_dir):
    with open(os.path.join(runtime_dir, "redis.pid")) as f:
        return int(f.read())


def _state(pid):
    """The process state letter of PID ('Z' for a zombie), or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


@pytest.fixture
def owner(runtime_dir, session, pool_path):
    """A Store that started the private redis-server itself (as the kernel's does)."""
    st = _llstore.Store(runtime_dir, session, pool_path=pool_path, pool_bytes=16 << 20)
    assert st.stats()["redis_owned"]
    yield st
    st.close()


def test_owner_restarts_a_killed_redis_on_the_same_data(owner, runtime_dir):
    owner.commit("c1", {"x": (b"1", [], [])})
    old = _redis_pid(runtime_dir)
    os.kill(old, signal.SIGKILL)
    # The dead server is reaped (no <defunct> stays), a new one serves every acknowledged commit.
    _wait(lambda: _state(old) is None, 10, "the killed redis-server to be reaped")
    assert owner.versions() == {"x": 1}
    assert owner.commit("c2", {"y": (b"2", [], [])}) == {"y": 2}
    assert _redis_pid(runtime_dir) != old


STALLED = r"""
import sys, time, _llstore
st = _llstore.Store(sys.argv[1], sys.argv[2], redis_url=sys.argv[3], pool_path=sys.argv[4])
st.commit("c1", {"x": (b"1", [], [])})
print("ready", flush=True)
sys.stdin.readline()                  # the parent stops Redis meanwhile
t0 = time.monotonic()
try:
    st.versions()
    print("answered", flush=True)
except _llstore.StoreUnavailable as e:
    print("unavailable %.2f %s" % (time.monotonic() - t0, e), flush=True)
except KeyboardInterrupt:
    print("interrupted %.2f" % (time.monotonic() - t0), flush=True)
sys.stdin.readline()                  # Redis runs again
print(st.versions(), flush=True)
"""


def _sigint_as_from_a_terminal():
    # A child inherits an ignored SIGINT (a test process that ran something ignoring it, or a suite started
    # in the background by a shell without job control), and then Python installs no KeyboardInterrupt
    # handler: the interrupt under test would never arrive.  The child starts as a terminal would start it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stalled_child(runtime_dir, session, redis_url, pool_path, **env):
    return subprocess.Popen([sys.executable, "-c", STALLED, runtime_dir, session, redis_url, pool_path],
                            env=child_env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, preexec_fn=_sigint_as_from_a_terminal)


def _tell(child, line="go"):
    child.stdin.write(line + "\n")
    child.stdin.flush()


@pytest.mark.parametrize("how", ["timeout", "interrupt"])
def test_a_stopped_redis_is_a_clear_error_not_a_hang(runtime_dir, redis_url, session, pool_path, how):
    """Not the owner (nobody restarts the server): the call fails at the timeout, or at once on SIGINT."""
    child = _stalled_child(runtime_dir, session, redis_url, pool_path,
                           LL_STORE_TIMEOUT_S="1.5" if how == "timeout" else "60")
    pid = _redis_pid(runtime_dir)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(pid, signal.SIGSTOP)
        _tell(child)
        if how == "interrupt":
            time.sleep(0.3)
            os.kill(child.pid, signal.SIGINT)
        line = child.stdout.readline().split()
        os.kill(pid, signal.SIGCONT)
        if how == "timeout":
            assert line[0] == "unavailable" and 1.4 <= float(line[1]) < 5, line
            assert "did not answer within 1.5 s" in " ".join(line), line
        else:
            assert line[0] == "interrupted" and float(line[1]) < 2, line
        _tell(child)
        assert child.stdout.readline().strip() == "{'x': 1}"
        assert child.wait(timeout=30) == 0
    finally:
        os.kill(pid, signal.SIGCONT)
        if child.poll() is None:
            child.kill()
            child.wait()


OWNER_STALLED = r"""
import sys, time, _llstore
st = _llstore.Store(sys.argv[1], sys.argv[2], pool_path=sys.argv[3], pool_bytes=16 << 20)
st.commit("c1", {"x": (b"1", [], [])})
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
try:
    print("answered %.2f %s" % (time.monotonic() - t0, st.versions()), flush=True)
except _llstore.StoreUnavailable as e:
    print("unavailable %.2f %s" % (time.monotonic() - t0, e), flush=True)
print(st.versions(), flush=True)
st.close()
"""


def test_owner_kills_and_restarts_a_stopped_redis(runtime_dir, session, pool_path):
    """The owner's guard kills a server that stopped answering and starts it again: the call that met
    the stall rode it out or failed as unavailable within the timeout; the next one works."""
    child = subprocess.Popen([sys.executable, "-c", OWNER_STALLED, runtime_dir, session, pool_path],
                             env=child_env(LL_STORE_TIMEOUT_S="2"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        pid = _redis_pid(runtime_dir)
        os.kill(pid, signal.SIGSTOP)
        _tell(child)
        first = child.stdout.readline().split()
        assert first[0] in ("answered", "unavailable") and float(first[1]) < 3.5, first
        assert child.stdout.readline().strip() == "{'x': 1}"
        assert child.wait(timeout=30) == 0
        assert _state(pid) is None, "the stopped redis-server is still there"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_interrupt_fd_ends_a_wait(store, runtime_dir):
    r, w = os.pipe()
    os.set_blocking(r, False)
    store.set_interrupt_fd(r, drain=True)
    os.write(w, b"i")  # from before the call: not for it
    assert store.versions() == {}
    pid = _redis_pid(runtime_dir)
    os.kill(pid, signal.SIGSTOP)
    try:
        threading.Timer(0.3, os.write, (w, b"i")).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match="interrupted while waiting for Redis"):
            store.versions()
        assert time.monotonic() - t0 < 2
    finally:
        os.kill(pid, signal.SIGCONT)
        store.set_interrupt_fd(-1)
        os.close(r)
        os.close(w)
    assert store.versions() == {}


def _raw(sock_path, *commands):
    """Replies (first lines) of COMMANDS sent on a fresh connection without logging in."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock_path)
    out = []
    for cmd in commands:
        parts = cmd.split()
        s.sendall(("*%d\r\n" % len(parts) + "".join("$%d\r\n%s\r\n" % (len(p), p) for p in parts)).encode())
        out.append(s.recv(4096).decode().split("\r\n")[0])
    s.close()
    return out


def test_only_the_acl_user_gets_in(owner, runtime_dir):
    sock = os.path.join(runtime_dir, "redis.sock")
    noauth = _raw(sock, "GET ll:x", "FLUSHALL", "CONFIG GET dir")
    assert all(r.startswith("-NOAUTH") for r in noauth), noauth
    st = os.stat(os.path.join(runtime_dir, "redis.pass"))
    assert st.st_mode & 0o077 == 0
    with open(os.path.join(runtime_dir, "redis.pass")) as f:
        pw = f.read().strip()
    as_user = _raw(sock, "AUTH looseleaf " + pw, "FLUSHALL", "CONFIG GET dir", "DEBUG SLEEP 0",
                   "EVAL return 1 0", "GET other:key", "AUTH default x")
    assert as_user[0] == "+OK", as_user
    # (DEBUG is off in Redis 7 anyway, whoever asks)
    assert all(r.startswith("-NOPERM") or r.startswith("-ERR DEBUG command not allowed")
               for r in as_user[1:6]), as_user
    assert as_user[6].startswith("-WRONGPASS"), as_user

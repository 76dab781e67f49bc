"""A worker on a GPU host other than the kernel's (cluster mode: its agent sets LL_STORE_FOREIGN_HOST) never
makes the session's payload pool anew when the recorded one (the kernel's memfd, /proc/<pid>/fd/<n>) is not
reachable from it: it fails naming the host, and the record still names the kernel's pool.  Without the
variable a Store replaces a vanished pool (a dead kernel's), as before.  No root, no cluster."""
import glob
import os
import socket
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_PY = os.environ.get("LL_TEST_BUILD_PY", os.path.join(REPO, "build", "py"))
PYTHON = "/usr/bin/python3"  # _llstore is built for the build's Python

OPEN = """
import sys
sys.path.insert(0, %r)
import _llstore
try:
    st = _llstore.Store(sys.argv[1], sys.argv[2], redis_url="unix://" + sys.argv[3])
    print("opened", st.stats()["pool_path"])
    if len(sys.argv) > 4:
        st.delete_session()  # (unlinks the pool file it made)
    st.close()
except _llstore.StoreError as e:
    print("error", e)
""" % BUILD_PY


def redis_cmd(sock_path, password, *args):
    """One command on the private redis-server (RESP by hand: no client library needed)."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)

    def send(*a):
        s.sendall(b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in
                                                    (v.encode() if isinstance(v, str) else v for v in a)))
        data = b""
        while not data.endswith(b"\r\n") or (data.startswith(b"$") and data.count(b"\r\n") < 2
                                             and not data.startswith(b"$-1")):
            data += s.recv(65536)
        return data
    assert send("AUTH", "looseleaf", password).startswith(b"+OK")
    out = send(*args)
    s.close()
    return out


@pytest.fixture
def store_dir():
    if not os.path.exists(os.path.join(REPO, "build", "py")):
        pytest.skip("build/py is not built")
    d = tempfile.mkdtemp(prefix="ll-foreign-")
    sys.path.insert(0, BUILD_PY)
    import _llstore
    sock = _llstore.start_redis(d)
    yield d, sock
    _llstore.stop_redis(d)
    subprocess.run(["rm", "-rf", d])
    # A pool a failing run left (made by a build without the guard): this run's session's only.
    for f in glob.glob("/dev/shm/looseleaf-%d-*-s-foreign-%d.pool" % (os.getuid(), os.getpid())):
        os.unlink(f)


def open_store(d, session, sock, delete=False, **env):
    e = dict(os.environ, **env)
    if "LL_STORE_FOREIGN_HOST" not in env:
        e.pop("LL_STORE_FOREIGN_HOST", None)
    r = subprocess.run([PYTHON, "-c", OPEN, d, session, sock] + (["delete"] if delete else []),
                       capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_foreign_host_never_replaces_the_kernels_pool(store_dir):
    d, sock = store_dir
    with open(os.path.join(d, "redis.pass")) as f:
        password = f.readline().strip()
    session = "s-foreign-%d" % os.getpid()
    # The kernel's pool as the record names it: a memfd of the kernel, here of a process long gone.
    record = "/proc/999999999/fd/7 1234abcd"
    assert redis_cmd(sock, password, "SET", "ll:%s:pool" % session, record).startswith(b"+OK")
    out = open_store(d, session, sock, LL_STORE_FOREIGN_HOST="h2")
    assert out.startswith("error") and "not reachable from GPU host h2" in out, out
    assert "moving payloads between hosts is not done yet" in out, out
    assert record.encode() in redis_cmd(sock, password, "GET", "ll:%s:pool" % session)
    # Without it (a process on the kernel's own host), a vanished pool is made anew, as before.
    assert record.encode() in redis_cmd(sock, password, "GET", "ll:%s:pool" % session)
    out = open_store(d, session, sock, delete=True)
    assert out.startswith("opened"), out


TCP = """
import sys
sys.path.insert(0, %r)
import _llstore
try:
    st = _llstore.Store(sys.argv[1], sys.argv[2], redis_url=sys.argv[3])
    st.commit("c1", {"x": (b"blob-x", [], [])})
    print("ok", st.fetch(["x"])["x"][1].decode())
    st.delete_session()
    st.close()
except _llstore.StoreError as e:
    print("error", e)
""" % BUILD_PY


def test_redis_over_tcp_with_the_acl_password(store_dir):
    """How a worker on a GPU host reaches the kernel's private Redis: the cluster pool's forward of its unix
    socket on a TCP address, logged in as its ACL user with the password in the URL, which no message
    repeats."""
    sys.path.insert(0, os.path.join(REPO, "cluster"))
    from looseleaf_cluster.remote import RedisForward
    d, sock = store_dir
    fw = RedisForward(sock, "127.0.0.1")
    try:
        def run(url):
            r = subprocess.run([PYTHON, "-c", TCP, d, "s-tcp-%d" % os.getpid(), url], capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            return r.stdout.strip()
        assert run(fw.url()) == "ok blob-x"
        wrong = fw.url().replace(fw.password, "not-the-password-42")
        out = run(wrong)
        assert out.startswith("error") and "cannot log in" in out, out
        assert "not-the-password-42" not in out and fw.password not in out, out
    finally:
        fw.close()
        for f in glob.glob("/dev/shm/looseleaf-%d-*-s-tcp-%d.pool" % (os.getuid(), os.getpid())):
            os.unlink(f)

"""Helpers of the hostd tests: real OS users (useradd, removed after), a slot broker (`looseleaf hostd`) run
as root on a private socket, and per user a private store (redis) and pool runtime dir, with clients of
that user's pool run as that user (setpriv) through the C client API (build/zygote/ll_zdriver client).

Root only (CI runs as root): the tests skip elsewhere.  Nothing sleeps for a fixed time: every wait polls a
condition with a deadline.
"""
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))

from llpool_util import PoolClient, stop_pool, wait_for  # noqa: E402,F401

PYTHON = os.path.join(REPO, ".venv", "bin", "python")
LIGHT_HEAD = "numpy,IPython,looseleaf_kernel,looseleaf_store"


def usable():
    return os.geteuid() == 0 and shutil.which("useradd") and shutil.which("setpriv")


class Binaries:
    """Copies of build/looseleaf and the driver in a world-readable dir (a rebuild of the tree cannot swap
    them under a running pool; other users may run them)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ll-hostd-bin-")
        os.chmod(self.dir, 0o755)
        self.looseleaf = os.path.join(self.dir, "looseleaf")
        self.driver = os.path.join(self.dir, "ll_zdriver")
        shutil.copy2(os.path.join(REPO, "build", "looseleaf"), self.looseleaf)
        shutil.copy2(os.path.join(REPO, "build", "zygote", "ll_zdriver"), self.driver)

    def close(self):
        shutil.rmtree(self.dir, True)


class User:
    """A test user (made with useradd, removed by close) with a private dir (0700) holding its store and
    pool dir, and its redis-server, started as the user."""

    def __init__(self, name, bins, hostd_socket):
        self.name = name
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        pw = pwd.getpwnam(name)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        self.bins = bins
        self.dir = tempfile.mkdtemp(prefix="ll-hostd-%s-" % name)
        os.chown(self.dir, self.uid, self.gid)
        os.chmod(self.dir, 0o700)
        self.store_dir = os.path.join(self.dir, "store")
        self.pool_dir = os.path.join(self.dir, "pool")
        self.environ = {k: v for k, v in os.environ.items() if not k.startswith(("LOOSELEAF_POOL", "LL_"))}
        self.environ.update(HOME=self.dir, USER=name, LOGNAME=name, IPYTHONDIR=os.path.join(self.dir, "ipy"),
                            LL_POOL_EXE=bins.looseleaf, LL_HOSTD_SOCKET=hostd_socket, TMPDIR=self.dir)
        # redis-server dies with the process that started it (PR_SET_PDEATHSIG): a keeper process of the
        # user's holds it until its stdin closes (close()), then drops the sessions and stops it.
        keeper = ("import sys; sys.path.insert(0, %r); import _llstore\n"
                  "print(_llstore.start_redis(%r), flush=True)\n"
                  "sessions = sys.stdin.read().split()\n"
                  "for s in sessions:\n"
                  "    st = _llstore.Store(%r, s, redis_url='unix://' + _llstore.start_redis(%r))\n"
                  "    st.delete_session(); st.close()\n"
                  "_llstore.stop_redis(%r)\n" % (os.path.join(REPO, "build", "py"), self.store_dir,
                                                 self.store_dir, self.store_dir, self.store_dir))
        self.keeper = subprocess.Popen(self.cmd([PYTHON, "-c", keeper]), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=self.environ, cwd=self.dir)
        self.redis_url = "unix://" + self.keeper.stdout.readline().strip()
        self.clients = []

    def cmd(self, argv):
        return ["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--init-groups"] + list(argv)

    def as_user(self, argv, check=True):
        """Run ARGV as the user; its stdout."""
        r = subprocess.run(self.cmd(argv), env=self.environ, capture_output=True, text=True, cwd=self.dir)
        if check:
            assert r.returncode == 0, (argv, r.stdout, r.stderr)
        return r.stdout

    def client(self, session, slots=2, warm_idle=60):
        c = UserClient(self, session, ["--head", LIGHT_HEAD, "--slots", str(slots), "--idle-exit", "60",
                                       "--warm-idle", str(warm_idle)])
        self.clients.append(c)
        return c

    def log(self):
        try:
            with open(os.path.join(self.pool_dir, "pool.log")) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        try:
            for c in self.clients:
                c.close()
            if os.path.isdir(self.pool_dir):
                stop_pool(self.pool_dir)
            # The sessions' payload pools live in /dev/shm: dropped with their keys, then redis stops.
            try:
                self.keeper.communicate(" ".join(sorted({c.session for c in self.clients})), timeout=30)
            except subprocess.TimeoutExpired:
                self.keeper.kill()
                self.keeper.wait()
        finally:
            shutil.rmtree(self.dir, True)
            try:  # the user's store ledger (a later user may get the same uid)
                os.unlink("/dev/shm/looseleaf-%d-quota" % self.uid)
            except OSError:
                pass
            subprocess.run(["userdel", self.name], check=False, capture_output=True)


class UserClient(PoolClient):
    """A client of USER's pool run as USER (setpriv), running cells of SESSION."""

    def __init__(self, user, session, pool_args):
        import queue
        import threading
        self.user = user
        self.session = session
        self.proc = subprocess.Popen(user.cmd([user.bins.driver, "client", user.pool_dir] + pool_args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=user.environ,
                                     cwd=user.dir)
        self.stray = []
        self.events = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        first = self.next(60)
        assert first["type"] == "connected", first

    def _read(self):
        for line in self.proc.stdout:
            ev = json.loads(line)
            ev["_t"] = time.monotonic()
            self.events.put(ev)
        self.events.put({"type": "eof", "_t": time.monotonic()})

    def submit(self, cid, code, **kw):
        req = dict(op="run", id=cid, session=self.session, code=code, store_dir=self.user.store_dir,
                   redis_url=self.user.redis_url, parent={"msg_id": cid, "msg_type": "execute_request"})
        req.update(kw)
        self.send(**req)

    def collect(self, cid, timeout=120):
        """Events of cell CID up to and including its reply."""
        out = [e for e in self.stray if e.get("id") == cid]  # what came while another cell was collected
        self.stray = [e for e in self.stray if e.get("id") != cid]
        if out and out[-1]["type"] in ("reply", "error"):
            return out
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next(max(0.1, deadline - time.monotonic()))
            if ev.get("id") not in (cid, None):
                self.stray.append(ev)
                continue
            out.append(ev)
            if ev["type"] in ("reply", "error", "eof", "pool_gone"):
                assert ev["type"] == "reply", out
                return out

    def run(self, cid, code, **kw):
        self.submit(cid, code, **kw)
        return self.collect(cid)


def stdout(events):
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")


def reply_ok(events):
    return events[-1]["content"]["status"] == "ok"


def started(events):
    return next(e for e in events if e["type"] == "started")


# A fake CUDA driver (as tests/zygote/test_gpu_slots.py builds one): it counts LL_FAKE_CUDA devices, so the
# broker and the pools lay their slots over GPUs on a machine without any.
FAKE_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
static int count(void) { const char *m = getenv("LL_FAKE_CUDA"); return m ? atoi(m) : 1; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuInit(unsigned flags) { (void) flags; return 0; }
int cuDeviceGetCount(int *n) { *n = count(); return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *name, int len, int d) { snprintf(name, len, "Fake GPU %d", d); return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int d) { *bytes = (size_t) (80 + d) << 30; return 0; }
int cuGetErrorString(int rc, const char **s) { (void) rc; *s = "unknown"; return 0; }
"""


def fake_cuda(bins):
    """The fake driver built into BINS's dir (world-readable: the broker and every user load it)."""
    src = os.path.join(bins.dir, "fakecuda.c")
    lib = os.path.join(bins.dir, "libcuda.so.1")
    if not os.path.exists(lib):
        with open(src, "w") as f:
            f.write(FAKE_DRIVER)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, src], check=True)
        os.chmod(lib, 0o755)
    return lib


class Hostd:
    """`looseleaf hostd` as root on a private socket, NSLOTS slots (or what ARGS say, with ENV added), and
    EXTRA arguments."""

    def __init__(self, bins, nslots=2, args=None, env=None, extra=()):
        self.bins = bins
        self.nslots = nslots
        self.args = (args if args is not None else ["--slots", str(nslots)]) + list(extra)
        self.env = dict(os.environ, **(env or {}))
        self.dir = tempfile.mkdtemp(prefix="ll-hostd-sock-")
        os.chmod(self.dir, 0o755)
        self.socket = os.path.join(self.dir, "hostd.sock")
        self.log_path = os.path.join(self.dir, "hostd.log")
        with socket.socket() as s:  # a free local port for its metrics
            s.bind(("127.0.0.1", 0))
            self.metrics_port = s.getsockname()[1]
        self.proc = None
        self.start()

    def start(self):
        self.logf = open(self.log_path, "a")
        self.proc = subprocess.Popen([self.bins.looseleaf, "hostd", "--socket", self.socket] + self.args +
                                     ["--metrics-port", str(self.metrics_port)],
                                     stdout=self.logf, stderr=self.logf, env=self.env)
        wait_for(lambda: self.stats(check=False), 10, "the broker to answer")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.logf.close()

    def stats(self, check=True):
        """The broker's stats (a frame on its socket), or None when it does not answer and not CHECK."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(self.socket)
                send_frame(s, {"type": "stats"})
                return recv_frame(s)
        except OSError:
            if check:
                raise
            return None

    def http(self, path):
        """(status, body) of GET PATH on its metrics port."""
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.metrics_port, path), timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, True)


def send_frame(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv_frame(sock):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf
    (n,) = struct.unpack(">I", exact(4))
    return json.loads(exact(n))


def user_stats(st, user):
    return next((u for u in st["users"] if u["uid"] == user.uid), None)

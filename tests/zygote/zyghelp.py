"""Helpers of the zygote tests: a private redis-server (the store's), a private pool runtime dir, and clients
that speak to the pool through the C client API (build/zygote/ll_zdriver client: JSON lines in and out).

Each test gets its own store and pool; the pool is stopped (SIGTERM) at teardown and the test waits until it
is gone.  Nothing sleeps for a fixed time: every wait polls a condition with a deadline.
"""
import atexit
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snapshot(path):
    """A private copy of a built binary, so a rebuild of the shared tree during the tests cannot swap it
    under a running pool (the pool re-execs its binary for every zygote)."""
    d = tempfile.mkdtemp(prefix="ll-zyg-bin-")
    atexit.register(shutil.rmtree, d, True)
    dst = os.path.join(d, os.path.basename(path))
    shutil.copy2(path, dst)
    return dst


DRIVER = _snapshot(os.path.join(REPO, "build", "zygote", "ll_zdriver"))
LOOSELEAF = _snapshot(os.path.join(REPO, "build", "looseleaf"))
sys.path.insert(0, os.path.join(REPO, "build", "py"))
sys.path.insert(0, os.path.join(REPO, "store", "py"))

# A light head keeps tests quick; tests that need torch in the zygote ask for it.
LIGHT_HEAD = "numpy,IPython,looseleaf_kernel,looseleaf_store"


def wait_for(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


class Client:
    """One client of the pool (a kernel, as far as the pool can tell)."""

    def __init__(self, env, pool_args):
        self.env = env
        self.proc = subprocess.Popen([DRIVER, "client", env.pool_dir] + pool_args, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env.environ)
        self.events = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        first = self.next(60)
        assert first["type"] == "connected", first

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"type": "eof"})

    def next(self, timeout=60):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no event from the pool within %s s" % timeout)

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def submit(self, cid, code, **kw):
        req = dict(op="run", id=cid, session=self.env.session, code=code, store_dir=self.env.store_dir,
                   redis_url=self.env.redis_url, parent={"msg_id": cid, "msg_type": "execute_request"})
        req.update(kw)
        self.send(**req)

    def collect(self, cid, timeout=120):
        """Events of cell CID up to and including its reply."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next(max(0.1, deadline - time.monotonic()))
            if ev.get("id") not in (cid, None):
                self.env.stray.append(ev)
                continue
            out.append(ev)
            if ev["type"] in ("reply", "error", "eof", "pool_gone"):
                return out

    def run(self, cid, code, **kw):
        self.submit(cid, code, **kw)
        return Cell(self.collect(cid))

    def stats(self):
        self.send(op="stats")
        while True:
            ev = self.next()
            if ev["type"] == "stats":
                return ev
            self.env.stray.append(ev)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cell:
    def __init__(self, events):
        self.events = events
        self.reply = events[-1]
        assert self.reply["type"] == "reply", events
        self.content = self.reply["content"]
        self.ll = self.reply["metadata"].get("looseleaf", {})

    @property
    def stdout(self):
        return "".join(e["text"] for e in self.events if e["type"] == "stream" and e["name"] == "stdout")

    @property
    def stderr(self):
        return "".join(e["text"] for e in self.events if e["type"] == "stream" and e["name"] == "stderr")

    def result(self):
        for e in self.events:
            if e["type"] == "iopub" and e["msg_type"] == "execute_result":
                return e["content"]["data"]["text/plain"]
        return None

    @property
    def ok(self):
        return self.content["status"] == "ok"

    def types(self):
        return [e["type"] for e in self.events]


class Env:
    _count = 0  # sessions made by this process
    def __init__(self, tmp):
        import _llstore
        self.tmp = tmp
        self.store_dir = os.path.join(tmp, "store")
        self.pool_dir = os.path.join(tmp, "pool")
        Env._count += 1
        self.session = "llzyg-%d-%d" % (os.getpid(), Env._count)
        self.redis_url = "unix://" + _llstore.start_redis(self.store_dir)
        self.environ = dict(os.environ)
        self.environ["IPYTHONDIR"] = os.path.join(tmp, "ipython")
        self.environ.pop("LOOSELEAF_POOL_DIR", None)
        # The pool (hence its zygotes) runs as the product binary does: build/looseleaf pool.
        self.environ["LL_POOL_EXE"] = LOOSELEAF
        self.clients = []
        self.stray = []
        self.pool_pid = None

    def client(self, head=LIGHT_HEAD, slots=2, idle_exit=60, extra=()):
        c = Client(self, ["--head", head, "--slots", str(slots), "--idle-exit", str(idle_exit)] + list(extra))
        self.clients.append(c)
        if self.pool_pid is None:
            self.pool_pid = c.stats()["pid"]
        return c

    def log(self):
        try:
            with open(os.path.join(self.pool_dir, "pool.log")) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        import _llstore
        for c in self.clients:
            c.close()
        if self.pool_pid and pid_alive(self.pool_pid):
            os.kill(self.pool_pid, signal.SIGTERM)
            wait_for(lambda: not pid_alive(self.pool_pid), 30, "the pool to exit")
        # The session's payload pool lives in /dev/shm: drop it with the session's keys.
        try:
            st = _llstore.Store(self.store_dir, self.session, redis_url=self.redis_url)
            st.delete_session()
            st.close()
        finally:
            _llstore.stop_redis(self.store_dir)



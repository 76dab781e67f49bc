"""Helpers of the zygote tests: a private redis-server (the store's), a private pool runtime dir, and clients
that speak to the pool through the C client API (build/zygote/ll_zdriver client: llpool_util.PoolClient).

Each test gets its own store and pool; at teardown the pool is stopped (llpool_util.stop_pool: SIGTERM, then
wait until it and its processes are gone).  Nothing sleeps for a fixed time: every wait polls a condition
with a deadline.
"""
import atexit
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))

from llpool_util import PoolClient, stop_pool, wait_for  # noqa: E402,F401
from llpool_util import alive as pid_alive  # noqa: E402,F401  (the tests' name for it)


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


class Client(PoolClient):
    """One client of the pool (a kernel, as far as the pool can tell) that runs cells of ENV's session; events
    that are not the ones waited for go to env.stray."""

    def __init__(self, env, pool_args):
        self.env = env
        super().__init__(DRIVER, env.pool_dir, pool_args, env=env.environ, stray=env.stray)

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
        self.others = []  # further sessions a test ran cells of (other_session), dropped with this one
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

    def other_session(self, suffix):
        """A session besides ENV's own (another kernel's, as far as the pool can tell), dropped at close."""
        name = "%s-%s" % (self.session, suffix)
        self.others.append(name)
        return name

    def log(self):
        try:
            with open(os.path.join(self.pool_dir, "pool.log")) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        import _llstore
        try:
            for c in self.clients:
                c.close()
            stop_pool(self.pool_dir)
        finally:
            # A session's payload pool lives in /dev/shm: drop it with the session's keys.
            try:
                for session in [self.session] + self.others:
                    st = _llstore.Store(self.store_dir, session, redis_url=self.redis_url)
                    st.delete_session()
                    st.close()
            finally:
                _llstore.stop_redis(self.store_dir)



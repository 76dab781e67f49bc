"""Helpers of the edit-time prefetch tests (tests/prefetch/, issue 6): a private host pool with warm workers
whose state the tests read (its `stats` through build/zygote/ll_zdriver, its log), looseleaf kernels on that
pool, and the hint requests a frontend sends while the user edits a cell.

Runs in the pytest process.  Builds on tests/routing/routehelp.py (Kernel, execute, ll_md), put on sys.path
here, and tests/llpool_util.py (the pool client, stopping a pool, wait_for), which routehelp puts there.  Every
wait is a poll with a deadline; nothing sleeps for a fixed time.
"""
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "routing"))

from routehelp import (GPU_TIMEOUT, Kernel, alive, execute, ll_md, pool_pids, send_execute,  # noqa: E402,F401
                       stream_text)
from itest_util import kernel_env  # noqa: E402  (routehelp put tests/integration on sys.path)
from llpool_util import PoolClient, stop_pool, wait_for  # noqa: E402  (and tests/ too)

LOOSELEAF_BIN = os.environ.get("LL_TEST_LOOSELEAF", os.path.join(REPO, "build", "looseleaf"))
DRIVER = os.path.join(REPO, "build", "zygote", "ll_zdriver")

# Pool log lines of a prefetch reaching a worker: a fork for it (cold, speculative) or the session's warm one.
PREFETCH_RE = re.compile(r"pool: (?:cell|prefetch) (pf-\d+): (fork from node \d+|warm worker (\d+)) on slot")


class Pool:
    """A private host pool (own runtime dir, warm workers on, info log) and a client reading its stats.

    The pool is started the way a kernel starts it (build/looseleaf pool, the kernels' environment), so the
    kernels of a test only connect to it.  close() stops it (llpool_util.stop_pool) and removes its dir."""

    def __init__(self, slots=2, env=None):
        env_extra = self.extra_env = dict(env or {})
        self.tmp = tempfile.mkdtemp(prefix="ll-pf-")
        self.dir = os.path.join(self.tmp, "pool")  # the pool makes it (0700)
        env = kernel_env()
        env.update(LOOSELEAF_POOL_DIR=self.dir, LL_POOL_EXE=LOOSELEAF_BIN, LL_POOL_WARM_IDLE_S="300",
                   LL_POOL_SLOTS=str(slots), LOOSELEAF_LOG="info")
        env.update(env_extra)
        self.client = PoolClient(DRIVER, self.dir, env=env)
        # The base zygote imports torch: wait for it, so a test's first hint finds a node to fork from.
        wait_for(lambda: any(n["ready"] for n in self.stats()["nodes"]), 90, "the base zygote to be ready")

    def stats(self):
        return self.client.stats(30)

    def kernel(self, **env):
        """A looseleaf kernel on this pool, with the pool's extra environment (a session's sys.path follows it
        to its workers, so both need the same PYTHONPATH)."""
        return Kernel("looseleaf", env=dict(self.extra_env, LOOSELEAF_POOL_DIR=self.dir, **env))

    def log(self):
        try:
            with open(os.path.join(self.dir, "pool.log")) as f:
                return f.read()
        except OSError:
            return ""

    def prefetches(self):
        """[(prefetch id, warm worker pid or None for a fork)] in the order the pool started them."""
        return [(m.group(1), int(m.group(3)) if m.group(3) else None) for m in PREFETCH_RE.finditer(self.log())]

    def wait_prepared(self, before, what="the prefetch"):
        """Wait for a prefetch started after the first BEFORE (len of prefetches() earlier) to have finished
        preparing its worker (no prefetch run left in flight); returns (prefetch id, stats)."""
        def done():
            started = self.prefetches()[before:]
            if not started:
                return None
            st = self.stats()
            if any(r["id"].startswith("pf-") for r in st["runs"]):
                return None
            return started[-1][0], st
        return wait_for(done, 60, what)

    def workers(self, session=None):
        """The workers holding a slot (stats), of SESSION when given."""
        return [w for w in self.stats()["workers"] if session is None or w["session"] == session]

    def sessions(self):
        return {s["session"] for s in self.stats()["sessions"]}

    def session_of(self, pid):
        """The session of worker PID."""
        return wait_for(lambda: [w["session"] for w in self.workers() if w["pid"] == pid], 10,
                        "worker %d in the pool's stats" % pid)[0]

    def close(self):
        try:
            self.client.close()
            stop_pool(self.dir)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def run_gpu(k, code, timeout=GPU_TIMEOUT, **kw):
    """Run CODE, assert it succeeded on a worker; returns (metadata.looseleaf, stdout)."""
    reply, msgs = execute(k, code, timeout=timeout, **kw)
    assert reply["content"]["status"] == "ok", "%r failed: %s" % (code, reply["content"])
    md = ll_md(reply)
    assert md.get("route") == "gpu", "%r ran on %s: %s" % (code, md.get("route"), md)
    return md, stream_text(msgs)


def run_cpu(k, code, timeout=GPU_TIMEOUT):
    reply, msgs = execute(k, code, timeout=timeout)
    assert reply["content"]["status"] == "ok", "%r failed: %s" % (code, reply["content"])
    assert ll_md(reply).get("route") == "cpu", "%r ran on %s" % (code, ll_md(reply).get("route"))
    return stream_text(msgs)


# ---- hints: what a frontend sends while the user edits a cell ------------------------------------------
def hint_inspect(k, code):
    k.reply(k.send("inspect_request", {"code": code, "cursor_pos": len(code), "detail_level": 0}))


def hint_complete(k, code):
    k.reply(k.send("complete_request", {"code": code, "cursor_pos": len(code)}))


def hint_is_complete(k, code):
    k.reply(k.send("is_complete_request", {"code": code}))


def hint_comm(k, code, comm_id=None):
    """A looseleaf.prefetch comm: opened (its data carries no code), then a message with CODE.
    Comm messages get no reply: sent in order on shell, they are served before anything sent later."""
    import uuid
    comm_id = comm_id or uuid.uuid4().hex
    k.send("comm_open", {"comm_id": comm_id, "target_name": "looseleaf.prefetch", "data": {}})
    k.send("comm_msg", {"comm_id": comm_id, "data": {"code": code}})
    return comm_id


HINTS = {"inspect": hint_inspect, "complete": hint_complete, "is_complete": hint_is_complete, "comm": hint_comm}

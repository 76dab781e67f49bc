"""How the other ways a notebook's kernel can end treat its kept store (README, "Failure model"): a segfault
is a crash like SIGKILL (the store stays, the next kernel of the notebook offers it, `%looseleaf restore`
brings it back); a bare SIGTERM (`kill PID`, `docker stop`, no restart asked for) is a shutdown: the kernel
exits cleanly and removes its store, so the next kernel offers nothing.  (SIGKILL and Restart:
test_route_keep.py; the OOM killer: test_route_oom.py.)"""
import os
import signal
import time

from routehelp import Kernel, _error_text, execute, redis_processes, run_route, send_execute, stream_text, wait_for
from test_route_keep import _at_risk, _env, _keyed_dirs, _pool_files, _stderr


def _bind(k):
    """A GPU cell (the store opens) and a CPU cell, then idle until the CPU cell's value is committed."""
    run_route(k, "import torch\nst = torch.arange(4.)", "gpu")
    run_route(k, "sc = {'a': 1, 'b': 2}", "cpu")  # (flat: a nested one would be "slow to save")
    wait_for(lambda: time.sleep(0.6) or "'sc'" not in _at_risk(k), 60, "the idle commit of sc")
    d, = _keyed_dirs(k.pid)
    return d, _pool_files(d)


def test_segfault_keeps_the_store_for_the_next_kernel(jupyter_env):
    env = _env(LOOSELEAF_KEEP_S="600")
    k1 = Kernel("looseleaf", env=env)
    try:
        d, pool = _bind(k1)
        send_execute(k1, "sc['a'] = 3\nimport ctypes\nctypes.string_at(0)")
        wait_for(lambda: not k1.km.is_alive(), 60, "the kernel to crash")
        status = k1.km.provisioner.process.wait(timeout=30)
        assert status == -signal.SIGSEGV, "the kernel ended with %s, not SIGSEGV" % status
        wait_for(lambda: not redis_processes(d), 30, "its redis-server to go")
        assert os.path.isdir(d) and os.path.exists(pool), "the store went with the crashed kernel"
    finally:
        k1.stop()
    k2 = Kernel("looseleaf", env=env)
    try:
        reply, msgs = execute(k2, "x = 1")
        assert "previous kernel of this notebook died at" in _stderr(msgs), _stderr(msgs)
        reply, msgs = execute(k2, "%looseleaf restore")
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        assert "restored 2 variables from the kernel that died at" in stream_text(msgs), stream_text(msgs)
        reply, msgs = execute(k2, "print(sc, st.tolist())")
        assert stream_text(msgs) == "{'a': 1, 'b': 2} [0.0, 1.0, 2.0, 3.0]\n", stream_text(msgs)
    finally:
        k2.stop()
    wait_for(lambda: not os.path.exists(d) and not os.path.exists(pool), 30, "the store to go at shutdown")


def test_sigterm_is_a_shutdown_and_removes_the_store(jupyter_env):
    env = _env(LOOSELEAF_KEEP_S="600")
    k1 = Kernel("looseleaf", env=env)
    try:
        d, pool = _bind(k1)
        os.kill(k1.pid, signal.SIGTERM)
        wait_for(lambda: not k1.km.is_alive(), 60, "the kernel to exit")
        assert k1.km.provisioner.process.wait(timeout=30) == 0
        wait_for(lambda: not os.path.exists(d) and not os.path.exists(pool), 30, "the store to go")
    finally:
        k1.stop()
    k2 = Kernel("looseleaf", env=env)
    try:
        reply, msgs = execute(k2, "x = 1")
        assert _stderr(msgs) == "", _stderr(msgs)
        reply, msgs = execute(k2, "%looseleaf restore")
        assert reply["content"]["status"] == "error" and "nothing to restore" in _error_text(reply, msgs)
    finally:
        k2.stop()


def test_pool_file_gone_restores_what_has_no_payload(jupyter_env):
    """/dev/shm emptied (a reboot with the store directory on a disk, a cleanup) while the store directory
    stayed: the restore brings back the values without payloads and names the rest, never a tensor read from
    the empty pool put in its place."""
    env = _env(LOOSELEAF_KEEP_S="600")
    k1 = Kernel("looseleaf", env=env)
    try:
        run_route(k1, "import torch\npt = torch.arange(700000.)\npc = 5", "gpu")
        d, = _keyed_dirs(k1.pid)
        pool = _pool_files(d)
        os.kill(k1.pid, signal.SIGKILL)
        wait_for(lambda: not k1.km.is_alive(), 30, "the kernel to die")
        wait_for(lambda: not redis_processes(d), 30, "its redis-server to go")
    finally:
        k1.stop()
    os.unlink(pool)
    k2 = Kernel("looseleaf", env=env)
    try:
        reply, msgs = execute(k2, "%looseleaf restore")
        out = stream_text(msgs)
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        assert "restored 1 variable from the kernel that died at" in out and out.split("\n")[0].endswith(": pc"), out
        assert "could not come back:\n    pt: PayloadGoneError" in out, out
        reply, msgs = execute(k2, "print(pc, 'pt' in globals())")
        assert stream_text(msgs) == "5 False\n", stream_text(msgs)
    finally:
        k2.stop()
    wait_for(lambda: not os.path.exists(d) and not os.path.exists(pool), 30, "the store to go at shutdown")

"""A notebook's session outlives its kernel (keep.py): after a restart or a SIGKILL the next kernel
of the same notebook (JPY_SESSION_NAME, as jupyter_server sets it) offers the kept store once, `%looseleaf
restore` brings back every variable's last committed version, the imports and the process state and names
what could not come back; a restart stays clean until then; a store nobody claims goes after LOOSELEAF_KEEP_S,
its pool file in /dev/shm with it."""
import glob
import os
import re
import signal
import tempfile
import time
import uuid

from routehelp import Kernel, _error_text, execute, redis_processes, run_route, stream_text, wait_for


def _env(**kw):
    # (no background commit: these tests want a value that is still slow to save when the kernel dies)
    env = {"JPY_SESSION_NAME": "/tmp/nb-%s.ipynb" % uuid.uuid4().hex[:8], "LL_HISTORY_BYTES": "auto",
           "LOOSELEAF_SLOW_COMMIT_IDLE_S": "0"}
    env.update(kw)
    return env


def _stderr(msgs):
    return stream_text(msgs, "stderr")


def _kept_dirs():
    """looseleaf-keep-* dirs of this uid where kernels put stores (as routehelp.store_dirs)."""
    out = []
    for base in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm", tempfile.gettempdir()):
        if base and os.path.isdir(base):
            out += glob.glob(os.path.join(base, "looseleaf-keep-*"))
    return out


def _keyed_dirs(pid):
    """Store dirs owned by kernel PID that are kept for a notebook."""
    out = []
    for d in set(_kept_dirs()):
        try:
            if os.path.exists(os.path.join(d, "notebook")) and \
                    open(os.path.join(d, "owner")).read().split()[0] == str(pid):
                out.append(d)
        except (OSError, IndexError):
            pass
    return out


def _pool_files(d):
    with open(os.path.join(d, "pool")) as f:
        return f.read().strip()


def _session(k):
    """A GPU cell, a CPU value, an import, a generator, a chdir: then wait until the idle commit took them."""
    run_route(k, "import torch\nimport numpy as np\nkw = torch.arange(6.) * 2\nkn = np.ones(3)", "gpu")
    run_route(k, "kc = {'a': 1}\nkg = (i for i in range(3))\nkbig = np.ones(3_000_000)\nimport os\n"
                 "os.environ['KEEP_T'] = 'yes'", "cpu")
    # (each poll is a cell: give the kernel the idle time its idle commit waits for)
    wait_for(lambda: time.sleep(0.6) or "kc" not in _at_risk(k), 60, "the idle commit of kc")
    # What would not survive a crash now: said by %looseleaf.
    reply, msgs = execute(k, "%looseleaf")
    text = stream_text(msgs)
    assert "Would not survive a crash" in text and "- kg: a generator: no store can hold it" in text, text
    assert "- kbig: slow to save, never committed" in text and "- kc:" not in text, text


def _at_risk(k):
    reply, msgs = execute(k, "print(sorted(get_ipython().run_line_magic('looseleaf', '--json')['at_risk']))")
    assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
    return stream_text(msgs)


def _check_restored(k, reply, msgs):
    out = stream_text(msgs)
    assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
    m = re.search(r"restored \d+ variables? from the kernel that (died|was restarted) at [\d:]+: (.*)", out)
    assert m, out
    assert {"kw", "kn", "kc"} <= set(m.group(2).split(", ")), out
    assert "import torch" in out and "import numpy as np" in out, out
    assert "could not come back" in out and "kg: a generator" in out and "kbig: slow to save" in out, out
    reply, msgs = run_route(k, "print(kc, kn.sum(), np.__name__, os.environ.get('KEEP_T'))", "cpu")
    assert stream_text(msgs) == "{'a': 1} 3.0 numpy yes\n", stream_text(msgs)
    reply, msgs = run_route(k, "print(kw.tolist())", "gpu")
    assert stream_text(msgs) == "[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]\n", stream_text(msgs)


def test_restart_is_clean_then_restore_brings_the_session_back(jupyter_env):
    k = Kernel("looseleaf", env=_env())
    try:
        _session(k)
        old = _keyed_dirs(k.pid)
        assert len(old) == 1, store_dirs()
        k.km.restart_kernel(now=False)
        k.connect()
        # Clean: nothing came back by itself; the first reply offers the kept store, once.
        reply, msgs = execute(k, "print('kc' in dir())")
        assert stream_text(msgs) == "False\n"
        assert "was restarted" in _stderr(msgs) and "%looseleaf restore" in _stderr(msgs), _stderr(msgs)
        reply, msgs = execute(k, "x = 1")
        assert _stderr(msgs) == ""
        reply, msgs = execute(k, "%looseleaf restore")
        _check_restored(k, reply, msgs)
        # The new kernel adopted the store: the old directory is its own now (the history goes on), and a
        # second restore has nothing to bring.
        assert _keyed_dirs(k.pid) == old
        reply, msgs = execute(k, "%looseleaf history kw")
        assert re.match(r"kw@\d+  In\[1\]", stream_text(msgs)), stream_text(msgs)
        reply, msgs = execute(k, "%looseleaf restore")
        assert reply["content"]["status"] == "error" and "nothing to restore" in _error_text(reply, msgs)
        pool = _pool_files(old[0])
    finally:
        k.stop()
    # A shutdown (no restart) removes it all.
    wait_for(lambda: not os.path.exists(old[0]) and not os.path.exists(pool), 30, "the store to go")


def test_sigkill_then_new_kernel_restores_and_unclaimed_store_expires(jupyter_env):
    env = _env(LOOSELEAF_KEEP_S="600")
    k1 = Kernel("looseleaf", env=env)
    _session(k1)
    old = _keyed_dirs(k1.pid)
    assert len(old) == 1
    pool = _pool_files(old[0])
    os.kill(k1.pid, signal.SIGKILL)
    wait_for(lambda: not k1.km.is_alive(), 30, "the kernel to die")
    wait_for(lambda: not redis_processes(old[0]), 30, "its redis-server to go")
    assert os.path.exists(old[0]) and os.path.exists(pool)
    k1.stop()
    k2 = Kernel("looseleaf", env=env)
    try:
        reply, msgs = run_route(k2, "import torch\nt2 = torch.ones(2)", "gpu")  # a GPU cell first: offered too
        assert "died at" in _stderr(msgs) and "%looseleaf restore" in _stderr(msgs), _stderr(msgs)
        reply, msgs = execute(k2, "%looseleaf restore")
        _check_restored(k2, reply, msgs)
        # k2 had its own store: the kept one was read into it and removed.
        wait_for(lambda: not os.path.exists(old[0]) and not os.path.exists(pool), 30, "the read store to go")
    finally:
        k2.stop()


def test_unclaimed_store_is_removed_after_its_time(jupyter_env):
    env = _env(LOOSELEAF_KEEP_S="3")
    k = Kernel("looseleaf", env=env)
    run_route(k, "import torch\nut = torch.ones(2)", "gpu")
    d, = _keyed_dirs(k.pid)
    pool = _pool_files(d)
    os.kill(k.pid, signal.SIGKILL)
    wait_for(lambda: not k.km.is_alive(), 30, "the kernel to die")
    k.stop()
    # Its reaper removes it, no other kernel needed.
    wait_for(lambda: not os.path.exists(d) and not os.path.exists(pool), 60, "the unclaimed store to go")
    assert not glob.glob("/dev/shm/looseleaf-%d-keep-*%s*" % (os.getuid(), os.path.basename(pool)[-30:]))


def test_kernelspec_option_restores_at_start(jupyter_env):
    env = _env(LOOSELEAF_RESTORE="1")
    k = Kernel("looseleaf", env=env)
    try:
        _session(k)
        k.km.restart_kernel(now=False)
        k.connect()
        reply, msgs = execute(k, "print(kc)")
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        assert stream_text(msgs) == "{'a': 1}\n"
        assert "restored" in _stderr(msgs) and "kg: a generator" in _stderr(msgs), _stderr(msgs)
        reply, msgs = run_route(k, "print(kw.sum().item())", "gpu")
        assert stream_text(msgs) == "30.0\n"
    finally:
        k.stop()


def test_restore_without_a_notebook_says_why(jupyter_env):
    k = Kernel("looseleaf", env={"JPY_SESSION_NAME": "", "LOOSELEAF_NOTEBOOK": ""})
    try:
        reply, msgs = execute(k, "%looseleaf restore")
        err = _error_text(reply, msgs)
        assert reply["content"]["status"] == "error" and "runs for no known notebook" in err, err
        run_route(k, "import torch\nnt = torch.ones(2)", "gpu")
        reply, msgs = execute(k, "%looseleaf")
        assert "- nt: no store outlives a kernel run for no known notebook" in stream_text(msgs), stream_text(msgs)
    finally:
        k.stop()

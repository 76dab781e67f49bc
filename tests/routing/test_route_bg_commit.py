"""What is slow to save (a big array, a nested container) is committed in the background once the kernel has
been idle LOOSELEAF_SLOW_COMMIT_IDLE_S (coherence.commit_slow, ll_exec.c), so that it survives a crash; a cell
sent meanwhile starts at once (the commit gives way and publishes nothing), so a crash in the middle of it
brings back the version before, whole.  LOOSELEAF_TEST_COMMIT_HOLD holds that commit between the pieces of a
large payload while its file exists, so that the tests catch it there without timing anything."""
import json
import os
import signal
import time

from routehelp import Kernel, _error_text, execute, redis_processes, run_route, stream_text, wait_for
from test_route_keep import _env, _keyed_dirs


def _risk(k):
    """{name: why} of what %looseleaf says would not survive a crash now."""
    reply, msgs = execute(k, "import json as _j\n"
                             "print(_j.dumps(get_ipython().run_line_magic('looseleaf', '--json')['at_risk']))")
    assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
    return json.loads(stream_text(msgs))


def _idle_then_risk(k, idle_s):
    # (each poll is a cell: user code, after which the kernel must stay idle again)
    time.sleep(idle_s)
    return _risk(k)


def _kill(k):
    old = _keyed_dirs(k.pid)
    assert len(old) == 1, old
    os.kill(k.pid, signal.SIGKILL)
    wait_for(lambda: not k.km.is_alive(), 30, "the kernel to die")
    wait_for(lambda: not redis_processes(old[0]), 30, "its redis-server to go")
    k.stop()


def _restore(env):
    k = Kernel("looseleaf", env=env)
    reply, msgs = execute(k, "%looseleaf restore")
    assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
    return k


def test_slow_values_are_committed_when_idle_and_survive_a_sigkill(jupyter_env):
    env = _env(LOOSELEAF_KEEP_S="600", LOOSELEAF_SLOW_COMMIT_IDLE_S="1")
    k = Kernel("looseleaf", env=env)
    try:
        run_route(k, "import torch\nimport numpy as np\nt0 = torch.ones(2)", "gpu")  # the session's store opens
        run_route(k, "big = np.arange(4_000_000, dtype=np.float64)\nnd = {'a': [1, 2], 'b': {'c': 'd'}}", "cpu")
        risk = _risk(k)
        assert "slow to save" in risk["big"] and "slow to save" in risk["nd"], risk
        assert "in the background once the kernel is idle 1 s" in risk["nd"], risk
        wait_for(lambda: not {"big", "nd"} & set(_idle_then_risk(k, 1.5)), 90, "the background commit")
        _kill(k)
    finally:
        k.stop()
    k = _restore(env)
    try:
        reply, msgs = run_route(k, "print(bool((big == np.arange(4_000_000.)).all()), nd)", "cpu")
        assert stream_text(msgs) == "True {'a': [1, 2], 'b': {'c': 'd'}}\n", _error_text(reply, msgs)
    finally:
        k.stop()


def test_a_cell_sent_during_the_background_commit_starts_at_once(jupyter_env, tmp_path):
    hold = str(tmp_path / "hold")
    env = _env(LOOSELEAF_KEEP_S="600", LOOSELEAF_SLOW_COMMIT_IDLE_S="0.5", LOOSELEAF_TEST_COMMIT_HOLD=hold)
    k = Kernel("looseleaf", env=env)
    try:
        run_route(k, "import torch\nimport numpy as np\nt0 = torch.ones(2)", "gpu")
        # 160 MB: three pieces of 64 MiB.  First committed whole (nothing holds it yet).
        run_route(k, "big = np.zeros(20_000_000)", "cpu")
        wait_for(lambda: "big" not in _idle_then_risk(k, 1), 90, "the first background commit")
        # Now its commit holds between the pieces of big, for as long as HOLD exists: a commit that did
        # not give way would keep the next cell waiting until the test's timeout.
        open(hold, "w").close()
        run_route(k, "big += 7", "cpu")
        wait_for(lambda: os.path.exists(hold + ".held"), 60, "the background commit to reach big's pieces")
        reply, msgs = run_route(k, "print(float(big[-1]))", "cpu", timeout=60)
        assert stream_text(msgs) == "7.0\n", _error_text(reply, msgs)
        # It gave way before publishing: the store still holds the version before.
        risk = _risk(k)
        assert "its newest version not committed yet" in risk.get("big", ""), risk
        # Caught in the middle of the next try, the kernel dies: the version before comes back, whole.
        os.unlink(hold + ".held")
        wait_for(lambda: os.path.exists(hold + ".held"), 60, "the background commit to try again")
        _kill(k)
    finally:
        k.stop()
    os.unlink(hold)
    k = _restore(env)
    try:
        reply, msgs = run_route(k, "print(big.shape, float(big.min()), float(big.max()))", "cpu")
        assert stream_text(msgs) == "(20000000,) 0.0 0.0\n", _error_text(reply, msgs)
        # Without the hold, the background commit takes the new value (whole) in the next idle spell (in a
        # restored session that never used the host pool too).
        run_route(k, "big += 9", "cpu")
        wait_for(lambda: "big" not in _idle_then_risk(k, 1), 90, "the background commit")
        _kill(k)
    finally:
        k.stop()
    k = _restore(env)
    try:
        reply, msgs = run_route(k, "print(float(big.min()), float(big.max()))", "cpu")
        assert stream_text(msgs) == "9.0 9.0\n", _error_text(reply, msgs)
    finally:
        k.stop()


def test_nothing_slow_is_committed_before_the_idle_threshold(jupyter_env):
    k = Kernel("looseleaf", env=_env(LOOSELEAF_SLOW_COMMIT_IDLE_S="600"))
    try:
        run_route(k, "import torch\nimport numpy as np\nt0 = torch.ones(2)", "gpu")
        run_route(k, "big = np.arange(4_000_000.)\nnd = {'a': [1, 2]}\nsmall = 3", "cpu")
        # The idle commit takes the quick value; the slow ones wait for 600 s of idleness.
        wait_for(lambda: "small" not in _idle_then_risk(k, 1), 60, "the idle commit of small")
        risk = _idle_then_risk(k, 3)
        for name in ("big", "nd"):
            assert risk.get(name, "").startswith("slow to save, never committed: committed in the background "
                                                 "once the kernel is idle 600 s"), risk
    finally:
        k.stop()


def test_a_subshell_cell_during_the_background_commit_starts_at_once(jupyter_env, tmp_path):
    from test_route_subshells import _control, _sub_run
    hold = str(tmp_path / "hold")
    k = Kernel("looseleaf", env=_env(LOOSELEAF_SLOW_COMMIT_IDLE_S="0.5", LOOSELEAF_TEST_COMMIT_HOLD=hold))
    try:
        sid = _control(k, "create_subshell_request")["subshell_id"]
        run_route(k, "import torch\nimport numpy as np\nt0 = torch.ones(2)", "gpu")
        open(hold, "w").close()
        run_route(k, "big = np.full(20_000_000, 3.0)", "cpu")
        wait_for(lambda: os.path.exists(hold + ".held"), 60, "the background commit to reach big's pieces")
        # The subshell's cell waits for the coherence lock the commit holds: the commit gives way to it.
        assert _sub_run(k, sid, "print(float(big[0]))") == "3.0\n"
        risk = _risk(k)
        assert "never committed" in risk.get("big", ""), risk
        os.unlink(hold)
        wait_for(lambda: "big" not in _idle_then_risk(k, 1), 90, "the background commit")
    finally:
        k.stop()

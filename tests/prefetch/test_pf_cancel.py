"""Interrupt and stop_on_error drop speculative work (issue 6): a worker forked for a hint's prefetch (the
session has no warm worker) is gone from the pool's stats after an interrupt (SIGINT to the kernel) or a
failing cell with stop_on_error, both while it still prepares and after it finished preparing; the session
then runs the cell correctly on a fresh fork."""

import pytest

from pfhelp import alive, execute, hint_is_complete, run_cpu, run_gpu, wait_for


def _spec_session(pool, k, code, state):
    """Hint CODE on kernel K (no warm worker yet), wait until the pool's worker for it is in STATE
    ('preparing' or 'speculative'); returns that worker (stats entry)."""
    sessions = pool.sessions()
    before = len(pool.prefetches())
    hint_is_complete(k, code)
    wait_for(lambda: pool.prefetches()[before:], 30, "the hint's prefetch")
    (session,) = wait_for(lambda: pool.sessions() - sessions, 10, "the kernel's session in the pool")
    (w,) = wait_for(lambda: [w for w in pool.workers(session) if w["state"] == state], 30,
                    "the speculative worker to be %s" % state)
    assert w["cells"] == 0, w
    return w


def _cancel(k, how):
    if how == "interrupt":
        k.km.interrupt_kernel()
    else:
        reply, _ = execute(k, "1/0", stop_on_error=True)
        assert reply["content"]["ename"] == "ZeroDivisionError", reply["content"]


def _gone(pool, pid, timeout):
    try:
        wait_for(lambda: pid not in [w["pid"] for w in pool.workers()] and not alive(pid), timeout,
                 "speculative worker %d to leave the pool" % pid)
    except AssertionError as e:
        raise AssertionError("%s; workers %s; pool log:\n%s" % (e, pool.workers(), pool.log()[-2000:]))


@pytest.mark.parametrize("how,mod", [("interrupt", "pf_slow_a"), ("stop_on_error", "pf_slow_b")])
def test_pf_cancel_while_preparing(pool, how, mod):
    k = pool.kernel()
    try:
        run_cpu(k, "x = 6")
        code = "import %s\nimport torch\nprint(int(torch.ones(4).sum()) * x)" % mod
        w = _spec_session(pool, k, code, "preparing")
        _cancel(k, how)
        _gone(pool, w["pid"], 10)
        md, out = run_gpu(k, code)
        assert out == "24\n"
        assert not md["warm_hit"] and md["worker_pid"] != w["pid"], md
    finally:
        k.stop()


@pytest.mark.parametrize("how", ["interrupt", "stop_on_error"])
def test_pf_cancel_after_prepared(pool, how):
    k = pool.kernel()
    try:
        run_cpu(k, "x = 6")
        w = _spec_session(pool, k, "import torch\nprint(int(torch.ones(4).sum()) * x)", "speculative")
        _cancel(k, how)
        _gone(pool, w["pid"], 6)
    finally:
        k.stop()

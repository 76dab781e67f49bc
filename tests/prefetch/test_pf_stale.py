"""A stale prefetch still gives the correct result (issue 6): the run re-checks versions and completes what
the prefetch missed.  Stale ways: the cell edited after the hint (other code, another closure), a variable
changed or deleted by a CPU cell between the hint and Run; on a warm worker and on a speculative one."""
import pytest

from pfhelp import execute, hint_comm, hint_complete, hint_inspect, hint_is_complete, run_cpu, run_gpu

HINTED = "print(int((w * x).sum()))"


@pytest.fixture(scope="module")
def warm(pool):
    """A kernel whose session has a warm worker; yields (kernel, worker pid).  Its idle commit is off: these
    tests check what the Run commits, which a stalled test process would otherwise let it commit first."""
    k = pool.kernel(LOOSELEAF_IDLE_COMMIT_MS="0")
    run_gpu(k, "import torch\nw = torch.ones(10)\nx = 1")
    md, out = run_gpu(k, HINTED)
    assert out == "10\n" and md["warm_hit"], md
    yield k, md["worker_pid"]
    k.stop()


def _hint_and_wait(pool, k, hint, code):
    before = len(pool.prefetches())
    hint(k, code)
    pool.wait_prepared(before)


def test_pf_cell_edited_after_hint(pool, warm):
    """The hint's cell reads x; the cell that runs was edited to read y (changed by a CPU cell) instead."""
    k, pid = warm
    run_cpu(k, "x = 4\ny = 7")
    _hint_and_wait(pool, k, hint_inspect, HINTED)
    md, out = run_gpu(k, "z = w * 3\nprint(int(z.sum()) + y)")
    assert out == "37\n"
    assert md["warm_hit"] and md["worker_pid"] == pid, md
    assert "y" in md["restored"], "the run restores what the stale prefetch did not: %s" % md
    md, out = run_gpu(k, "print(int(z.sum()), x, y)")
    assert out == "30 4 7\n"


def test_pf_variable_changed_between_hint_and_run(pool, warm):
    k, pid = warm
    run_cpu(k, "x = 2")
    _hint_and_wait(pool, k, hint_complete, HINTED)
    run_cpu(k, "x = 11")
    md, out = run_gpu(k, HINTED)
    assert out == "110\n"
    assert md["warm_hit"] and md["worker_pid"] == pid, md
    assert "x" in md["restored"], "the run re-checked x's version: %s" % md
    assert not md.get("kernel_commit_by_prefetch") and md["kernel_saved"] == ["x"], md


def test_pf_variable_deleted_between_hint_and_run(pool, warm):
    """As in ipykernel: the cell raises NameError, though the prefetch restored x."""
    k, pid = warm
    run_cpu(k, "x = 3")
    _hint_and_wait(pool, k, hint_is_complete, HINTED)
    run_cpu(k, "del x")
    reply, _ = execute(k, HINTED)
    c = reply["content"]
    assert (c["status"], c.get("ename"), c.get("evalue")) == ("error", "NameError", "name 'x' is not defined")
    md, out = run_gpu(k, "x = 5\n" + HINTED)
    assert out == "50\n"


def test_pf_speculative_worker_stale(pool):
    """No warm worker yet: the hint's speculative worker restored x = 3, a CPU cell then set x = 8."""
    k = pool.kernel()
    try:
        run_cpu(k, "x = 3")
        code = "import torch\nprint(int(torch.ones(4).sum()) * x)"
        _hint_and_wait(pool, k, hint_inspect, code)
        run_cpu(k, "x = 8")
        md, out = run_gpu(k, code)
        assert out == "32\n"
        assert md["prepared_by_prefetch"] and "x" in md["restored"], md
    finally:
        k.stop()


def test_pf_run_right_after_its_hint_reuses_the_kernels_commit(pool, warm):
    """Nothing ran in the interpreter between the hint and Run of the same code: the kernel's commit at the
    hint still holds, so the Run makes none (kernel_commit_by_prefetch)."""
    k, pid = warm
    run_cpu(k, "x = 6")
    _hint_and_wait(pool, k, hint_inspect, HINTED)
    md, out = run_gpu(k, HINTED)
    assert out == "60\n"
    assert md["kernel_commit_by_prefetch"] and md["kernel_save_ms"] == 0 and md["restored"] == [], md


def test_pf_run_after_a_prefetch_comm_hint_reuses_the_kernels_commit(pool, warm):
    """Hints on the looseleaf.prefetch comm run no user code: they neither void the prefetch's commit nor
    refresh the kernel's namespace."""
    k, pid = warm
    run_cpu(k, "x = 7")
    before = len(pool.prefetches())
    comm_id = hint_comm(k, HINTED)
    pool.wait_prepared(before)
    # after the prefetch: a message without code (no hint) and the frontend closing its comm
    k.send("comm_msg", {"comm_id": comm_id, "data": {"cursor": 3}})
    k.send("comm_close", {"comm_id": comm_id, "data": {}})
    md, out = run_gpu(k, HINTED)
    assert out == "70\n"
    assert md["kernel_commit_by_prefetch"] and md["kernel_save_ms"] == 0, md


def test_pf_comm_message_between_hint_and_run_commits_again(pool, warm):
    """A comm message runs user code (a widget callback may change variables): the Run commits again."""
    k, pid = warm
    run_cpu(k, "%%cpu\nx = 2\n"
               "def _target(comm, msg):\n"
               "    @comm.on_msg\n"
               "    def _(m):\n"
               "        global x\n"
               "        x = m['content']['data']['x']\n"
               "get_ipython().kernel.comm_manager.register_target('set_x', _target)")
    _hint_and_wait(pool, k, hint_inspect, HINTED)
    k.send("comm_open", {"comm_id": "c-set-x", "target_name": "set_x", "data": {}})
    k.send("comm_msg", {"comm_id": "c-set-x", "data": {"x": 9}})
    md, out = run_gpu(k, HINTED)
    assert out == "90\n", out
    assert not md.get("kernel_commit_by_prefetch") and md["kernel_saved"] == ["x"], md

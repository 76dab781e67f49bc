"""A stale prefetch still gives the correct result (issue 6): the run re-checks versions and completes what
the prefetch missed.  Stale ways: the cell edited after the hint (other code, another closure), a variable
changed or deleted by a CPU cell between the hint and Run; on a warm worker and on a speculative one."""
import pytest

from pfhelp import execute, hint_complete, hint_inspect, hint_is_complete, run_cpu, run_gpu

HINTED = "print(int((w * x).sum()))"


@pytest.fixture(scope="module")
def warm(pool):
    """A kernel whose session has a warm worker; yields (kernel, worker pid)."""
    k = pool.kernel()
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

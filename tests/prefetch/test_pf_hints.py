"""Edit-time prefetch through the real kernel (issue 6): every kind of hint a frontend sends while the user
edits a GPU cell prepares the session's worker before Run.

A warm worker (the session ran a GPU cell) re-checks versions on a hint and restores what a CPU cell changed,
so at Run it restores nothing: `prepared_by_prefetch`, `warm_hit`, the same pid, and the changed variable not in
`restored` (the control test shows a Run without a hint restoring it).  With no warm worker yet, a hint forks
a speculative worker (stats: state speculative) and the Run takes it.  Hints: inspect, complete and is_complete
requests, a looseleaf.prefetch comm (comm_open, then comm_msg), and an execute_request queued behind a CPU cell.
"""
import pytest

from pfhelp import HINTS, hint_comm, ll_md, run_cpu, run_gpu, send_execute

GPU_CELL = "print(int((w * x).sum()))"


@pytest.fixture(scope="module")
def warm(pool):
    """A kernel whose session has a warm worker holding w and x; yields (kernel, worker pid)."""
    k = pool.kernel()
    md, _ = run_gpu(k, "import torch\nw = torch.ones(10)\nx = 1")
    md, out = run_gpu(k, GPU_CELL)
    assert out == "10\n"
    assert md["warm_hit"] and md["stays_warm"], md
    yield k, md["worker_pid"]
    k.stop()


def test_pf_run_without_hint_restores_what_moved(warm):
    """The control: a CPU cell changes x, Run with no hint: the warm worker restores x at Run."""
    k, pid = warm
    run_cpu(k, "x = 2")
    md, out = run_gpu(k, GPU_CELL)
    assert out == "20\n"
    assert md["warm_hit"] and md["worker_pid"] == pid, md
    assert not md["prepared_by_prefetch"], md
    assert "x" in md["restored"], md


@pytest.mark.parametrize("kind", sorted(HINTS))
def test_pf_hint_prepares_warm_worker(pool, warm, kind):
    """The CPU cell changes x and binds a new array; the hint's prefetch restores both into the warm worker
    before Run (the pool's stats count the array's bytes as held by it)."""
    k, pid = warm
    i = sorted(HINTS).index(kind)
    value, name, n = 3 + i, "q_" + kind, 1000 * (i + 1)
    run_cpu(k, "import numpy as np\nx = %d\n%s = np.full(%d, 2.0)" % (value, name, n))
    code = "%s\nprint(int(torch.from_numpy(%s).sum()))" % (GPU_CELL, name)
    (held,) = [w["bytes"] for w in pool.workers() if w["pid"] == pid]
    before = len(pool.prefetches())
    HINTS[kind](k, code)
    pf, st = pool.wait_prepared(before, "the %s hint's prefetch" % kind)
    assert pool.prefetches()[before:] == [(pf, pid)], "one prefetch, on the session's warm worker"
    (w,) = [w for w in st["workers"] if w["pid"] == pid]
    # Prepared for the session's coming cell, it ranks as speculative (a prefetch may not evict it).
    assert w["state"] == "speculative" and w["cells"] >= 1 and w["bytes"] >= held + 8 * n, (held, w)
    md, out = run_gpu(k, code)
    assert out == "%d\n%d\n" % (10 * value, 2 * n)
    assert md["warm_hit"] and md["fork_ms"] == 0 and md["worker_pid"] == pid, md
    assert md["prepared_by_prefetch"], md
    assert not {"x", name} & set(md["restored"]), "the prefetch restored x and %s before Run: %s" % (name, md)


@pytest.mark.parametrize("draft", ["mid-call", "broken last line"])
def test_pf_unfinished_draft_prepares_worker(pool, warm, draft):
    """JupyterLab sends the cell as typed so far: most drafts of a short cell end inside a call and do not
    parse.  Such a draft is analysed with its brackets closed (mid-call), else without its last line, so the
    worker is prepared before Run all the same; the cell that runs is the finished one."""
    k, pid = warm
    name = "dr_" + draft.split()[0].replace("-", "_")
    run_cpu(k, "import numpy as np\nx = 7\n%s = np.full(500, 2.0)" % name)
    code = "%s\nprint(int(torch.from_numpy(%s).sum()))" % (GPU_CELL, name)
    typed = code[:-3] if draft == "mid-call" else "%s\nprint(int(torch.from_numpy(%s).sum()) +" % (GPU_CELL, name)
    before = len(pool.prefetches())
    HINTS["complete"](k, typed)
    pool.wait_prepared(before, "the unfinished draft's prefetch")
    assert [w for _, w in pool.prefetches()[before:]] == [pid], "one prefetch, on the warm worker"
    md, out = run_gpu(k, code)
    assert out == "70\n1000\n"
    assert md["warm_hit"] and md["worker_pid"] == pid and md["prepared_by_prefetch"], md
    assert "x" not in md["restored"], md


def test_pf_queued_execute_prepares_worker(pool, warm):
    """Run-all: a GPU cell already queued on shell when a CPU cell starts gets its worker prepared while that
    cell runs.  (The kernel reads the queue ahead as a CPU cell starts: the first CPU cell here makes sure the
    second one and the GPU cell are both queued by then.)"""
    k, pid = warm
    run_cpu(k, "x = 9")
    before = len(pool.prefetches())
    ids = [send_execute(k, "import time\ntime.sleep(0.5)"), send_execute(k, "time.sleep(1)"),
           send_execute(k, GPU_CELL)]
    for cpu in ids[:2]:
        r = k.reply(cpu, timeout=60)
        assert r["content"]["status"] == "ok" and ll_md(r)["route"] == "cpu", r["content"]
    reply = k.reply(ids[2], timeout=120)
    msgs = k.iopub_until_idle(ids[2], 120)
    assert reply["content"]["status"] == "ok", reply["content"]
    md = ll_md(reply)
    assert md["route"] == "gpu" and md["warm_hit"] and md["worker_pid"] == pid, md
    assert md["prepared_by_prefetch"] and "x" not in md["restored"], md
    assert [w for _, w in pool.prefetches()[before:]] == [pid], "one prefetch, on the warm worker"
    assert "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream") == "90\n"


def test_pf_cold_hint_forks_speculative_worker(pool):
    """The session's first GPU cell: a hint forks and prepares a speculative worker, which Run takes."""
    k = pool.kernel()
    try:
        run_cpu(k, "import numpy as np\nx = 5\nq = np.ones(2000)")
        code = "import torch\nprint(int(torch.from_numpy(q).sum()) * x)"
        sessions = pool.sessions()
        before = len(pool.prefetches())
        comm = hint_comm(k, "print(1)")  # a CPU cell: no prefetch
        k.send("comm_msg", {"comm_id": comm, "data": {"code": code}})
        pf, st = pool.wait_prepared(before, "the comm hint's prefetch")
        assert pool.prefetches()[before:] == [(pf, None)], "one prefetch, forked (no warm worker yet)"
        (session,) = pool.sessions() - sessions
        spec = [w for w in st["workers"] if w["session"] == session]
        assert [(w["state"], w["cells"]) for w in spec] == [("speculative", 0)], st["workers"]
        assert spec[0]["bytes"] >= 16000, "the prefetch restored q (16000 bytes): %s" % spec
        md, out = run_gpu(k, code)
        assert out == "10000\n"
        assert md["warm_hit"] and md["fork_ms"] == 0 and md["worker_pid"] == spec[0]["pid"], md
        assert md["prepared_by_prefetch"] and not {"x", "q"} & set(md["restored"]), md
    finally:
        k.stop()


def test_pf_unchanged_process_state_compares_equal(pool):
    """A Run right after a prefetch commits nothing when nothing changed: the kernel compares its process state
    (cwd, env, sys.path, RNG states) with what it last committed.  Two pickles of one unchanged torch RNG tensor
    differ, so the comparison must not pickle the tensor itself (it did: every Run re-committed the state)."""
    k = pool.kernel()
    try:
        out = run_cpu(k, "%%cpu\nimport torch\nfrom looseleaf_store import procstate\n"
                         "from looseleaf_kernel.coherence import _state_blob\n"
                         "a, b = procstate.capture(), procstate.capture()\n"
                         "print(_state_blob(a) == _state_blob(b))\n"
                         "torch.rand(1)\n"
                         "print(_state_blob(a) == _state_blob(procstate.capture()))")
        assert out == "True\nFalse\n", out
    finally:
        k.stop()

"""Hints are debounced (issue 6): a burst of hints of every kind, each for another closure, sent faster than
LOOSELEAF_PREFETCH_DEBOUNCE_MS (default 250 ms), makes one prefetch, for the latest hint's cell; hints that never
pause still prefetch once LOOSELEAF_PREFETCH_MAX_WAIT_MS (default 1000 ms) passed since the first of them."""
import time
import uuid

from pfhelp import run_cpu, run_gpu, wait_for


def test_pf_burst_of_hints_makes_one_prefetch_latest_wins(pool):
    k = pool.kernel()
    try:
        md, _ = run_gpu(k, "import torch\nw = torch.ones(10)")
        pid = md["worker_pid"]
        run_cpu(k, "\n".join("a%d = %d" % (i, i) for i in range(1, 9)))
        comm = uuid.uuid4().hex
        k.send("comm_open", {"comm_id": comm, "target_name": "looseleaf.prefetch", "data": {}})
        before = len(pool.prefetches())
        kinds = ["complete", "inspect", "comm", "is_complete"] * 2
        for i, kind in enumerate(kinds, 1):
            code = "print(int((w * a%d).sum()))" % i
            if kind == "complete":
                k.send("complete_request", {"code": code, "cursor_pos": len(code)})
            elif kind == "inspect":
                k.send("inspect_request", {"code": code, "cursor_pos": len(code), "detail_level": 0})
            elif kind == "is_complete":
                k.send("is_complete_request", {"code": code})
            else:
                k.send("comm_msg", {"comm_id": comm, "data": {"code": code}})
        pool.wait_prepared(before, "the burst's prefetch")
        md, out = run_gpu(k, "print(int((w * a8).sum()))")
        assert out == "80\n"
        assert md["prepared_by_prefetch"] and md["worker_pid"] == pid, md
        assert "a8" not in md["restored"], "the latest hint's closure was prefetched: %s" % md
        # Every hint was served before the Run, which drops a hint still waiting: the count is final.
        assert [w for _, w in pool.prefetches()[before:]] == [pid], "one prefetch for 8 hints"
        md, out = run_gpu(k, "print(int((w * a1).sum()))")
        assert out == "10\n"
        assert "a1" in md["restored"], "an earlier hint's closure was not prefetched: %s" % md
    finally:
        k.stop()


def test_pf_no_debounce_each_gpu_hint_prefetches_cpu_hints_none(pool):
    """LOOSELEAF_PREFETCH_DEBOUNCE_MS=0: every GPU-labelled hint makes its own prefetch, in order; a hint whose
    cell is a CPU cell makes none."""
    k = pool.kernel(LOOSELEAF_PREFETCH_DEBOUNCE_MS="0")
    try:
        md, _ = run_gpu(k, "import torch\nw = torch.ones(10)")
        pid = md["worker_pid"]
        run_cpu(k, "b1, b2 = 1, 2")
        before = len(pool.prefetches())
        for code in ["b1 + b2", "print(int((w * b1).sum()))", "b2 * 3", "print(int((w * b2).sum()))"]:
            k.reply(k.send("is_complete_request", {"code": code}))
        # The hints' prefetches are sent from the kernel's loop, after their replies, and run in the pool in
        # the background: the Run comes once the pool has started one and none is in flight, for a whole
        # second (on a loaded machine the second hint's may still be on its way when the replies are in).
        settled = []

        def quiet():
            started = pool.prefetches()[before:]
            busy = any(r["id"].startswith("pf-") for r in pool.stats()["runs"])
            settled[:] = settled + [time.monotonic()] if started and not busy else []
            return settled and settled[-1] - settled[0] >= 1.0
        wait_for(quiet, 60, "the GPU hints' prefetches to be prepared")
        md, out = run_gpu(k, "print(int((w * b2).sum()))")
        assert out == "20\n" and md["prepared_by_prefetch"] and "b2" not in md["restored"], md
        # Each GPU hint sends its own prefetch; the second replaces the first, which the pool may not have
        # started yet (then one started, else two); the CPU hints send none (else up to four).
        assert [w for _, w in pool.prefetches()[before:]] in ([pid], [pid, pid]), pool.prefetches()[before:]
    finally:
        k.stop()


def test_pf_hints_that_never_pause_still_prefetch_while_typing(pool):
    """An inspector panel asks at every keystroke: a hint every 100 ms, never the debounce's pause.  The
    first prefetch still starts while the hints keep coming (max wait), and the Run finds its worker
    prepared."""
    k = pool.kernel()
    try:
        md, _ = run_gpu(k, "import torch\nw = torch.ones(10)")
        pid = md["worker_pid"]
        run_cpu(k, "c1 = 3")
        before = len(pool.prefetches())
        code = "print(int((w * c1).sum()))"
        during = None
        for i in range(30):
            typed = code + "  # " + "x" * i
            k.send("inspect_request", {"code": typed, "cursor_pos": len(typed), "detail_level": 0})
            time.sleep(0.1)
            if i == 24:  # 2.5 s in, with 0.5 s of hints still to come
                during = pool.prefetches()[before:]
        assert during, "no prefetch in 2.5 s of hints 100 ms apart"
        pool.wait_prepared(before)
        md, out = run_gpu(k, code)
        assert out == "30\n"
        assert md["prepared_by_prefetch"] and md["worker_pid"] == pid and "c1" not in md["restored"], md
    finally:
        k.stop()

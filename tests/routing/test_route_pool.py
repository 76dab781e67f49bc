"""Several kernels sharing one host pool: each keeps its own variables (same names, alternating GPU cells);
one kernel SIGKILLed while its GPU cell runs takes its worker with it and leaves the other kernel's running
GPU cell and its session undisturbed; with one slot (LL_POOL_SLOTS=1, a pool of the test's own) a second
kernel's GPU cell waits for the slot and the wait is reported."""
import os
import signal

import pytest

from routehelp import (GPU_TIMEOUT, Kernel, alive, execute, ll_md, pool_pids, run_route, send_execute,
                       stop_pool, stream_text, wait_for)

# A GPU cell (forced: the analysis sees no torch use in it) that holds its worker (and slot) until the file
# named by the test exists, printing its pid first.
HOLD = ("%%%%gpu\nimport os, time, torch\nprint('holding', os.getpid(), flush=True)\n"
        "while not os.path.exists(%r):\n    time.sleep(0.02)\n%s")


def _holding_pid(k, msg_id):
    """The pid of K's worker running HOLD (request MSG_ID), once it runs there."""
    msg, _ = k.iopub_next(msg_id, lambda m: m["msg_type"] == "stream" and "holding" in m["content"]["text"],
                          timeout=GPU_TIMEOUT)
    pid = int(msg["content"]["text"].split()[1])
    assert pid != k.pid, "the held cell runs in the kernel, not on a worker"
    return pid


@pytest.fixture
def two(jupyter_env):
    ks = [Kernel("looseleaf"), Kernel("looseleaf")]
    yield ks
    for k in ks:
        k.stop()


def test_kernels_sharing_a_pool_keep_their_own_variables(two):
    a, b = two
    run_route(a, "import torch\nshared = torch.full((2,), 1.0)\nowner = 'a'", "gpu")
    run_route(b, "import torch\nshared = torch.full((2,), 2.0)\nowner = 'b'", "gpu")
    run_route(a, "shared.add_(10)", "gpu")
    _, msgs = run_route(b, "print(shared, owner)", "gpu")
    assert stream_text(msgs) == "tensor([2., 2.]) b\n"
    _, msgs = run_route(a, "print(shared, owner)", "gpu")
    assert stream_text(msgs) == "tensor([11., 11.]) a\n"
    _, msgs = run_route(b, "print(owner)", "cpu")
    assert stream_text(msgs) == "b\n"


def test_kernel_killed_during_gpu_cell_leaves_the_other_alone(two, tmp_path):
    a, b = two
    go = str(tmp_path / "go")
    run_route(b, "import torch\nkept = torch.arange(3)", "gpu")
    a_id = send_execute(a, HOLD % (str(tmp_path / "never"), ""))
    b_id = send_execute(b, HOLD % (go, "kept.add_(1)\nprint(kept)"))
    assert a.pid != b.pid
    a_worker = _holding_pid(a, a_id)
    b_worker = _holding_pid(b, b_id)

    os.kill(a.pid, signal.SIGKILL)
    wait_for(lambda: not alive(a_worker), 30, "the killed kernel's worker %d to be killed" % a_worker)
    assert alive(b_worker)
    open(go, "w").close()
    reply = b.reply(b_id, timeout=GPU_TIMEOUT)
    msgs = b.iopub_until_idle(b_id)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert ll_md(reply)["route"] == "gpu" and ll_md(reply)["worker_pid"] == b_worker
    assert stream_text(msgs).endswith("tensor([1, 2, 3])\n"), stream_text(msgs)
    _, msgs = run_route(b, "print(kept * 2)", "gpu")
    assert stream_text(msgs) == "tensor([2, 4, 6])\n"


def test_slot_wait_is_reported(jupyter_env, tmp_path):
    pool_dir = str(tmp_path / "pool")   # made 0700 by the pool itself
    env = {"LOOSELEAF_POOL_DIR": pool_dir, "LL_POOL_SLOTS": "1"}
    go = str(tmp_path / "go")
    ks = []
    try:
        ks = [Kernel("looseleaf", env=env), Kernel("looseleaf", env=env)]
        a, b = ks
        a_id = send_execute(a, HOLD % (go, "print('a done')"))
        _holding_pid(a, a_id)
        b_id = send_execute(b, "import torch\nprint(torch.ones(1) * 5)")
        # The notice comes while the cell waits (or, if it does not wait, idle comes first).
        first, _ = b.iopub_next(b_id, lambda m: (m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
                                or (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"),
                                timeout=GPU_TIMEOUT)
        open(go, "w").close()
        ra = a.reply(a_id, timeout=GPU_TIMEOUT)
        rb = b.reply(b_id, timeout=GPU_TIMEOUT)
        assert first["msg_type"] == "stream", "b's cell did not wait: %s" % ll_md(rb)
        msgs = [first] + b.iopub_until_idle(b_id)
        assert ra["content"]["status"] == "ok" and rb["content"]["status"] == "ok", (ra["content"], rb["content"])
        assert ll_md(ra)["route"] == "gpu", ll_md(ra)
        notice = stream_text(msgs, "stderr")
        assert notice.startswith("LooseLeaf: every GPU slot is in use (") and notice.count("\n") == 1, notice
        assert stream_text(msgs) == "tensor([5.])\n"
        md = ll_md(rb)
        assert md["route"] == "gpu" and md["wait_ms"] > 0, md
        assert len(pool_pids(pool_dir)) == 1

        # A cell interrupted while it waits for the slot ends at once with KeyboardInterrupt.
        go2 = str(tmp_path / "go2")
        a_id = send_execute(a, HOLD % (go2, ""))
        a_worker = _holding_pid(a, a_id)
        b_id = send_execute(b, "import torch\nwaited = torch.ones(1)")
        b.iopub_next(b_id, lambda m: m["msg_type"] == "stream" and "every GPU slot is in use"
                     in m["content"]["text"], timeout=GPU_TIMEOUT)
        b.km.interrupt_kernel()
        rb = b.reply(b_id, timeout=30)
        assert rb["content"]["ename"] == "KeyboardInterrupt", rb["content"]
        b.iopub_until_idle(b_id)
        assert alive(a_worker)   # b's cell ended while a still held the only slot
        open(go2, "w").close()
        assert a.reply(a_id, timeout=GPU_TIMEOUT)["content"]["status"] == "ok"
        reply, _ = execute(b, "waited")
        assert reply["content"]["ename"] == "NameError", reply["content"]
    finally:
        for k in ks:
            k.stop()
        stop_pool(pool_dir)

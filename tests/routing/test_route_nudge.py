"""jupyter_server's "nudge" while a GPU cell runs (issue 14): a server connecting to a kernel (a new browser tab,
a reconnect) sends kernel_info_request on shell and on control, and repeats it until an iopub message answers;
until then the page shows the kernel as connecting.  Both requests must be answered, with their busy/idle on
iopub, while a GPU cell is still running on a worker, not after it.

"Promptly" is checked by order, not by a clock: the cell sleeps seconds on its worker, and the replies and
their iopub status must all arrive before that cell's execute_reply.  (ipykernel answers the shell request
only after the running cell, so there is no reference comparison here.)
"""
import queue
import time

from routehelp import GPU_TIMEOUT, ll_md, run_route, send_execute


def _collect(k, want, timeout):
    """Messages from shell, control and iopub in arrival order, as (channel, msg), until WANT(got) is true."""
    got = []
    deadline = time.monotonic() + timeout
    while not want(got):
        assert time.monotonic() < deadline, "not all seen within %ss: %s" % (
            timeout, [(c, m["msg_type"], m["parent_header"].get("msg_id")) for c, m in got])
        for channel in ("control", "shell", "iopub"):
            try:
                got.append((channel, getattr(k.kc, "get_%s_msg" % channel)(timeout=0.02)))
            except queue.Empty:
                pass
    return got


def test_kernel_info_on_shell_and_control_answered_while_a_gpu_cell_runs(ll):
    run_route(ll, "import torch\nnu_t = torch.ones(3)", "gpu")
    ll.drain_iopub()
    cell = send_execute(ll, "import time\nprint('started', flush=True)\ntime.sleep(4)\nnu_t = nu_t + 1")
    started = _collect(ll, lambda got: any(c == "iopub" and m["msg_type"] == "stream"
                                           and m["parent_header"].get("msg_id") == cell for c, m in got),
                       GPU_TIMEOUT)
    assert not any(m["msg_type"] == "execute_reply" for _, m in started)

    # The nudge: one kernel_info_request on each channel, at once.
    ids = {}
    for channel in ("shell", "control"):
        msg = ll.kc.session.msg("kernel_info_request", {})
        getattr(ll.kc, channel + "_channel").send(msg)
        ids[channel] = msg["header"]["msg_id"]

    def cell_replied(got):
        return any(c == "shell" and m["parent_header"].get("msg_id") == cell for c, m in got)

    got = _collect(ll, cell_replied, GPU_TIMEOUT)
    order = [(c, m["msg_type"], m["parent_header"].get("msg_id"), m.get("content", {})) for c, m in got]
    end = next(i for i, (c, t, p, _) in enumerate(order) if c == "shell" and p == cell)
    for channel, msg_id in ids.items():
        replies = [i for i, (c, t, p, _) in enumerate(order) if c == channel and p == msg_id]
        assert replies and order[replies[0]][1] == "kernel_info_reply", (channel, order)
        assert replies[0] < end, "the %s kernel_info_reply came only after the GPU cell: %s" % (channel, order)
        assert order[replies[0]][3]["status"] == "ok"
        states = [(i, content["execution_state"]) for i, (c, t, p, content) in enumerate(order)
                  if c == "iopub" and t == "status" and p == msg_id]
        # What the server waits for: iopub answering the nudge, before the cell ends.
        assert [s for _, s in states] == ["busy", "idle"], (channel, order)
        assert states[-1][0] < end, "the %s request's idle came only after the GPU cell: %s" % (channel, order)
    reply = got[end][1]
    assert reply["content"]["status"] == "ok" and ll_md(reply)["route"] == "gpu"

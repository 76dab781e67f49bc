"""Subshells and GPU cells (tests/integration/test_int_subshells.py has the protocol): a subshell's cell
answers while the main shell's GPU cell runs on a worker, sees what earlier GPU cells made (refreshed from
the store), and what it rebinds reaches the next GPU cell.  Order of arrival, never a clock."""
import queue
import time

from routehelp import GPU_TIMEOUT, ll_md, run_route, send_execute, stream_text


def _control(k, msg_type, content=None):
    msg = k.kc.session.msg(msg_type, content or {})
    k.kc.control_channel.send(msg)
    return k.reply(msg["header"]["msg_id"], channel="control")["content"]


def _sub_execute(k, sid, code):
    msg = k.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                               "user_expressions": {}, "allow_stdin": False})
    msg["header"]["subshell_id"] = sid
    k.kc.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def _sub_run(k, sid, code):
    msg_id = _sub_execute(k, sid, code)
    reply = k.reply(msg_id, timeout=GPU_TIMEOUT)
    assert reply["content"]["status"] == "ok", reply["content"]
    return stream_text(k.iopub_until_idle(msg_id))


def _first_replies(k, ids, timeout=GPU_TIMEOUT):
    want, order = set(ids), []
    deadline = time.monotonic() + timeout
    while want:
        assert time.monotonic() < deadline, "no reply to %s" % sorted(want)
        try:
            msg = k.kc.get_shell_msg(timeout=1.0)
        except queue.Empty:
            continue
        mid = msg["parent_header"].get("msg_id")
        if mid in want:
            want.discard(mid)
            order.append((mid, msg))
    return order


def test_subshell_answers_while_a_gpu_cell_runs(ll):
    run_route(ll, "%%gpu\nss_hist = [0.5, 0.4]", "gpu")
    sid = _control(ll, "create_subshell_request")["subshell_id"]
    main = send_execute(ll, "%%gpu\nimport time\nprint('started', flush=True)\ntime.sleep(10)\nss_done = 1")
    ll.iopub_next(main, lambda m: m["msg_type"] == "stream" and "started" in m["content"]["text"],
                  timeout=GPU_TIMEOUT)
    sub = _sub_execute(ll, sid, "print(len(ss_hist))")
    order = _first_replies(ll, [main, sub])
    assert [mid for mid, _ in order] == [sub, main], "the subshell waited for the GPU cell"
    assert order[1][1]["content"]["status"] == "ok"
    assert ll_md(order[1][1])["route"] == "gpu"
    # What the earlier GPU cell made came from the store: the kernel never ran it.
    assert stream_text(ll.iopub_until_idle(sub)) == "2\n"
    _control(ll, "delete_subshell_request", {"subshell_id": sid})


def test_subshell_changes_reach_the_next_gpu_cell(ll):
    sid = _control(ll, "create_subshell_request")["subshell_id"]
    run_route(ll, "%%gpu\nss_made = [1, 2, 3]", "gpu")
    assert _sub_run(ll, sid, "print(sum(ss_made))\nss_set = 41") == "6\n"
    _, msgs = run_route(ll, "%%gpu\nprint(ss_set + 1)", "gpu")
    assert stream_text(msgs) == "42\n"
    _control(ll, "delete_subshell_request", {"subshell_id": sid})


def test_subshell_inspects_a_tensor_while_a_gpu_cell_trains(ll):
    """The issue's case: a long GPU cell trains on its worker while a subshell looks at a tensor that an
    earlier GPU cell made (without a GPU the worker path runs with CPU tensors).  The subshell answers
    first, with the tensor as committed before the running cell, which goes on to finish on its worker."""
    run_route(ll, "%%gpu\nimport torch\nss_w = torch.arange(6, dtype=torch.float32).reshape(2, 3)", "gpu")
    sid = _control(ll, "create_subshell_request")["subshell_id"]
    main = send_execute(ll, "%%gpu\nimport time\nprint('started', flush=True)\nfor _ in range(40):\n"
                            "    ss_w = ss_w * 2\n    time.sleep(0.25)\nss_trained = True")
    ll.iopub_next(main, lambda m: m["msg_type"] == "stream" and "started" in m["content"]["text"],
                  timeout=GPU_TIMEOUT)
    sub = _sub_execute(ll, sid, "print(tuple(ss_w.shape), ss_w.dtype, ss_w.device.type, float(ss_w.sum()))")
    order = _first_replies(ll, [main, sub])
    assert [mid for mid, _ in order] == [sub, main], "the subshell waited for the GPU cell"
    assert order[0][1]["content"]["status"] == "ok", order[0][1]["content"]
    assert order[0][1]["parent_header"]["subshell_id"] == sid
    assert stream_text(ll.iopub_until_idle(sub)) == "(2, 3) torch.float32 cpu 15.0\n"
    assert order[1][1]["content"]["status"] == "ok"
    assert ll_md(order[1][1])["route"] == "gpu"
    # The trained tensor is the committed one from then on, in a subshell as on the main shell.
    assert _sub_run(ll, sid, "print(float(ss_w.sum()), ss_trained)") == "%.1f True\n" % (15.0 * 2 ** 40)
    _control(ll, "delete_subshell_request", {"subshell_id": sid})

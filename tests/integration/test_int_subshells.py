"""Kernel subshells (JEP 91, as ipykernel 7 has them): create/delete/list_subshell_request on control, a
shell request's header.subshell_id naming the subshell that serves it.

Compared with ipykernel 7 (the `python3` kernel) where the two should agree: the replies of the control
requests, the iopub sequence of a subshell's cell and its parent headers, the error reply to an unknown
subshell_id, a shared execution counter.  The point of it all, a subshell answering while the main shell runs
a long cell, is checked by order of arrival (the subshell's reply comes while the main cell's has not), never
by a clock.  The %%gpu case is tests/routing/test_route_subshells.py (it needs the host pool)."""
import queue
import time

import pytest

from itest_util import REPLY_TIMEOUT, of_type, stream_text, types

# The main shell's long cell: long enough that the subshell's answer cannot be a coincidence on a loaded
# machine, and it prints "started" first so the test knows it runs.
LONG_S = 10


def _send(k, msg_type, content, subshell_id=None, channel="shell"):
    msg = k.kc.session.msg(msg_type, content)
    if subshell_id is not None:
        msg["header"]["subshell_id"] = subshell_id
    getattr(k.kc, channel + "_channel").send(msg)
    return msg["header"]["msg_id"]


def _execute(k, code, subshell_id=None, **kw):
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}
    content.update(kw)
    return _send(k, "execute_request", content, subshell_id)


def _control(k, msg_type, content=None):
    msg_id = _send(k, msg_type, content or {}, channel="control")
    return k.reply(msg_id, channel="control")["content"]


def _create(k):
    reply = _control(k, "create_subshell_request")
    assert reply["status"] == "ok", reply
    return reply["subshell_id"]


def _shell_replies(k, msg_ids, timeout=REPLY_TIMEOUT + LONG_S * 3):
    """The shell replies to MSG_IDS in the order they arrive: [(msg_id, reply)]."""
    want, got = set(msg_ids), []
    deadline = time.monotonic() + timeout
    while want:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("%s: no reply to %s within %ss" % (k.name, sorted(want), timeout))
        try:
            msg = k.kc.get_shell_msg(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        mid = msg["parent_header"].get("msg_id")
        if mid in want:
            want.discard(mid)
            got.append((mid, msg))
    return got


def test_kernel_info_advertises_subshells(kernel, reference):
    """The same list as ipykernel 7.4 (with debugpy installed): subshells, then the debugger."""
    feats = [k.request("kernel_info_request", {})[0]["content"].get("supported_features") for k in
             (kernel, reference)]
    assert feats[0] == feats[1] == ["kernel subshells", "debugger"]


def test_create_list_delete(kernel, reference):
    seen = {}
    for k in (kernel, reference):
        a, b = _create(k), _create(k)
        assert a != b and len(a) == 36  # uuid4 strings, as ipykernel's
        listed = _control(k, "list_subshell_request")
        assert listed == {"status": "ok", "subshell_id": [a, b]}
        assert _control(k, "delete_subshell_request", {"subshell_id": a}) == {"status": "ok"}
        assert _control(k, "list_subshell_request")["subshell_id"] == [b]
        again = _control(k, "delete_subshell_request", {"subshell_id": a})
        assert again["status"] == "error"
        seen[k.name] = again["evalue"].replace(a, "ID")
        assert _control(k, "delete_subshell_request", {"subshell_id": b}) == {"status": "ok"}
        assert _control(k, "list_subshell_request") == {"status": "ok", "subshell_id": []}
    assert seen[kernel.name] == seen[reference.name] == "Unknown subshell_id 'ID'" 


def _subshell_cell(k, sid, code):
    msg_id = _execute(k, code, subshell_id=sid)
    reply = k.reply(msg_id)
    msgs = k.iopub_until_idle(msg_id)
    return reply, msgs


def test_subshell_cell_messages_and_parents(kernel, reference):
    """A subshell's cell: busy, execute_input, stream, execute_result, idle, each under the request's header
    with its subshell_id, the reply too; the same sequence as ipykernel's."""
    seqs = {}
    for k in (kernel, reference):
        sid = _create(k)
        k.drain_iopub()
        reply, msgs = _subshell_cell(k, sid, "print('in sub')\n6 * 7")
        assert reply["content"]["status"] == "ok"
        assert reply["parent_header"]["subshell_id"] == sid
        assert msgs[0]["msg_type"] == "status" and msgs[0]["content"]["execution_state"] == "busy"
        for m in msgs:
            assert m["parent_header"]["subshell_id"] == sid, m
            assert m["parent_header"]["msg_id"] == reply["parent_header"]["msg_id"]
        assert stream_text(msgs) == "in sub\n"
        assert of_type(msgs, "execute_result")[0]["content"]["data"]["text/plain"] == "42"
        seqs[k.name] = [t for t in types(msgs) if t != "stream"]
        _control(k, "delete_subshell_request", {"subshell_id": sid})
    assert seqs[kernel.name] == seqs[reference.name]


def test_unknown_subshell_gets_error_reply(kernel, reference):
    got = {}
    for k in (kernel, reference):
        k.drain_iopub()
        msg_id = _execute(k, "1", subshell_id="no-such-subshell")
        reply = k.reply(msg_id)
        msgs = k.iopub_until_idle(msg_id)
        assert reply["msg_type"] == "execute_reply"
        assert reply["content"]["status"] == "error"
        got[k.name] = (reply["content"]["ename"], reply["content"]["evalue"], types(msgs))
        # The kernel still serves its main shell.
        assert k.eval_text("2 + 2") == "4"
    assert got[kernel.name] == got[reference.name]
    assert got[kernel.name][0] == "UnknownSubshellError"


def test_execution_count_shared_as_ipykernel(kernel, reference):
    """ipykernel 7's subshells share the shell's counter and history; so do ours."""
    counts = {}
    for k in (kernel, reference):
        sid = _create(k)
        c0 = k.execute("pass")[0]["content"]["execution_count"]
        c1 = _subshell_cell(k, sid, "pass")[0]["content"]["execution_count"]
        c2 = k.execute("pass")[0]["content"]["execution_count"]
        counts[k.name] = (c1 - c0, c2 - c1)
        _control(k, "delete_subshell_request", {"subshell_id": sid})
    assert counts[kernel.name] == counts[reference.name] == (1, 1)


@pytest.mark.parametrize("main_code", [
    # a pure-Python loop: the GIL passes between the two threads
    "import time\nprint('started', flush=True)\nt0 = time.monotonic()\n"
    "while time.monotonic() - t0 < %d:\n    pass\n'main done'" % LONG_S,
    # a cell blocked outside Python
    "import time\nprint('started', flush=True)\ntime.sleep(%d)\n'main done'" % LONG_S,
], ids=["busy_loop", "sleep"])
def test_subshell_answers_while_main_busy(fresh_kernel, main_code):
    k = fresh_kernel
    k.run_ok("history = list(range(5))")
    sid = _create(k)
    main_id = _execute(k, main_code)
    k.iopub_next(main_id, lambda m: m["msg_type"] == "stream" and "started" in m["content"]["text"])
    sub_id = _execute(k, "print(len(history))\nhistory.append(5)", subshell_id=sid)
    order = _shell_replies(k, [main_id, sub_id])
    assert [mid for mid, _ in order] == [sub_id, main_id], "the subshell waited for the main shell"
    assert order[0][1]["content"]["status"] == "ok"
    assert order[1][1]["content"]["status"] == "ok"
    assert stream_text(k.iopub_until_idle(sub_id)) == "5\n"
    # The main shell sees what the subshell did (one namespace).
    assert k.eval_text("len(history)") == "6"


def test_stop_on_error_is_per_subshell(fresh_kernel):
    """An error on a subshell aborts what is queued on that subshell, not the main shell's requests."""
    k = fresh_kernel
    sid = _create(k)
    fail = _execute(k, "import time\ntime.sleep(1)\nraise ValueError('x')", subshell_id=sid)
    queued_sub = _execute(k, "'sub after'", subshell_id=sid)
    main = _execute(k, "'main'")
    replies = dict(_shell_replies(k, [fail, queued_sub, main]))
    assert replies[fail]["content"]["status"] == "error"
    assert replies[queued_sub]["content"]["status"] == "aborted"
    assert replies[main]["content"]["status"] == "ok"
    # After the error's reply, the subshell runs again.
    reply, _ = _subshell_cell(k, sid, "'again'")
    assert reply["content"]["status"] == "ok"


def test_delete_busy_subshell(fresh_kernel):
    """Deleting a subshell that runs a cell: the delete is answered at once, the running cell finishes and is
    answered, a request queued behind it gets an error reply (never silence), and the id is unknown from
    then on.  (ipykernel 7.x answers neither request: it stops the subshell's loop under the running cell.)"""
    k = fresh_kernel
    if k.name.startswith("python3"):
        pytest.skip("ipykernel 7 loses the replies of a deleted subshell's requests")
    sid = _create(k)
    running = _execute(k, "import time\nprint('started', flush=True)\ntime.sleep(3)\n'finished'",
                       subshell_id=sid)
    k.iopub_next(running, lambda m: m["msg_type"] == "stream" and "started" in m["content"]["text"])
    queued = _execute(k, "'never runs'", subshell_id=sid)
    assert _control(k, "delete_subshell_request", {"subshell_id": sid}) == {"status": "ok"}
    assert _control(k, "list_subshell_request")["subshell_id"] == []
    replies = dict(_shell_replies(k, [running, queued]))
    assert replies[running]["content"]["status"] == "ok"
    assert replies[queued]["content"]["status"] == "error"
    assert "deleted" in replies[queued]["content"]["evalue"]
    assert types(k.iopub_until_idle(running))[-1] == "status"  # (its busy came before "started")
    seq = types(k.iopub_until_idle(queued))
    assert seq == ["status", "status"]
    late = _execute(k, "1", subshell_id=sid)
    assert k.reply(late)["content"]["ename"] == "UnknownSubshellError"
    assert k.eval_text("3 * 3") == "9"

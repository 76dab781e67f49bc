"""execute_request: execute_input, busy/idle framing under the request's parent
header, execution_count, silent, store_history, user_expressions, allow_stdin
and stop_on_error aborting the queued requests (protocol 5.3; behaviour
checked against ipykernel by running every test on it too)."""
import pytest

from itest_util import check_envelope, of_type, stream_text, types


def test_execute_message_order(kernel):
    msg_id = kernel.send("execute_request", {"code": "x = 20\nprint('hi')\nx + 22",
                                             "silent": False, "store_history": True,
                                             "user_expressions": {}, "allow_stdin": False})
    reply = kernel.reply(msg_id)
    msgs = kernel.iopub_until_idle(msg_id)
    check_envelope(kernel, msg_id, msgs)
    assert types(msgs) == ["status", "execute_input", "stream", "execute_result", "status"]
    assert reply["msg_type"] == "execute_reply"
    assert reply["content"]["status"] == "ok"
    n = reply["content"]["execution_count"]
    assert msgs[1]["content"] == {"code": "x = 20\nprint('hi')\nx + 22", "execution_count": n}
    assert msgs[2]["content"] == {"name": "stdout", "text": "hi\n"}
    result = msgs[3]["content"]
    assert result["execution_count"] == n
    assert result["data"] == {"text/plain": "42"}
    assert reply["content"]["user_expressions"] == {}
    assert reply["header"]["session"] != ""
    assert reply["parent_header"]["msg_id"] == msg_id


def test_execution_count_increments(kernel):
    r1, _ = kernel.execute("a = 1")
    r2, m2 = kernel.execute("a")
    n = r1["content"]["execution_count"]
    assert r2["content"]["execution_count"] == n + 1
    assert of_type(m2, "execute_input")[0]["content"]["execution_count"] == n + 1
    assert of_type(m2, "execute_result")[0]["content"]["execution_count"] == n + 1


def test_store_history_false_keeps_count(kernel):
    r1, _ = kernel.execute("b = 1")
    n = r1["content"]["execution_count"]
    r2, m2 = kernel.execute("b + 1", store_history=False)
    assert r2["content"]["status"] == "ok"
    assert r2["content"]["execution_count"] == n
    assert of_type(m2, "execute_result")[0]["content"]["data"]["text/plain"] == "2"
    r3, _ = kernel.execute("b + 2")
    assert r3["content"]["execution_count"] == n + 1


def test_silent(kernel):
    r1, _ = kernel.execute("c = 5")
    n = r1["content"]["execution_count"]
    reply, msgs = kernel.execute("c * 2\nprint('still printed')", silent=True)
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["execution_count"] == n
    # Silent: no execute_input, no execute_result, but output still streams.
    assert not of_type(msgs, "execute_input")
    assert not of_type(msgs, "execute_result")
    assert stream_text(msgs) == "still printed\n"
    r3, _ = kernel.execute("c")
    assert r3["content"]["execution_count"] == n + 1


def test_empty_code_keeps_count(kernel):
    r1, _ = kernel.execute("d = 1")
    n = r1["content"]["execution_count"]
    reply, msgs = kernel.execute("")
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["execution_count"] == n
    assert not of_type(msgs, "execute_result")


def test_user_expressions(kernel):
    reply, msgs = kernel.execute("e = 41", user_expressions={"ok": "e + 1", "bad": "1/0",
                                                             "html": "__import__('IPython').display.HTML('<b>x</b>')"})
    ue = reply["content"]["user_expressions"]
    assert ue["ok"] == {"status": "ok", "data": {"text/plain": "42"}, "metadata": {}}
    assert ue["bad"]["status"] == "error"
    assert ue["bad"]["ename"] == "ZeroDivisionError"
    assert ue["bad"]["evalue"] == "division by zero"
    assert isinstance(ue["bad"]["traceback"], list)
    assert ue["html"]["status"] == "ok"
    assert ue["html"]["data"]["text/html"] == "<b>x</b>"
    # user_expressions are evaluated after the code: they publish nothing.
    assert types(msgs) == ["status", "execute_input", "status"]


def test_allow_stdin_false(kernel):
    reply, msgs = kernel.execute("input('prompt')", allow_stdin=False)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "StdinNotImplementedError"
    err = of_type(msgs, "error")
    assert len(err) == 1 and err[0]["content"]["ename"] == "StdinNotImplementedError"


def _queue(kernel, codes, **kw):
    """Send every code at once (so the later ones are queued behind the first)."""
    ids = []
    for code in codes:
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        content.update(kw)
        ids.append(kernel.send("execute_request", content))
    replies = [kernel.reply(i) for i in ids]
    iopubs = [kernel.iopub_until_idle(i) for i in ids]
    return replies, iopubs


# The queue tests run on a kernel of their own, so that no earlier test's
# error can leave anything behind.
# The first cell runs 0.5 s before it fails: the requests the test sends
# right behind it (microseconds later, over loopback) are then queued in the
# kernel while it runs, which is the situation stop_on_error is about.
FAIL_SLOWLY = "import time\ntime.sleep(0.5)\nraise ValueError('boom')"


def test_stop_on_error_aborts_queue(fresh_kernel):
    kernel = fresh_kernel
    replies, iopubs = _queue(kernel, [FAIL_SLOWLY, "print('must not run')", "print('nor this')"])
    assert replies[0]["content"]["status"] == "error"
    assert replies[0]["content"]["ename"] == "ValueError"
    for r, msgs in zip(replies[1:], iopubs[1:]):
        assert r["content"]["status"] == "aborted"
        assert stream_text(msgs) == ""
        assert types(msgs) == ["status", "status"]
    # The queue is not aborted for later requests.
    reply, msgs = kernel.execute("print('runs again')")
    assert reply["content"]["status"] == "ok"
    assert stream_text(msgs) == "runs again\n"


def test_request_after_error_not_aborted(kernel):
    """Only requests queued while the failing cell ran are aborted: one sent
    after its reply and idle arrived runs (ipykernel: stop_on_error_timeout
    0).  Repeated, because a kernel that aborts for a while after the error
    fails this only when the next request arrives in that window."""
    if kernel.name == "python3":
        # ipykernel 6.17 itself races here (its stop-aborting callback can be
        # scheduled after a request that arrives right after the idle); we
        # hold looseleaf to the better behaviour.
        pytest.skip("ipykernel 6.17 sometimes aborts a request sent after the error's idle")
    for i in range(20):
        reply, _ = kernel.execute("1/0")
        assert reply["content"]["status"] == "error"
        reply, msgs = kernel.execute("print('next')")
        assert reply["content"]["status"] == "ok", "round %d: %s" % (i, reply["content"])
        assert stream_text(msgs) == "next\n"


def test_stop_on_error_false_runs_queue(fresh_kernel):
    kernel = fresh_kernel
    replies, iopubs = _queue(kernel, [FAIL_SLOWLY, "print('runs')"], stop_on_error=False)
    assert replies[0]["content"]["status"] == "error"
    assert replies[1]["content"]["status"] == "ok"
    assert stream_text(iopubs[1]) == "runs\n"


def test_silent_error_does_not_abort_queue(fresh_kernel):
    kernel = fresh_kernel
    ids = [kernel.send("execute_request", {"code": FAIL_SLOWLY, "silent": True, "store_history": False,
                                           "user_expressions": {}, "allow_stdin": False}),
           kernel.send("execute_request", {"code": "print('runs')", "silent": False,
                                           "store_history": True, "user_expressions": {},
                                           "allow_stdin": False})]
    r0, r1 = kernel.reply(ids[0]), kernel.reply(ids[1])
    kernel.iopub_until_idle(ids[0])
    m1 = kernel.iopub_until_idle(ids[1])
    assert r0["content"]["status"] == "error"
    assert r1["content"]["status"] == "ok"
    assert stream_text(m1) == "runs\n"


def test_non_execute_requests_not_aborted(fresh_kernel):
    kernel = fresh_kernel
    """Only execute requests are aborted after an error (as ipykernel does)."""
    first = kernel.send("execute_request", {"code": FAIL_SLOWLY, "silent": False, "store_history": True,
                                            "user_expressions": {}, "allow_stdin": False,
                                            "stop_on_error": True})
    info = kernel.send("kernel_info_request", {})
    assert kernel.reply(first)["content"]["status"] == "error"
    assert kernel.reply(info)["content"]["status"] == "ok"
    kernel.iopub_until_idle(first)
    kernel.iopub_until_idle(info)


def test_state_persists_between_cells(kernel):
    kernel.run_ok("def grow(v):\n    data.append(v)\n    return len(data)\ndata = []")
    kernel.run_ok("grow(1); grow(2)")
    assert kernel.eval_text("data") == "[1, 2]"
    assert kernel.eval_text("__name__") == "'__main__'"
    assert kernel.eval_text("type(get_ipython()).__name__ != ''") == "True"


def test_queued_requests_run_in_order(kernel):
    """Requests sent together run one after another, in the order sent, each
    framed by its own busy/idle."""
    ids = [kernel.send("execute_request", {"code": "print(%d)" % i, "silent": False,
                                           "store_history": True, "user_expressions": {},
                                           "allow_stdin": False}) for i in range(5)]
    replies = [kernel.reply(i) for i in ids]
    counts = [r["content"]["execution_count"] for r in replies]
    assert counts == list(range(counts[0], counts[0] + 5))
    for i, msg_id in enumerate(ids):
        msgs = kernel.iopub_until_idle(msg_id)
        check_envelope(kernel, msg_id, msgs)
        assert stream_text(msgs) == "%d\n" % i


def test_control_answers_while_cell_runs(kernel, tmp_path):
    """kernel_info on the control channel is answered while a cell runs."""
    go = str(tmp_path / "go")
    code = ("import os, time\nprint('started', flush=True)\n_t = time.monotonic() + 30\n"
            "while not os.path.exists(%r) and time.monotonic() < _t:\n    time.sleep(0.01)\n"
            "print('finished')" % go)
    msg_id = kernel.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                             "user_expressions": {}, "allow_stdin": False})
    kernel.iopub_next(msg_id, lambda m: m["msg_type"] == "stream" and "started" in m["content"]["text"])
    info = kernel.reply(kernel.send("kernel_info_request", {}, channel="control"), channel="control",
                        timeout=10)
    assert info["content"]["status"] == "ok"
    # The cell is still running: it ends only once the test lets it.
    open(go, "w").close()
    rest = kernel.iopub_until_idle(msg_id)
    assert stream_text(rest).endswith("finished\n")
    assert kernel.reply(msg_id)["content"]["status"] == "ok"

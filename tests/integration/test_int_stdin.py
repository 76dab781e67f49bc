"""input_request / input_reply on the stdin channel for input() and
getpass(), and the error when the frontend does not allow stdin."""
import queue
import time

import pytest

from itest_util import REPLY_TIMEOUT, of_type, stream_text


def _run_with_input(k, code, answers):
    """Run CODE with allow_stdin; answer each input_request in turn.
    Returns (reply, iopub messages, the input_requests' contents)."""
    msg_id = k.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                        "user_expressions": {}, "allow_stdin": True})
    requests = []
    deadline = time.monotonic() + REPLY_TIMEOUT
    while len(requests) < len(answers):
        assert time.monotonic() < deadline, "%s: only %d input_requests" % (k.name, len(requests))
        try:
            req = k.kc.get_stdin_msg(timeout=1.0)
        except queue.Empty:
            continue
        assert req["msg_type"] == "input_request"
        assert req["parent_header"]["msg_id"] == msg_id
        requests.append(req["content"])
        k.kc.input(answers[len(requests) - 1])
    reply = k.reply(msg_id)
    return reply, k.iopub_until_idle(msg_id), requests


def test_input(kernel):
    reply, msgs, reqs = _run_with_input(kernel, "name = input('Your name? ')\nprint('Hello', name)", ["Bob"])
    assert reqs == [{"prompt": "Your name? ", "password": False}]
    assert reply["content"]["status"] == "ok"
    # ipykernel echoes nothing of the prompt or answer to stdout: the
    # frontend shows them.
    assert stream_text(msgs) == "Hello Bob\n"


def test_getpass(kernel):
    reply, msgs, reqs = _run_with_input(kernel, "import getpass\npw = getpass.getpass('Secret: ')\nprint(len(pw))",
                                        ["hunter2"])
    assert reqs == [{"prompt": "Secret: ", "password": True}]
    assert reply["content"]["status"] == "ok"
    assert stream_text(msgs) == "7\n"


def test_several_inputs_and_unicode(kernel):
    reply, msgs, reqs = _run_with_input(kernel, "a = input('a')\nb = input()\nprint(repr(a + '|' + b))",
                                        ["\u00e9t\u00e9 \u2713", ""])
    assert [r["prompt"] for r in reqs] == ["a", ""]
    assert stream_text(msgs) == "'\u00e9t\u00e9 \u2713|'\n"


@pytest.mark.parametrize("code", ["input('x')", "import getpass; getpass.getpass('x')"])
def test_stdin_not_allowed(kernel, code):
    reply, msgs = kernel.execute(code, allow_stdin=False)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "StdinNotImplementedError"
    assert len(of_type(msgs, "error")) == 1

"""comm_info and comm_open/comm_msg/comm_close in both directions.

Kernel code uses the `comm` package (comm.get_comm_manager / create_comm), as
the issue asks.  Debian's ipykernel 6.17 predates the comm package (its comms
live in ipykernel.comm), so on the reference kernel the same test uses
ipykernel's own API; what the frontend sees must be the same."""
import uuid

import pytest

from itest_util import check_envelope, of_type, stream_text

# Kernel-side API, per kernel: how to get the comm manager and open a comm.
API = {
    "looseleaf": ("import comm as _comm_pkg\n_mgr = _comm_pkg.get_comm_manager()\n"
                  "_open = _comm_pkg.create_comm\n"),
    "python3": ("_mgr = get_ipython().kernel.comm_manager\n"
                "from ipykernel.comm import Comm as _open\n"),
}

# A target whose handler answers each frontend message with a reply and a
# print, and reports the close.
ECHO_TARGET = """
_log = []
def _echo_target(comm, open_msg):
    _log.append(('open', open_msg['content']['data']))
    comm.send({'hello': open_msg['content']['data'].get('x')})
    @comm.on_msg
    def _on_msg(msg):
        data = msg['content']['data']
        _log.append(('msg', data))
        print('got', data['n'])
        comm.send({'echo': data['n'] * 2})
    @comm.on_close
    def _on_close(msg):
        _log.append(('close', msg['content']['data']))
        print('closed')
_mgr.register_target('ll.echo', _echo_target)
"""


@pytest.fixture(scope="module")
def ck(kernel):
    kernel.run_ok(API[kernel.name] + ECHO_TARGET)
    return kernel


def _shell_no_reply(k, msg_type, content):
    """comm messages have no reply; they are still framed by busy/idle."""
    msg_id = k.send(msg_type, content)
    msgs = k.iopub_until_idle(msg_id)
    check_envelope(k, msg_id, msgs)
    return msgs


def _comm_info(k, target=None):
    content = {} if target is None else {"target_name": target}
    msg_id = k.send("comm_info_request", content)
    reply = k.reply(msg_id)
    k.iopub_until_idle(msg_id)
    assert reply["msg_type"] == "comm_info_reply"
    assert reply["content"]["status"] == "ok"
    return reply["content"]["comms"]


def test_frontend_opens_comm(ck):
    comm_id = uuid.uuid4().hex
    msgs = _shell_no_reply(ck, "comm_open", {"comm_id": comm_id, "target_name": "ll.echo",
                                             "data": {"x": 7}})
    sent = of_type(msgs, "comm_msg")
    assert [m["content"] for m in sent] == [{"comm_id": comm_id, "data": {"hello": 7}}]

    assert _comm_info(ck)[comm_id] == {"target_name": "ll.echo"}
    assert comm_id in _comm_info(ck, "ll.echo")
    assert comm_id not in _comm_info(ck, "other.target")

    msgs = _shell_no_reply(ck, "comm_msg", {"comm_id": comm_id, "data": {"n": 21}})
    assert [m["content"] for m in of_type(msgs, "comm_msg")] == [{"comm_id": comm_id, "data": {"echo": 42}}]
    assert stream_text(msgs) == "got 21\n"

    msgs = _shell_no_reply(ck, "comm_close", {"comm_id": comm_id, "data": {"bye": True}})
    assert stream_text(msgs) == "closed\n"
    assert comm_id not in _comm_info(ck)
    assert ck.eval_text("_log[-3:]") == "[('open', {'x': 7}), ('msg', {'n': 21}), ('close', {'bye': True})]"


def test_open_unknown_target(ck):
    """A comm_open for a target nobody registered is answered by a comm_close
    (as ipykernel does), and the kernel carries on."""
    comm_id = uuid.uuid4().hex
    msgs = _shell_no_reply(ck, "comm_open", {"comm_id": comm_id, "target_name": "no.such.target",
                                             "data": {}})
    closes = of_type(msgs, "comm_close")
    assert [m["content"]["comm_id"] for m in closes] == [comm_id]
    assert comm_id not in _comm_info(ck)
    assert ck.eval_text("1 + 1") == "2"


def test_msg_to_unknown_comm_ignored(ck):
    msgs = _shell_no_reply(ck, "comm_msg", {"comm_id": uuid.uuid4().hex, "data": {"n": 1}})
    assert not of_type(msgs, "comm_msg") and not of_type(msgs, "error")
    assert ck.eval_text("1 + 1") == "2"


def test_kernel_opens_comm(ck):
    code = ("_kc = _open(target_name='ll.frontend', data={'from': 'kernel'})\n"
            "_kc_got = []\n"
            "_kc.on_msg(lambda msg: _kc_got.append(msg['content']['data']))\n"
            "_kc.send({'step': 1})\n")
    reply, msgs = ck.execute(code)
    assert reply["content"]["status"] == "ok"
    opens = of_type(msgs, "comm_open")
    assert len(opens) == 1
    o = opens[0]["content"]
    assert o["target_name"] == "ll.frontend"
    assert o["data"] == {"from": "kernel"}
    comm_id = o["comm_id"]
    assert [m["content"] for m in of_type(msgs, "comm_msg")] == [{"comm_id": comm_id, "data": {"step": 1}}]
    assert _comm_info(ck, "ll.frontend") == {comm_id: {"target_name": "ll.frontend"}}

    # The frontend answers on the kernel-opened comm.
    _shell_no_reply(ck, "comm_msg", {"comm_id": comm_id, "data": {"answer": 42}})
    assert ck.eval_text("_kc_got") == "[{'answer': 42}]"

    reply, msgs = ck.execute("_kc.close({'done': True})")
    closes = of_type(msgs, "comm_close")
    assert [m["content"] for m in closes] == [{"comm_id": comm_id, "data": {"done": True}}]
    assert comm_id not in _comm_info(ck)


def test_comm_binary_buffers(ck):
    code = "_bc = _open(target_name='ll.bin', data={})\n_bc.send({'k': 1}, buffers=[b'\\x00\\x01\\x02'])\n_bc.close()"
    reply, msgs = ck.execute(code)
    assert reply["content"]["status"] == "ok"
    sent = of_type(msgs, "comm_msg")
    assert len(sent) == 1
    assert [bytes(b) for b in sent[0]["buffers"]] == [b"\x00\x01\x02"]

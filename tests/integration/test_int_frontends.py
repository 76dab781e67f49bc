"""More than one frontend on one kernel (a notebook and a console attached
to the same kernel), the ipc transport, and the working directory the
manager starts the kernel in."""
import os
import queue
import time

import pytest
from jupyter_client import BlockingKernelClient

from itest_util import Kernel, REPLY_TIMEOUT, stream_text


def _second_client(k):
    """Another frontend: its own client and Session (km.client() would share
    the manager's session, hence its socket identity, with the first)."""
    kc2 = BlockingKernelClient()
    kc2.load_connection_info(k.km.get_connection_info())
    assert kc2.session.session != k.kc.session.session
    kc2.start_channels()
    kc2.wait_for_ready(timeout=60)
    return kc2


def _iopub_for(kc, msg_id, timeout=REPLY_TIMEOUT):
    deadline = time.monotonic() + timeout
    got = []
    while time.monotonic() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        got.append(m)
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return got
    raise AssertionError("no idle for %s; got %s" % (msg_id, [m["msg_type"] for m in got]))


def _parents(get):
    """Parent msg_ids of the messages GET yields within half a second of quiet."""
    out = []
    while True:
        try:
            out.append(get(timeout=0.5)["parent_header"].get("msg_id"))
        except queue.Empty:
            return out


def test_two_clients_share_iopub_not_replies(kernel):
    kc2 = _second_client(kernel)
    try:
        kernel.drain_iopub()
        msg_id = kc2.execute("print('from client 2')\nshared_var = 7")
        reply = kc2.get_shell_msg(timeout=REPLY_TIMEOUT)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "ok"
        # Both frontends see the output, under client 2's request.
        for kc in (kc2, kernel.kc):
            msgs = _iopub_for(kc, msg_id)
            assert stream_text(msgs) == "from client 2\n"
            assert msgs[0]["parent_header"]["session"] == kc2.session.session
        # The reply went to client 2 only (client 1 may hold its own older
        # replies, e.g. of wait_for_ready's kernel_info requests).
        assert msg_id not in _parents(kernel.kc.get_shell_msg)
        # One namespace for both.
        assert kernel.eval_text("shared_var") == "7"
    finally:
        kc2.stop_channels()


def test_input_request_goes_to_the_asking_client(kernel):
    kc2 = _second_client(kernel)
    try:
        msg_id = kc2.execute("v = input('who? ')\nprint('hi', v)", allow_stdin=True)
        req = kc2.get_stdin_msg(timeout=REPLY_TIMEOUT)
        assert req["content"]["prompt"] == "who? "
        assert req["parent_header"]["msg_id"] == msg_id
        assert msg_id not in _parents(kernel.kc.get_stdin_msg)
        kc2.input("two")
        assert kc2.get_shell_msg(timeout=REPLY_TIMEOUT)["content"]["status"] == "ok"
        assert stream_text(_iopub_for(kc2, msg_id)) == "hi two\n"
    finally:
        kc2.stop_channels()


def test_ipc_transport(kernel_name, jupyter_env, tmp_path):
    """The connection file may name transport ipc (unix sockets) instead of tcp."""
    from jupyter_client import KernelManager
    from itest_util import kernel_env
    km = KernelManager(kernel_name=kernel_name, transport="ipc", ip=str(tmp_path / "kernel-ipc"))
    km.start_kernel(env=kernel_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute("print('over ipc')")
        assert kc.get_shell_msg(timeout=REPLY_TIMEOUT)["content"]["status"] == "ok"
        assert stream_text(_iopub_for(kc, msg_id)) == "over ipc\n"
        assert km.get_connection_info()["transport"] == "ipc"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def test_kernel_starts_in_given_cwd(kernel_name, jupyter_env, tmp_path):
    """Frontends start a notebook's kernel in the notebook's directory."""
    from jupyter_client import KernelManager
    from itest_util import kernel_env
    work = tmp_path / "work dir"
    work.mkdir()
    km = KernelManager(kernel_name=kernel_name)
    km.start_kernel(env=kernel_env(), cwd=str(work))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute("import os", user_expressions={"cwd": "os.getcwd()"}, reply=True, timeout=REPLY_TIMEOUT)
        assert reply["content"]["user_expressions"]["cwd"]["data"]["text/plain"] == repr(str(work))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def test_client_with_same_identity_takes_over(kernel):
    """A frontend that reconnects with the same session (so the same zmq
    identity, as km.client() gives every client of one manager) is answered:
    ipykernel sets ROUTER_HANDOVER on shell, control and stdin for this."""
    kc2 = kernel.km.client()
    assert kc2.session.bsession == kernel.kc.session.bsession
    kc2.start_channels()
    try:
        kc2.wait_for_ready(timeout=30)
        reply = kc2.execute("'taken over'", reply=True, timeout=REPLY_TIMEOUT)
        assert reply["content"]["status"] == "ok"
        info = kc2.kernel_info(reply=True, timeout=REPLY_TIMEOUT)
        assert info["content"]["status"] == "ok"
    finally:
        kc2.stop_channels()
    # The first client reconnects the same way and is answered again.
    kernel.connect()
    assert kernel.eval_text("1 + 1") == "2"

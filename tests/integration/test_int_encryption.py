"""Encrypted transport (CurveZMQ): a kernel started by jupyter_client with
KernelManager.transport_encryption = "required" gets a CurveZMQ server keypair in its connection file
(curve_publickey / curve_secretkey) and must serve every socket with it: shell, control, stdin, iopub
and heartbeat.  Checked end to end (execute, iopub output, input(), heartbeat, interrupt and shutdown on
control), then that a client without the key, or with the wrong server key, completes no handshake on any
socket (so gets no reply and sees no iopub), and that the plain mode is unchanged.  Everything runs on
LooseLeaf and on ipykernel 7.4 (the reference, which serves the same keys), with kernelspecs that declare
metadata.supported_encryption as `looseleaf install` writes it."""
import json
import os
import queue
import time

import pytest
import zmq
from jupyter_client import KernelManager
from zmq.utils.monitor import recv_monitor_message

from itest_util import LOOSELEAF_BIN, REPLY_TIMEOUT, Kernel, of_type, selected_kernels, stream_text

pytestmark = [
    pytest.mark.skipif(not zmq.has("curve"), reason="this pyzmq's libzmq has no CURVE"),
    # (make test-debian: Debian 12's jupyter_client 7.4 provisions no keys.)
    pytest.mark.skipif("transport_encryption" not in KernelManager.class_trait_names(),
                       reason="jupyter_client < 8.10 cannot provision CurveZMQ keys"),
]


def _ipykernel_serves_curve():
    """Whether the reference can be compared: ipykernel 7.4 reads the keys, Debian's 6.17 does not."""
    from ipykernel.kernelapp import IPKernelApp
    return "curve_secretkey" in IPKernelApp.class_trait_names()

# How long a refused client is watched for a reply or an iopub message it must never get, after its
# handshake has already failed (the failure itself is awaited as an event, not timed).
REFUSED_WATCH_S = 2.0
CHANNELS = ("shell", "control", "stdin", "iopub", "hb")


@pytest.fixture(scope="module", params=selected_kernels())
def curve_name(request, kernel_dir):
    """A kernelspec NAME-curve: the test run's NAME spec (see tests/conftest.py) declaring CurveZMQ
    support, with interrupt_mode "message" so jupyter_client interrupts over the control channel."""
    if request.param.startswith("python3") and not _ipykernel_serves_curve():
        pytest.skip("this ipykernel has no CurveZMQ support to compare with")
    with open(os.path.join(kernel_dir, request.param, "kernel.json")) as f:
        spec = json.load(f)
    spec["metadata"] = dict(spec.get("metadata", {}), supported_encryption=["curve"])
    spec["interrupt_mode"] = "message"
    name = request.param + "-curve"
    os.makedirs(os.path.join(kernel_dir, name), exist_ok=True)
    with open(os.path.join(kernel_dir, name, "kernel.json"), "w") as f:
        json.dump(spec, f, indent=1)
    return name


@pytest.fixture(scope="module")
def ck(curve_name):
    """One kernel with encryption required, shared by the tests that leave it running."""
    k = Kernel(curve_name, transport_encryption="required")
    yield k
    k.stop()


def _url(k, channel):
    info = k.km.get_connection_info()
    if info["transport"] == "ipc":
        return "ipc://%s-%d" % (info["ip"], info["%s_port" % channel])
    return "tcp://%s:%d" % (info["ip"], info["%s_port" % channel])


_SOCKET_TYPES = {"shell": zmq.DEALER, "control": zmq.DEALER, "stdin": zmq.DEALER, "iopub": zmq.SUB,
                 "hb": zmq.REQ}
_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_DISCONNECTED)


def _client_socket(k, channel, serverkey=None):
    """A raw client socket on CHANNEL, with a monitor; SERVERKEY None means no CURVE at all,
    otherwise a CURVE client (fresh keypair, as jupyter_client's heartbeat does) trusting SERVERKEY."""
    sock = zmq.Context.instance().socket(_SOCKET_TYPES[channel])
    sock.linger = 0
    if serverkey is not None:
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = serverkey
    if channel == "iopub":
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | _FAILED)
    sock.connect(_url(k, channel))
    return sock, mon


def _handshake(mon, timeout=REPLY_TIMEOUT):
    """'ok' once the monitored socket completed a handshake, 'failed' once it failed one (or the
    kernel dropped the connection); whichever comes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mon.poll(200):
            ev = recv_monitor_message(mon)["event"]
            if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "ok"
            if ev & _FAILED:
                return "failed"
    raise AssertionError("no handshake outcome within %ss" % timeout)


def _close(sock, mon):
    sock.disable_monitor()
    mon.close(0)
    sock.close(0)


def _probe(k, channel, sock, watch=REFUSED_WATCH_S):
    """Try CHANNEL from SOCK as a client would; the bytes it got back, or None.  (Sends never wait: a
    REQ or DEALER without a connected peer, which a refused one is, would block in send.)"""
    try:
        if channel in ("shell", "control"):
            msg = k.kc.session.msg("kernel_info_request", {})
            sock.send_multipart(k.kc.session.serialize(msg), zmq.NOBLOCK)
        elif channel == "stdin":
            # Nothing to ask on stdin: a peer only ever answers input_requests there.
            return None
        elif channel == "hb":
            sock.send(b"ping", zmq.NOBLOCK)
    except zmq.Again:
        return None
    if sock.poll(int(watch * 1000)):
        return sock.recv_multipart()
    return None


# ---- the encrypted kernel works -------------------------------------------------------------------

def test_connection_file_carries_the_keys(ck):
    with open(ck.km.connection_file) as f:
        info = json.load(f)
    assert len(info["curve_publickey"]) == 40 and len(info["curve_secretkey"]) == 40
    assert zmq.curve_public(info["curve_secretkey"].encode()) == info["curve_publickey"].encode()


def test_execute_and_iopub_output(ck):
    reply, msgs = ck.execute("print('over curve'); 6 * 7")
    assert reply["content"]["status"] == "ok"
    assert stream_text(msgs) == "over curve\n"
    assert of_type(msgs, "execute_result")[0]["content"]["data"]["text/plain"] == "42"


def test_input_over_stdin(ck):
    msg_id = ck.send("execute_request", {"code": "print('got', input('name? '))", "silent": False,
                                         "store_history": False, "user_expressions": {},
                                         "allow_stdin": True})
    req = ck.kc.get_stdin_msg(timeout=REPLY_TIMEOUT)
    assert req["msg_type"] == "input_request" and req["content"]["prompt"] == "name? "
    ck.kc.input("curve")
    assert ck.reply(msg_id)["content"]["status"] == "ok"
    assert stream_text(ck.iopub_until_idle(msg_id)) == "got curve\n"


def test_heartbeat_answers_a_curve_client(ck):
    sock, mon = _client_socket(ck, "hb", serverkey=ck.km.curve_publickey)
    try:
        assert _handshake(mon) == "ok"
        for payload in (b"beat", b"\x00" * 1000):
            sock.send(payload)
            assert sock.poll(REPLY_TIMEOUT * 1000), "no heartbeat echo"
            assert sock.recv() == payload
    finally:
        _close(sock, mon)


def test_kernel_info_on_control(ck):
    msg_id = ck.send("kernel_info_request", {}, channel="control")
    assert ck.reply(msg_id, channel="control")["content"]["status"] == "ok"


def test_interrupt_on_control(ck):
    msg_id = ck.send("execute_request", {"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(120)",
                                         "silent": False, "store_history": False, "user_expressions": {},
                                         "allow_stdin": False})
    ck.iopub_next(msg_id, lambda m: m["msg_type"] == "stream" and "sleeping" in m["content"]["text"])
    # interrupt_mode "message": jupyter_client's own control socket (a CURVE client too) carries it.
    ck.km.interrupt_kernel()
    reply = ck.reply(msg_id)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    ck.iopub_until_idle(msg_id)
    assert ck.execute("print('alive')")[0]["content"]["status"] == "ok"


def test_shutdown_on_control(curve_name):
    k = Kernel(curve_name, transport_encryption="required")
    try:
        msg_id = k.send("shutdown_request", {"restart": False}, channel="control")
        reply = k.reply(msg_id, channel="control")
        assert reply["msg_type"] == "shutdown_reply" and reply["content"]["status"] == "ok"
        deadline = time.monotonic() + REPLY_TIMEOUT
        while k.km.is_alive():  # it leaves by itself: the request was read
            assert time.monotonic() < deadline, "the kernel did not exit after its shutdown_reply"
            time.sleep(0.1)
    finally:
        k.stop()


def test_restart_keeps_the_keys(curve_name):
    """jupyter_client keeps the keypair across a restart (as the HMAC key): the new process reads the
    same one, and the old clients' server key still holds."""
    k = Kernel(curve_name, transport_encryption="required")
    try:
        public, old_pid = k.km.curve_publickey, k.pid
        k.km.restart_kernel(now=False)
        k.connect()
        assert k.pid != old_pid and k.km.curve_publickey == public
        assert stream_text(k.run_ok("print('restarted')")) == "restarted\n"
        sock, mon = _client_socket(k, "hb")
        try:
            assert _handshake(mon) == "failed"
        finally:
            _close(sock, mon)
    finally:
        k.stop()


# ---- a client without the key gets nothing -------------------------------------------------------

@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("client", ["plain", "wrong server key"])
def test_client_without_the_key_is_refused(ck, channel, client):
    serverkey = None if client == "plain" else zmq.curve_keypair()[0]
    sock, mon = _client_socket(ck, channel, serverkey=serverkey)
    try:
        assert _handshake(mon) == "failed"
        if channel == "iopub":
            # The kernel publishes (the right client sees it); the refused subscriber sees nothing.
            assert stream_text(ck.execute("print('for key holders only')")[1]) == "for key holders only\n"
        got = _probe(ck, channel, sock)
        assert got is None, "a %s client got %r on %s" % (client, got, channel)
    finally:
        _close(sock, mon)
    # The kernel is unharmed by the attempt.
    assert ck.execute("1")[0]["content"]["status"] == "ok"


@pytest.mark.parametrize("channel", CHANNELS)
def test_client_with_the_key_completes_the_handshake(ck, channel):
    """(The refusals above are not an artefact of the raw sockets: the same ones with the right
    server key get through.)"""
    sock, mon = _client_socket(ck, channel, serverkey=ck.km.curve_publickey)
    try:
        assert _handshake(mon) == "ok"
        if channel in ("shell", "control", "hb"):
            assert _probe(ck, channel, sock, watch=REPLY_TIMEOUT), "no answer on %s with the right key" % channel
    finally:
        _close(sock, mon)


# ---- plain mode ------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["disabled", "auto without support"])
def test_plain_mode_keeps_working(curve_name, policy):
    if policy == "disabled":
        k = Kernel(curve_name, transport_encryption="disabled")
    else:
        # The kernelspec of the plain run declares nothing: "auto" then provisions no keys.
        k = Kernel(curve_name[: -len("-curve")], transport_encryption="auto")
    try:
        assert k.km.curve_publickey is None
        with open(k.km.connection_file) as f:
            assert "curve_secretkey" not in json.load(f)
        assert stream_text(k.run_ok("print('plain')")) == "plain\n"
        sock, mon = _client_socket(k, "hb")
        try:
            assert _handshake(mon) == "ok"
            assert _probe(k, "hb", sock) == [b"ping"]
        finally:
            _close(sock, mon)
    finally:
        k.stop()


def test_ipc_transport_with_encryption(curve_name, tmp_path):
    """jupyter_client provisions the keys for ipc too (unix sockets, where only the file mode kept other
    users out until now)."""
    k = Kernel(curve_name, transport_encryption="required", transport="ipc",
               ip=str(tmp_path / "k"))
    try:
        assert k.km.curve_publickey is not None
        assert stream_text(k.run_ok("print('ipc')")) == "ipc\n"
        sock, mon = _client_socket(k, "shell")
        try:
            assert _handshake(mon) == "failed"
        finally:
            _close(sock, mon)
    finally:
        k.stop()


# ---- what the installed kernelspec says, and bad keys -----------------------------------------------

def _libzmq_has_curve():
    """Whether the libzmq build/looseleaf links has CURVE (the system's; pyzmq may bundle its own)."""
    import ctypes
    try:
        lib = ctypes.CDLL("libzmq.so.5")
    except OSError:
        pytest.skip("no system libzmq.so.5 to ask")
    return bool(lib.zmq_has(b"curve"))


def test_installed_kernelspec_declares_curve(tmp_path):
    import subprocess
    subprocess.run([LOOSELEAF_BIN, "install", "--dir", str(tmp_path / "ks")], check=True,
                   stdout=subprocess.DEVNULL)
    with open(tmp_path / "ks" / "kernel.json") as f:
        spec = json.load(f)
    declared = "curve" in spec["metadata"].get("supported_encryption", [])
    assert declared == _libzmq_has_curve()

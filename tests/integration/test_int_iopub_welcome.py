"""Protocol 5.5's XPUB iopub socket: every subscription is answered by an iopub_welcome
(no parent, content {"subscription": topic}, the topic as its topic frame), so a client knows when its
subscription is live instead of probing with kernel_info requests.  Compared with ipykernel 7.4, which
welcomes only the first subscriber to a topic (its XPUB is not verbose); LooseLeaf welcomes every one."""
import time

import pytest
import zmq
from jupyter_client import BlockingKernelClient
from jupyter_client.session import Session

from itest_util import REPLY_TIMEOUT


_SESSIONS = {}
_IPYKERNEL_FIRST_ONLY = "ipykernel 7.4 welcomes only the first subscriber to a topic"


def _skip_reference_without_xpub(kernel):
    """(make test-debian: Debian 12's ipykernel 6.17 has a PUB iopub socket, 7.2 made it XPUB.)"""
    import ipykernel
    if kernel.name.startswith("python3") and ipykernel.version_info < (7, 2):
        pytest.skip("ipykernel < 7.2 sends no iopub_welcome")


def _sub(kernel, topic):
    info = kernel.km.get_connection_info()
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.linger = 0
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect("%s://%s:%d" % (info["transport"], info["ip"], info["iopub_port"]))
    # A session per socket: every subscriber receives the same signed messages, which one session
    # would take for replays.
    _SESSIONS[sock] = Session(key=kernel.kc.session.key,
                              signature_scheme=kernel.kc.session.signature_scheme)
    return sock


def _next(kernel, sock, timeout=REPLY_TIMEOUT):
    """The next message on SOCK, decoded and verified with the kernel's key: (topic frames, msg)."""
    assert sock.poll(timeout * 1000), "nothing on iopub within %ss" % timeout
    session = _SESSIONS[sock]
    idents, rest = session.feed_identities(sock.recv_multipart())
    return idents, session.deserialize(rest)


def _welcome_for(kernel, sock, topic):
    """Read SOCK until the welcome for TOPIC (other output may come first); returns it."""
    deadline = time.monotonic() + REPLY_TIMEOUT
    while time.monotonic() < deadline:
        idents, msg = _next(kernel, sock)
        if msg["msg_type"] == "iopub_welcome" and msg["content"]["subscription"] == topic.decode():
            return idents, msg
    raise AssertionError("no iopub_welcome for %r" % topic)


def test_a_new_client_is_welcomed_first(kernel):
    """(The kernel's own client of itest_util subscribed before this one.)"""
    if kernel.name.startswith("python3"):
        pytest.skip(_IPYKERNEL_FIRST_ONLY)
    kc = BlockingKernelClient()
    kc.load_connection_info(kernel.km.get_connection_info())
    kc.start_channels()
    try:
        msg = kc.get_iopub_msg(timeout=REPLY_TIMEOUT)
        assert msg["msg_type"] == "iopub_welcome"
        assert msg["content"] == {"subscription": ""}
        assert msg["parent_header"] == {} and msg["metadata"] == {}
    finally:
        kc.stop_channels()


def test_topic_subscription_gets_its_welcome(kernel):
    _skip_reference_without_xpub(kernel)
    sock = _sub(kernel, b"kernel.")
    try:
        idents, msg = _welcome_for(kernel, sock, b"kernel.")
        assert idents == [b"kernel."]  # the topic frame, so that the subscriber receives it
        assert msg["parent_header"] == {}
    finally:
        sock.close()


def test_every_subscriber_is_welcomed(kernel):
    """Clients that subscribe to what another one already did (every Jupyter client subscribes to
    everything) get their welcome too, even while the kernel publishes output at full speed."""
    if kernel.name.startswith("python3"):
        pytest.skip(_IPYKERNEL_FIRST_ONLY)
    msg_id = kernel.send("execute_request", {"code": "for i in range(200000): print(i)", "silent": False,
                                             "store_history": False, "user_expressions": {},
                                             "allow_stdin": False})
    socks = []
    try:
        for _ in range(10):
            socks.append(_sub(kernel, b""))
            _welcome_for(kernel, socks[-1], b"")
        assert kernel.reply(msg_id)["content"]["status"] == "ok"
        kernel.iopub_until_idle(msg_id, timeout=120)
    finally:
        for s in socks:
            s.close()


def test_distinct_topics_while_output_streams(kernel):
    """A welcome is never lost between the senders and the watcher (gateway/ll_iopub.c): each of many
    subscriptions made while a cell prints as fast as it can is answered."""
    _skip_reference_without_xpub(kernel)
    msg_id = kernel.send("execute_request", {"code": "for i in range(200000): print(i)", "silent": False,
                                             "store_history": False, "user_expressions": {},
                                             "allow_stdin": False})
    socks = []
    try:
        for n in range(20):
            topic = b"probe.%d" % n
            socks.append(_sub(kernel, topic))
            _welcome_for(kernel, socks[-1], topic)
        assert kernel.reply(msg_id)["content"]["status"] == "ok"
        kernel.iopub_until_idle(msg_id, timeout=120)
    finally:
        for s in socks:
            s.close()


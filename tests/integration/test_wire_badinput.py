"""Bad input on the shell socket: the kernel drops it and keeps answering.

Runs in the pytest process against the real kernel (build/looseleaf) and,
where behaviour should match, against ipykernel (the `kernel` fixture of
tests/integration/conftest.py is parametrized over both).  Each case sends
raw frames on a DEALER socket of its own, then a correct kernel_info_request
on the same socket.  A kernel handles one socket's requests in order, so
when the kernel_info_reply arrives, any answer to the bad message would
already have arrived before it: no sleeping, no guessing at timeouts.
"""
import hmac
import hashlib
import json
import os
import subprocess
import time
import uuid

import pytest
import zmq
from jupyter_client.session import Session

DELIM = b"<IDS|MSG>"
REPLY_TIMEOUT = 30


class RawShell:
    """A DEALER socket on the kernel's shell port that sends arbitrary frames."""

    def __init__(self, kernel):
        km = kernel.km
        self.key = km.session.key
        self.session = Session(key=self.key, signature_scheme=km.session.signature_scheme)
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, ("raw-" + uuid.uuid4().hex).encode())
        self.sock.connect("%s://%s:%d" % (km.transport, km.ip, km.shell_port))

    def close(self):
        self.sock.close()

    def sign(self, parts):
        return hmac.new(self.key, b"".join(parts), hashlib.sha256).hexdigest().encode()

    def frames(self, msg_type, content, header=None):
        """A correctly signed message as (msg_id, [delim, sig, h, p, m, c])."""
        msg = self.session.msg(msg_type, content=content)
        if header is not None:
            msg["header"] = header
        parts = self.session.serialize(msg)
        return msg["header"].get("msg_id"), parts

    def signed_parts(self, header, parent, metadata, content):
        """Raw byte parts, signed as they are (even if not valid JSON)."""
        parts = [header, parent, metadata, content]
        return [DELIM, self.sign(parts)] + parts

    def send(self, frames):
        self.sock.send_multipart(frames)

    def recv_until_reply(self, msg_id):
        """Every message received until the reply whose parent is MSG_ID."""
        got = []
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "no reply to %s within %ss; got %s" % (
                msg_id, REPLY_TIMEOUT, [m["msg_type"] for m in got])
            if not self.sock.poll(int(left * 1000)):
                continue
            frames = self.sock.recv_multipart()
            # Replies are signed by the kernel: jupyter_client must accept them.
            _, rest = self.session.feed_identities(frames)
            msg = self.session.deserialize(rest)
            got.append(msg)
            if msg["parent_header"].get("msg_id") == msg_id:
                return got

    def assert_alive_and_no_answer_to(self, bad_ids):
        """A kernel_info_request is answered, and nothing before it answered BAD_IDS."""
        msg_id, frames = self.frames("kernel_info_request", {})
        self.send(frames)
        got = self.recv_until_reply(msg_id)
        assert got[-1]["msg_type"] == "kernel_info_reply"
        assert got[-1]["content"]["status"] == "ok"
        answered = [m for m in got[:-1] if m["parent_header"].get("msg_id") in bad_ids]
        assert not answered, "kernel answered a bad message: %s" % (
            [(m["msg_type"], m["content"]) for m in answered])
        return got


@pytest.fixture
def raw(kernel):
    r = RawShell(kernel)
    yield r
    r.close()


def _tamper_sig(frames, new_sig):
    out = list(frames)
    out[1] = new_sig
    return out


def _header(msg_type, **extra):
    h = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "t",
         "session": uuid.uuid4().hex, "date": "2026-11-30T00:00:00.000000Z", "version": "5.3"}
    h.update(extra)
    return h


def _exec_content(code):
    # stop_on_error False: a case that fails on purpose must not abort the
    # check that follows it on the test client's own socket.
    return {"code": code, "silent": False, "store_history": False, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False}


def _eval(kernel, expr):
    """text/plain of EXPR in the kernel, through user_expressions."""
    reply, _ = kernel.execute("", silent=True, store_history=False,
                              user_expressions={"v": expr})
    content = reply["content"]
    assert content["status"] == "ok", content
    return content["user_expressions"]["v"]["data"]["text/plain"]


def test_bad_signatures_dropped(raw, kernel):
    cases = []
    # Wrong HMAC (one hex digit changed).
    msg_id, frames = raw.frames("execute_request", _exec_content("bad_sig_ran = 1"))
    sig = frames[1]
    flipped = sig[:10] + (b"0" if sig[10:11] != b"0" else b"1") + sig[11:]
    cases.append((msg_id, _tamper_sig(frames, flipped)))
    # Too short, too long, not hex, empty.
    for bad in (sig[:63], sig + b"0", b"g" * 64, b"", b"x"):
        msg_id, frames = raw.frames("execute_request", _exec_content("bad_sig_ran = 1"))
        cases.append((msg_id, _tamper_sig(frames, bad)))
    # Signed with another key.
    msg_id, frames = raw.frames("execute_request", _exec_content("bad_sig_ran = 1"))
    other = hmac.new(b"not-the-key", b"".join(frames[2:6]), hashlib.sha256).hexdigest().encode()
    cases.append((msg_id, _tamper_sig(frames, other)))
    # Content altered after signing.
    msg_id, frames = raw.frames("execute_request", _exec_content("bad_sig_ran = 0"))
    frames[5] = frames[5].replace(b"bad_sig_ran = 0", b"bad_sig_ran = 1")
    cases.append((msg_id, frames))
    for _, frames in cases:
        raw.send(frames)
    raw.assert_alive_and_no_answer_to({m for m, _ in cases})
    # None of them ran.
    assert _eval(kernel, "'bad_sig_ran' in globals()") == "False"


def test_replayed_message_dropped(raw, kernel):
    msg_id, frames = raw.frames("execute_request",
                                _exec_content("replay_count = globals().get('replay_count', 0) + 1"))
    raw.send(frames)
    got = raw.recv_until_reply(msg_id)
    assert got[-1]["content"]["status"] == "ok"
    raw.send(frames)   # the very same frames again
    raw.assert_alive_and_no_answer_to({msg_id})
    assert _eval(kernel, "replay_count") == "1"


def test_malformed_framing_dropped(raw):
    msg_id, frames = raw.frames("execute_request", _exec_content("1"))
    bad = [
        frames[:3],                           # delimiter, signature, header only
        frames[:5],                           # content missing
        frames[1:],                           # no delimiter
        [b"no delimiter at all"],
        [DELIM],
        [b"", b"", b""],
    ]
    for frames_ in bad:
        raw.send(frames_)
    raw.assert_alive_and_no_answer_to({msg_id})


def test_invalid_json_dropped(raw):
    bad_ids = set()
    h = _header("execute_request")
    good_h = json.dumps(h).encode()
    bad_ids.add(h["msg_id"])
    content = json.dumps(_exec_content("1")).encode()
    cases = [
        raw.signed_parts(b"{not json", b"{}", b"{}", content),
        raw.signed_parts(good_h, b"{", b"{}", content),
        raw.signed_parts(good_h, b"{}", b"[1,", content),
        raw.signed_parts(good_h, b"{}", b"{}", b'{"code": "1"'),
        raw.signed_parts(good_h, b"{}", b"{}", b"\xff\xfe\x00garbage"),
        raw.signed_parts(good_h, b"{}", b"{}", b"[]"),         # valid JSON, not an object
        raw.signed_parts(b"[]", b"{}", b"{}", content),
    ]
    for frames in cases:
        raw.send(frames)
    raw.assert_alive_and_no_answer_to(bad_ids)


def test_header_without_msg_type(raw):
    h = _header("execute_request")
    del h["msg_type"]
    frames = raw.signed_parts(json.dumps(h).encode(), b"{}", b"{}",
                              json.dumps(_exec_content("1")).encode())
    raw.send(frames)
    raw.assert_alive_and_no_answer_to({h["msg_id"]})


def test_unparsable_version_and_duplicate_header_keys_dropped(raw, kernel):
    """A header whose version does not read as one, or that names a key twice (readers would disagree on
    which one counts), is dropped like any malformed header (issue 16).  ipykernel accepts both."""
    if kernel.name.startswith("python3"):
        pytest.skip("ipykernel does not check header.version nor duplicate keys")
    bad = []
    for extra in ({"version": "x.y"}, {"version": 5.3}, {"version": ""}):
        h = _header("execute_request", **extra)
        bad.append((h["msg_id"], json.dumps(h).encode()))
    h = _header("kernel_info_request")
    bad.append((h["msg_id"], (json.dumps(h)[:-1] + ', "msg_type": "execute_request"}').encode()))
    content = json.dumps(_exec_content("hdr_ran = 1")).encode()
    for _, htext in bad:
        raw.send(raw.signed_parts(htext, b"{}", b"{}", content))
    raw.assert_alive_and_no_answer_to({msg_id for msg_id, _ in bad})
    assert _eval(kernel, "'hdr_ran' in globals()") == "False"


def test_unknown_msg_type(raw):
    msg_id, frames = raw.frames("no_such_request", {"x": 1})
    raw.send(frames)
    raw.assert_alive_and_no_answer_to({msg_id})


def test_execute_without_code(raw, kernel):
    content = _exec_content("1")
    del content["code"]
    msg_id, frames = raw.frames("execute_request", content)
    raw.send(frames)
    got = raw.assert_alive_and_no_answer_to(set())
    # ipykernel drops it; a kernel may instead answer with an error, never "ok".
    for m in got:
        if m["parent_header"].get("msg_id") == msg_id:
            assert m["content"].get("status") == "error", m
    reply, _ = kernel.execute("40 + 2")
    assert reply["content"]["status"] == "ok"


def test_oversized_garbage(raw, kernel):
    rnd = os.urandom(1 << 20)
    garbage = [rnd * 16]                              # one 16 MiB frame
    raw.send(garbage)
    raw.send([DELIM, b"0" * 64] + [rnd] * 4)         # 4 MiB of parts, bad signature
    raw.send([DELIM] + [b"x"] * 10000)               # many tiny frames
    msg_id, frames = raw.frames("execute_request", _exec_content("big = 1"))
    frames[1] = b"f" * (1 << 20)                      # a 1 MiB "signature"
    raw.send(frames)
    raw.assert_alive_and_no_answer_to({msg_id})
    reply, msgs = kernel.execute("print('still here')")
    assert reply["content"]["status"] == "ok"
    assert any(m["msg_type"] == "stream" and "still here" in m["content"]["text"] for m in msgs)


def test_nul_in_code_not_truncated(raw, kernel):
    # Python refuses source containing a NUL byte, so a kernel that passes
    # the whole code on must report that.  A kernel that cut the code at the
    # NUL would instead run "nul_marker = 1  # " successfully.
    code = "nul_marker = 1  # \x00\nnul_marker = 2\n"
    msg_id, frames = raw.frames("execute_request", _exec_content(code))
    raw.send(frames)
    if kernel.name.startswith("python3"):
        # ipykernel 6.17 raises inside its handler and sends no reply at all
        # (ValueError from compile); it must still be alive.
        raw.assert_alive_and_no_answer_to(set())
    else:
        reply = raw.recv_until_reply(msg_id)[-1]
        assert reply["content"]["status"] == "error", reply["content"]
        assert "null" in reply["content"]["evalue"].lower(), reply["content"]
    assert _eval(kernel, "'nul_marker' in globals()") == "False"


def test_ipc_transport(kernel_name, jupyter_env, tmp_path):
    """A connection file with transport "ipc" (endpoints ipc://<ip>-<port>)."""
    from jupyter_client import KernelManager
    from itest_util import kernel_env
    km = KernelManager(kernel_name=kernel_name, transport="ipc", ip=str(tmp_path / "kernel"))
    km.start_kernel(env=kernel_env())
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute("print(6 * 7)")
        reply = kc.get_shell_msg(timeout=REPLY_TIMEOUT)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=REPLY_TIMEOUT)
        assert reply["content"]["status"] == "ok"
        sockets = sorted(p.name for p in tmp_path.iterdir())
        assert sockets == sorted("kernel-%d" % port for port in
                                 (km.shell_port, km.iopub_port, km.stdin_port,
                                  km.control_port, km.hb_port))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


_GOOD_CONNECTION = {"transport": "tcp", "ip": "127.0.0.1", "shell_port": 1, "iopub_port": 2,
                    "stdin_port": 3, "control_port": 4, "hb_port": 5, "key": "k",
                    "signature_scheme": "hmac-sha256", "kernel_name": "looseleaf"}


def _without(field):
    c = dict(_GOOD_CONNECTION)
    del c[field]
    return c


@pytest.mark.parametrize("content, field", [
    (_without("key"), '"key"'),
    (_without("hb_port"), '"hb_port"'),
    (dict(_GOOD_CONNECTION, shell_port=70000), '"shell_port"'),
    (dict(_GOOD_CONNECTION, iopub_port="5555"), '"iopub_port"'),
    (dict(_GOOD_CONNECTION, signature_scheme="hmac-md5"), '"signature_scheme"'),
    (dict(_GOOD_CONNECTION, transport="udp"), '"transport"'),
    (dict(_GOOD_CONNECTION, ip=""), '"ip"'),
    ("{not json", "invalid JSON"),
    (None, "No such file"),
], ids=["no-key", "no-hb_port", "port-range", "port-type", "scheme", "transport", "empty-ip",
        "bad-json", "unreadable"])
def test_bad_connection_file_stops_kernel(looseleaf_bin, tmp_path, content, field):
    """The kernel exits with an error naming the field instead of running half-configured."""
    path = tmp_path / "kernel.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        path.chmod(0o600)  # as Jupyter writes it (a file others may read is refused before its fields)
    # Port numbers 1..5 are never bound: validation fails before any socket exists.
    proc = subprocess.run([looseleaf_bin, "-f", str(path)], capture_output=True, timeout=60)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode != 0, err
    assert field in err, err
    assert str(path) in err, err


def test_empty_key_runs_unsigned(kernel_name, jupyter_env):
    """An empty key: messages go unsigned both ways, as Jupyter allows."""
    from jupyter_client import KernelManager
    from itest_util import kernel_env
    # looseleaf runs unsigned only when told to (an empty key lets anyone run code): its kernelspec then passes
    # --allow-empty-key.
    km = KernelManager(kernel_name=kernel_name + "-unsigned" if kernel_name == "looseleaf" else kernel_name)
    km.session.key = b""
    km.start_kernel(env=kernel_env())
    with open(km.connection_file) as f:
        assert json.load(f)["key"] == ""
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute("print('unsigned ok')")
        reply = kc.get_shell_msg(timeout=REPLY_TIMEOUT)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=REPLY_TIMEOUT)
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)

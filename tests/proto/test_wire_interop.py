"""ll_wire against jupyter_client's Session, in both directions.

Runs in the pytest process; drives build/tests/proto/wire_echo (a C program
built from proto/), which decodes each message with ll_session_decode and
answers with an echo_reply made by ll_msg_new + ll_session_encode.  Session
serializes the requests and must accept (signature included) and decode the
replies to the same values: unicode, NUL and control characters, floats in
shortest form, 64-bit integers, nesting, large text, binary buffers.
"""
import json
import os
import struct
import subprocess
import uuid

import pytest
from jupyter_client.session import Session

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ECHO = os.path.join(REPO, "build", "tests", "proto", "wire_echo")


def _pack(frames):
    out = [struct.pack("<I", len(frames))]
    for f in frames:
        f = bytes(f)
        out.append(struct.pack("<I", len(f)))
        out.append(f)
    return b"".join(out)


def _unpack_all(data):
    msgs, pos = [], 0
    while pos < len(data):
        (n,), pos = struct.unpack_from("<I", data, pos), pos + 4
        frames = []
        for _ in range(n):
            (size,), pos = struct.unpack_from("<I", data, pos), pos + 4
            frames.append(data[pos:pos + size])
            pos += size
        msgs.append(frames)
    return msgs


def _echo(key, requests):
    """Send each frame list through wire_echo; return the list of answers."""
    if not os.access(ECHO, os.X_OK):
        pytest.fail("%s is not built (run `make all`)" % ECHO)
    env = dict(os.environ, LL_WIRE_KEY=key.decode())
    proc = subprocess.run([ECHO], input=b"".join(_pack(r) for r in requests),
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    answers = _unpack_all(proc.stdout)
    assert len(answers) == len(requests)
    return answers


def _canonical(value):
    """JSON text that tells 1 from 1.0 and 0.0 from -0.0."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


CONTENTS = [
    {"code": "print('hi')", "silent": False},
    {"text": "h\u00e9llo \u2603 \U0001d11e \u4e2d\u6587 \u2028\u2029 \ufeff"},
    {"text": "nul\x00in\x00side", "ctrl": "".join(chr(c) for c in range(32)) + "\x7f\"\\/"},
    {"floats": [0.1, 1.0, -0.0, 1e-300, 1.7976931348623157e308, 5e-324, 1 / 3, 123456789.125,
                1e16, 1e22, 2.5e-7]},
    {"ints": [0, -1, 2 ** 53 + 1, 2 ** 63 - 1, -2 ** 63], "bools": [True, False, None]},
    {"nested": {"a": [{"b": [[], {}, [[[]]]]}], "k\u00e9y \"quoted\"\n": {"": ""}}},
    {"big": "0123456789abcdef\n" * 65536},
    {},
]


@pytest.mark.parametrize("key", [uuid.uuid4().hex.encode(), b""], ids=["signed", "unsigned"])
def test_roundtrip_through_ll_wire(key):
    session = Session(key=key, username="interop")
    requests, sent = [], []
    for i, content in enumerate(CONTENTS):
        msg = session.msg("echo_request", content=content,
                          metadata={"i": i, "tag": "m\u00e9ta"})
        frames = session.serialize(msg, ident=[b"peer-%d" % i, b"\x00\xffbin"])
        buffers = [os.urandom(i * 100), b""] if i % 2 else []
        requests.append(frames + buffers)
        sent.append((msg, buffers))
    answers = _echo(key, requests)
    for (msg, buffers), frames in zip(sent, answers):
        assert not frames[0].startswith(b"ERR"), frames[0]
        idents, rest = session.feed_identities(frames)
        assert idents == [b"peer-%d" % sent.index((msg, buffers)), b"\x00\xffbin"]
        if key:
            assert len(rest[0]) == 64   # hex HMAC, checked by deserialize below
        reply = session.deserialize(rest)
        assert reply["msg_type"] == "echo_reply"
        assert reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
        assert _canonical(reply["content"]) == _canonical(msg["content"])
        assert _canonical(reply["metadata"]) == _canonical(msg["metadata"])
        assert [bytes(b) for b in reply["buffers"]] == buffers
        header = reply["header"]
        assert header["version"] == "5.5"
        assert header["date"].tzinfo is not None          # ISO 8601 with Z, parsed by jupyter_client
        assert uuid.UUID(header["msg_id"]).version == 4
        assert uuid.UUID(header["session"])
        # Compact UTF-8 on the wire: no spaces after separators, no \\u escapes of non-ASCII.
        content_frame = rest[4]
        if msg["content"].get("text", "").startswith("h\u00e9llo"):
            assert "h\u00e9llo".encode() in content_frame
        assert b'": ' not in rest[1]


def test_decode_rejections_reach_the_caller():
    key = b"k" * 32
    session = Session(key=key)
    good = session.serialize(session.msg("x", content={"a": 1}))
    bad_sig = list(good)
    bad_sig[1] = b"0" * 64
    other_key = Session(key=b"other").serialize(session.msg("x", content={}))
    huge_int = list(session.serialize(session.msg("x", content={})))
    huge_int[5] = b'{"n": 123456789012345678901234567890}'
    huge_int[1] = session.sign(huge_int[2:6])
    answers = _echo(key, [good, good, bad_sig, other_key, good[:4], good[1:], huge_int])
    assert not answers[0][0].startswith(b"ERR")
    reasons = [a[0].decode() for a in answers[1:]]
    assert "replayed" in reasons[0]
    assert "does not match" in reasons[1]
    assert "does not match" in reasons[2]
    assert "need at least 5" in reasons[3]
    assert "delimiter" in reasons[4]
    # jansson holds integers in 64 bits; a larger one is refused, not wrapped.
    assert "content: invalid JSON" in reasons[5]

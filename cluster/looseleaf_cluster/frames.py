"""The frames LooseLeaf's processes speak (proto/ll_zframe.h): a 4-byte big-endian length, then one compact
JSON object.  Blocking helpers for the cluster's relays (Python threads, one per direction)."""
import json
import struct

FRAME_MAX = 256 << 20  # LL_ZFRAME_MAX


class FrameError(RuntimeError):
    """The peer closed the connection or sent a bad frame."""


def encode(obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


def send(sock, obj):
    sock.sendall(encode(obj))


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise FrameError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def recv(sock, limit=FRAME_MAX):
    (n,) = struct.unpack(">I", recv_exact(sock, 4))
    if n > limit:
        raise FrameError("frame of %d bytes (at most %d)" % (n, limit))
    try:
        return json.loads(recv_exact(sock, n))
    except ValueError as e:
        raise FrameError("bad frame: %s" % e) from None

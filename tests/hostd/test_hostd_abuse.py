"""`looseleaf hostd` against clients that lie or misbehave (issue 23, 3.1 and 3.2).

The broker runs as root and any local user may connect to it, so no client may freeze it, lease itself a slot
the broker did not lend it, make it act on a field it got wrong, or make it hold much memory.  Each test is a
reproduction of what a fault and abuse probe found:
- a client shrinks its receive buffer, sends `stats` for seconds and never reads: the broker answers everyone
  else meanwhile, and drops that client;
- a `hello` claiming slots another user's pool holds (or that nobody lent it) adopts none of them; after a
  restart, the broker adopts what it had lent, to whom it lent it (its record), and nothing else;
- `nslots` of -5 or 1000, a `slot` of 2^40 (0 once truncated): refused, nothing changes;
- a frame far above what the protocol needs is refused at its header (the broker's memory does not grow), and
  one user holds at most 8 connections;
- idle TCP connections to `/metrics` do not stop it from answering.
The misbehaving clients run as `nobody` (setpriv); the well-behaved pool is a raw connection of root's.  Root
only (as the rest of tests/hostd); ~40 s, all waits polled.
"""
import json
import os
import select
import socket
import struct
import subprocess
import sys
import time

import pytest

import hdhelp
from hdhelp import User, recv_frame, reply_ok, send_frame, stdout, wait_for

pytestmark = pytest.mark.skipif(not hdhelp.usable(), reason="needs root, useradd and setpriv (real OS users)")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


class RawPool:
    """A pool of root's speaking the protocol itself on its own connection (every reply read in time)."""

    def __init__(self, hostd, nslots=1, held=()):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(hostd.socket)
        self.welcome = self.ask({"type": "hello", "nslots": nslots, "pid": os.getpid(),
                                 "held": [{"slot": k, "idle": True, "value": 0} for k in held]})
        assert self.welcome["type"] == "welcome", self.welcome

    def ask(self, frame):
        send_frame(self.s, frame)
        return recv_frame(self.s)

    def grant(self):
        """Wants one slot, and gets it (nobody else holds one)."""
        g = self.ask({"type": "want", "n": 1, "prefetch": 0})
        assert g["type"] == "grant", g
        return g["slot"]

    def close(self):
        self.s.close()


def as_nobody(script, *args, **kw):
    """Run python SCRIPT as nobody; the Popen (stdout: text lines)."""
    return subprocess.Popen(NOBODY + [sys.executable, "-c", script] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def nobody_json(script, *args):
    p = as_nobody(script, *args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def leases(hostd):
    return sorted((l["slot"], l["uid"]) for l in hostd.stats()["lease_list"])


FRAMES = r"""
import json, socket, struct, sys
def send(s, o):
    d = json.dumps(o).encode(); s.sendall(struct.pack(">I", len(d)) + d)
def recv(s):
    def exact(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise ConnectionError("closed")
            b += c
        return b
    return json.loads(exact(struct.unpack(">I", exact(4))[0]))
def connect(path):
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(path); return s
"""

# Shrinks its receive buffer, sends `stats` for SECONDS without reading a byte, then waits (up to 60 s) for the
# broker to hang up on it.  Prints "sending", then "dropped" (or "kept").
NEVER_READS = FRAMES + r"""
import select, time
path, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
s.connect(path)
s.setblocking(False)
frame = json.dumps({"type": "stats"}).encode()
frame = struct.pack(">I", len(frame)) + frame
print("sending", flush=True)
end, pending = time.monotonic() + seconds, b""
while time.monotonic() < end:
    try:
        pending = pending or frame
        pending = pending[s.send(pending):]
    except BlockingIOError:
        time.sleep(0.001)
    except OSError:
        break
p = select.poll(); p.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
gone = any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in p.poll(60000))
print("dropped" if gone else "kept", flush=True)
"""


def test_client_that_never_reads_cannot_freeze_the_broker(hostd):
    pool = RawPool(hostd)
    slot = pool.grant()
    abuser = as_nobody(NEVER_READS, hostd.socket, 5)
    try:
        assert abuser.stdout.readline().strip() == "sending"
        # While it sends (and after), everyone else is answered: stats, and a pool's release and want.
        deadline = time.monotonic() + 7
        rounds = 0
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            assert hostd.stats()["slots"] == 2  # (a 5 s socket timeout: an OSError if the broker hangs)
            send_frame(pool.s, {"type": "release", "slot": slot})
            slot = pool.grant()
            rounds += 1
            assert time.monotonic() - t0 < 5
            time.sleep(0.1)
        assert rounds >= 10
        # The client that took nothing is dropped; the pool keeps its lease.
        assert abuser.stdout.readline().strip() == "dropped"
        assert abuser.wait(30) == 0
        assert "dropping it" in hostd.log()
        assert leases(hostd) == [(slot, 0)]
    finally:
        abuser.kill()
        abuser.wait()
        pool.close()


CLAIM = FRAMES + r"""
s = connect(sys.argv[1])
send(s, {"type": "hello", "nslots": 2, "pid": 1, "held": [{"slot": 0, "idle": False}, {"slot": 1, "idle": True}]})
print(json.dumps(recv(s)))
"""


def test_hello_cannot_claim_slots_the_broker_did_not_lend(hostd):
    pool = RawPool(hostd)
    slot = pool.grant()
    assert slot == 0
    # nobody claims slot 0 (root's) and slot 1 (free, but never lent to it): neither is adopted.
    welcome = nobody_json(CLAIM, hostd.socket)
    assert welcome["type"] == "welcome" and welcome["adopted"] == [], welcome
    assert leases(hostd) == [(0, 0)]
    # A restart (killed: no goodbye): root's pool claims its slot back and gets it; nobody's claim on it is
    # refused even while root's pool has not come back yet (the record says whose it was).
    hostd.kill()
    pool.close()
    hostd.start()
    welcome = nobody_json(CLAIM, hostd.socket)
    assert welcome["adopted"] == [], welcome
    again = RawPool(hostd, nslots=1, held=[0])
    try:
        assert again.welcome["adopted"] == [0]
        assert leases(hostd) == [(0, 0)]
    finally:
        again.close()


FIELDS = FRAMES + r"""
s = connect(sys.argv[1])
out = []
for n in (-5, 1000, "2"):
    send(s, {"type": "hello", "nslots": n}); out.append(recv(s))
send(s, {"type": "hello", "nslots": 1}); out.append(recv(s))
send(s, {"type": "want", "n": 1}); g = recv(s); out.append(g)
for slot in (2 ** 40 + g["slot"], 2 ** 32 + g["slot"], -1, 2):
    send(s, {"type": "release", "slot": slot}); out.append(recv(s))
send(s, {"type": "mark", "slot": g["slot"], "idle": True, "value": 0, "pid": 2 ** 40}); out.append(recv(s))
send(s, {"type": "stats"}); out.append(recv(s))
print(json.dumps(out))
"""


def test_fields_out_of_range_are_refused(hostd):
    out = nobody_json(FIELDS, hostd.socket)
    for r, what in zip(out[:3], ("-5", "1000", "integer")):
        assert r["type"] == "error" and "nslots" in r["error"] and what in r["error"], r
    assert out[3]["type"] == "welcome"
    g = out[4]
    assert g["type"] == "grant"
    for r in out[5:10]:
        assert r["type"] == "error", r
    assert str(2 ** 40 + g["slot"]) in out[5]["error"]
    # Nothing changed: the lease is still nobody's.
    st = out[10]
    assert [(l["slot"], l["uid"]) for l in st["lease_list"]] == [(g["slot"], 65534)]


# Each of N connections sends the header of a 200 MiB frame, then up to 32 MiB of it.  Prints, per
# connection, how many bytes the broker took before it hung up (or "kept").
BIG_FRAMES = FRAMES + r"""
import threading
path, n = sys.argv[1], int(sys.argv[2])
res = [None] * n
def one(i):
    try:
        s = connect(path)
    except OSError as e:
        res[i] = "refused"; return
    s.settimeout(10)
    sent = 0
    try:
        s.sendall(struct.pack(">I", 200 << 20))
        chunk = b"x" * (1 << 20)
        while sent < (32 << 20):
            s.sendall(chunk); sent += len(chunk)
        res[i] = "kept"
    except OSError:
        res[i] = sent
    s.close()
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(res))
"""

MANY = FRAMES + r"""
path = sys.argv[1]
conns, answered = [], 0
for i in range(20):
    try:
        conns.append(connect(path))
    except OSError:
        pass
for c in conns:
    try:
        send(c, {"type": "stats"}); recv(c); answered += 1
    except OSError:
        pass
print(json.dumps(answered))
"""


def test_frames_and_connections_are_bounded(hostd):
    before = rss_kib(hostd.proc.pid)
    res = nobody_json(BIG_FRAMES, hostd.socket, 4)
    # Each is hung up on at its header, having sent little (what the sockets hold), never 32 MiB.
    assert all(isinstance(r, int) and r < (8 << 20) for r in res), res
    assert rss_kib(hostd.proc.pid) - before < 32 * 1024, (before, rss_kib(hostd.proc.pid))
    assert "dropping it" in hostd.log()
    # One user holds at most 8 connections at once.
    assert nobody_json(MANY, hostd.socket) == 8
    # ... and none of it stopped the broker.
    assert hostd.stats()["slots"] == 2


def test_idle_metrics_connections_do_not_block_it(hostd):
    idle = []
    try:
        for _ in range(20):
            c = socket.create_connection(("127.0.0.1", hostd.metrics_port), timeout=5)
            idle.append(c)
        status, text = hostd.http("/metrics")
        assert status == 200 and "looseleaf_hostd_slots 2" in text
        # An idle connection does not live for ever either: the broker hangs up on it.
        last = idle[-1]
        last.settimeout(30)
        assert last.recv(1) == b""
    finally:
        for c in idle:
            c.close()
    # And the unix socket was answered all along.
    assert hostd.stats()["slots"] == 2


def test_pool_gives_up_a_slot_the_broker_does_not_adopt(bins, hostd):
    """A real pool whose warm worker's lease the broker does not know after a restart (its record gone): the
    pool gives that slot up (the worker is evicted, its state committed), says nothing of it to the broker (no
    refused request), and its next cell runs on a slot the broker lends."""
    u = User("llhd%05dg" % (os.getpid() % 100000), bins, hostd.socket)
    try:
        c = u.client("g1")
        assert reply_ok(c.run("c1", "x = 41"))
        wait_for(lambda: [l["state"] for l in hostd.stats()["lease_list"]] == ["warm"], 10, "the warm lease")
        hostd.kill()
        if os.path.exists(hostd.socket + ".leases"):  # (what the broker recorded of the lease)
            os.unlink(hostd.socket + ".leases")
        hostd.start()
        wait_for(lambda: "did not adopt" in u.log(), 15, "the pool to give its slot up")
        wait_for(lambda: hostd.stats()["leases"] == 0, 15, "the slot to be free")
        ev = c.run("c2", "print(x + 1)", state_closure=["x"])
        assert reply_ok(ev) and stdout(ev) == "42\n", ev
        assert "refused a request" not in u.log()
    finally:
        u.close()

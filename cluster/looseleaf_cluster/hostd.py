"""A client of one host's ``looseleaf hostd`` (the slot broker; hostd/API.md): frames are a 4-byte big-endian
length and one JSON object.  Two uses: ``stats`` (what ``looseleaf top --json`` prints; anyone may ask), and a
``Lease`` connection that registers like a pool (``hello``) and borrows slots (``want`` -> ``grant``/``wait``,
``mark``, ``release``), so the broker counts the cluster's requests with its users' own and its policy and
``looseleaf top`` see them."""
import json
import os
import socket
import struct
import time

FRAME_MAX = 16 * 1024  # LL_HOSTD_FRAME_MAX: the broker refuses longer frames


class HostdError(RuntimeError):
    """The broker refused a request, closed the connection, or does not answer."""


def send_frame(sock, obj):
    data = json.dumps(obj).encode()
    if len(data) > FRAME_MAX:
        raise HostdError("frame of %d bytes is over the broker's %d" % (len(data), FRAME_MAX))
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv_frame(sock):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise HostdError("the broker closed the connection")
            buf += chunk
        return buf
    (n,) = struct.unpack(">I", exact(4))
    if n > 1 << 20:
        raise HostdError("frame of %d bytes from the broker" % n)
    return json.loads(exact(n))


def _connect(path, timeout):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise HostdError("hostd %s does not answer: %s" % (path, e)) from e
    return s


def stats(path, timeout=5.0):
    """The broker's ``hostd_stats``."""
    try:
        with _connect(path, timeout) as s:
            send_frame(s, {"type": "stats"})
            return recv_frame(s)
    except (OSError, ValueError) as e:
        raise HostdError("hostd %s: %s" % (path, e)) from e


def load(st):
    """What placement needs of a host from its broker's stats: slots, busy and warm leases (a lease being
    taken back counts as busy until it is released), cells waiting."""
    leases = st.get("lease_list", [])
    warm = sum(1 for lease in leases if lease.get("state") == "warm")
    return {"slots": int(st["slots"]), "busy": len(leases) - warm, "warm": warm,
            "queued": int(st.get("waiting", 0))}


class Lease:
    """One registered connection to the broker, holding at most NSLOTS leases: the cluster's share of the
    host.  Not thread-safe: its owner serialises calls."""

    def __init__(self, path, nslots, timeout=10.0):
        self.path = path
        self.timeout = timeout
        self.sock = _connect(path, timeout)
        self.held = set()
        self.revoked = set()  # slots the broker asked back while we held them (see take's caller)
        send_frame(self.sock, {"type": "hello", "nslots": nslots, "pid": os.getpid(), "held": []})
        w = self._reply()
        if w.get("type") != "welcome":
            raise HostdError("hostd %s did not welcome us: %s" % (path, w))
        self.slots = int(w["slots"])
        self.nslots = nslots

    def _reply(self, deadline=None):
        """The next frame meant as an answer; a ``revoke`` of a slot we hold is noted and skipped."""
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HostdError("hostd %s did not answer in time" % self.path)
                self.sock.settimeout(left)
            m = recv_frame(self.sock)
            if m.get("type") == "revoke":
                self.revoked.add(m.get("slot"))
                continue
            if m.get("type") == "error":
                raise HostdError("hostd %s refused: %s" % (self.path, m.get("error")))
            return m

    def take(self, timeout=None):
        """A slot leased from the broker (its number), marked busy; None when the broker answers ``wait``
        (no free slot for us now)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        send_frame(self.sock, {"type": "want", "n": 1, "prefetch": 0})
        m = self._reply(deadline)
        while m.get("type") == "wait" and m.get("revoking"):
            m = self._reply(deadline)  # the broker takes a slot back for us: its grant follows
        if m.get("type") == "wait":
            # No slot for us now: we no longer wait (the placer tries another host).  A grant the broker
            # sent before it read this comes as the answer to our next want, so no lease is lost.
            send_frame(self.sock, {"type": "want", "n": 0, "prefetch": 0})
            return None
        if m.get("type") != "grant":
            raise HostdError("hostd %s: unexpected %s" % (self.path, m))
        slot = int(m["slot"])
        self.held.add(slot)
        send_frame(self.sock, {"type": "mark", "slot": slot, "idle": False, "value": 0, "pid": os.getpid(),
                               "cells": 1, "prefetch": False})
        return slot

    def give_back(self, slot):
        if slot not in self.held:
            raise HostdError("slot %s is not held" % slot)
        send_frame(self.sock, {"type": "release", "slot": slot})
        self.held.discard(slot)
        self.revoked.discard(slot)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# -- cluster leases (hostd/API.md, "Cluster leases") ------------------------------------------------------

class LeaseRefused(HostdError):
    """A hostd refused to issue or redeem a cluster lease; the message says why (bad signature, replayed,
    expired, another host's, another user's, no cluster key)."""


def _ask(path, frame, want, timeout):
    try:
        with _connect(path, timeout) as s:
            send_frame(s, frame)
            m = recv_frame(s)
    except (OSError, ValueError) as e:
        raise HostdError("hostd %s: %s" % (path, e)) from e
    if m.get("type") == "error":
        raise LeaseRefused("hostd %s: %s" % (path, m.get("error")))
    if m.get("type") != want:
        raise HostdError("hostd %s: unexpected %s" % (path, m))
    return m


def issue_lease(path, target, request, ttl_s=None, uid=None, timeout=5.0):
    """A lease, signed by the hostd at PATH (this host's), for host TARGET to run REQUEST's worker for the
    calling process's user (the hostd knows it by SO_PEERCRED; only root may name another UID).  The lease
    is a dict to hand, as it is, to TARGET (e.g. through Ray), where ``redeem_lease`` spends it."""
    frame = {"type": "lease_issue", "target": target, "request": request}
    if ttl_s is not None:
        frame["ttl_s"] = int(ttl_s)
    if uid is not None:
        frame["uid"] = int(uid)
    return _ask(path, frame, "lease", timeout)["lease"]


def redeem_lease(path, lease, timeout=5.0):
    """Have the hostd at PATH (the target host's) check LEASE and spend it (once only): {"uid", "user",
    "issuer", "target", "request", "expires"} as the lease says, now verified.  Raises LeaseRefused (forged,
    altered, replayed, expired, for another host, for another uid than the caller's unless root)."""
    m = _ask(path, {"type": "lease_redeem", "lease": lease}, "redeemed", timeout)
    m.pop("type", None)
    return m

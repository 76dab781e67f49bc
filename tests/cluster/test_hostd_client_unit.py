"""The agent's broker client (looseleaf_cluster.hostd.Lease) against a scripted broker speaking hostd/API.md's
frames: a `wait` while the broker takes a slot back for us is followed by its grant (we hold on); a plain
`wait` withdraws our want; a `revoke` met while waiting for an answer is noted.  No Ray, no root."""
import os
import socket
import sys
import tempfile
import threading

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "cluster"))

from looseleaf_cluster import hostd  # noqa: E402


def scripted_broker(path, script, seen):
    """Serve one connection at PATH: for each (expected type, replies) of SCRIPT read a frame of that type
    (recorded in SEEN) and send REPLIES."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.settimeout(10)
        with conn, srv:
            for want_type, replies in script:
                m = hostd.recv_frame(conn)
                seen.append(m)
                assert m["type"] == want_type, (m, want_type)
                for r in replies:
                    hostd.send_frame(conn, r)
            try:
                while True:
                    seen.append(hostd.recv_frame(conn))
            except (hostd.HostdError, OSError):
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_lease_holds_on_while_the_broker_revokes_for_it():
    d = tempfile.mkdtemp(prefix="llc-unit-")
    path = os.path.join(d, "hostd.sock")
    seen = []
    welcome = {"type": "welcome", "slots": 2, "adopted": [], "cuda": False, "slot_map": []}
    t = scripted_broker(path, [
        ("hello", [welcome]),
        ("want", [{"type": "wait", "revoking": True, "prefetch": False},
                  {"type": "revoke", "slot": 7},
                  {"type": "grant", "slot": 1, "prefetch": False}]),
        ("mark", []),
        ("want", [{"type": "wait", "revoking": False, "prefetch": False}]),
        ("want", []),
        ("release", []),
    ], seen)
    try:
        lease = hostd.Lease(path, 2, timeout=10)
        assert lease.slots == 2
        assert lease.take() == 1  # not None: the broker's revocation for us ends in a grant
        assert 7 in lease.revoked
        assert lease.take() is None  # a plain wait: no slot for us now
        lease.give_back(1)
        lease.close()
        t.join(10)
        assert [m["type"] for m in seen] == ["hello", "want", "mark", "want", "want", "release"], seen
        assert seen[2]["slot"] == 1 and seen[2]["idle"] is False  # the grant marked busy
        assert seen[4]["n"] == 0  # the want withdrawn after the plain wait
        assert seen[5]["slot"] == 1
    finally:
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)

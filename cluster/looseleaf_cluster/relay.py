"""The GPU host's side of remote cells: a relay, run as the user U whose cells it carries, in the host's
network, between the user's cluster pool on the kernels' host (remote.py, over TCP) and U's host pool on this
host (``looseleaf pool``, on its unix socket, started on demand like a kernel starts it).

    kernels' host                          GPU host B (this process runs here, as U)
    cluster pool (remote.py) ──TCP──▶ relay ──unix──▶ U's host pool on B ──fork──▶ worker (as U)

The host's agent (agent.py, a Ray actor) starts one relay per user once ``authorize_remote_user`` accepted
the request, and hands its port and a secret token back through Ray (token-authenticated); the relay takes a
connection only after its first frame carries that token (``relay_hello``), then carries the pool's frames
both ways untouched (the pool's protocol, zygote/API.md): the pool cannot tell a remote kernel from a local
one, so cells on B run exactly as they would for a kernel on B.  It ends when its agent goes (its stdin, a
pipe from the agent, closes).

    python -m looseleaf_cluster.relay --bind ADDR --host NAME --runtime-dir DIR --looseleaf EXE
    (token on stdin's first line; prints {"port": N} once it listens)
"""
import argparse
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time

from looseleaf_cluster import frames

HELLO_TIMEOUT = 10.0  # s a new connection may take to say who it is


def keepalive(sock, idle=5, interval=2, count=3):
    """A peer that vanished without closing (a host powered off) is noticed within idle + interval * count s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def pump(src, dst):
    """Copy bytes SRC -> DST until either side ends, then end both directions."""
    try:
        while True:
            data = src.recv(1 << 20)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Relay:
    def __init__(self, host, runtime_dir, exe, token):
        self.host = host
        self.dir = runtime_dir
        self.exe = exe
        self.token = token.encode()
        self.lock = threading.Lock()  # one pool start at a time

    def pool_socket(self):
        return os.path.join(self.dir, "pool.sock")

    def _connect_pool(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.pool_socket())
        except OSError:
            s.close()
            return None
        return s

    def pool(self):
        """A connection to the user's host pool here, started when none runs (as ll_zclient_connect does)."""
        with self.lock:
            s = self._connect_pool()
            if s is not None:
                return s
            r = subprocess.run([self.exe, "pool", "--runtime-dir", self.dir], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError("the host pool on %s did not start (status %d): %s (see %s/pool.log)" % (
                    self.host, r.returncode, (r.stderr or r.stdout).strip()[-500:], self.dir))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                s = self._connect_pool()
                if s is not None:
                    return s
                time.sleep(0.02)
            raise RuntimeError("the host pool on %s did not come up at %s" % (self.host, self.pool_socket()))

    def serve(self, conn):
        try:
            conn.settimeout(HELLO_TIMEOUT)
            hello = frames.recv(conn, limit=4096)
            tok = str(hello.get("token", "")).encode() if isinstance(hello, dict) else b""
            if not isinstance(hello, dict) or hello.get("type") != "relay_hello" or \
                    not hmac.compare_digest(tok, self.token):
                frames.send(conn, {"type": "relay_error", "error": "refused: bad relay token"})
                conn.close()
                return
            try:
                pool = self.pool()
            except Exception as e:  # noqa: BLE001 - said to the peer, which names the host
                frames.send(conn, {"type": "relay_error", "error": str(e)})
                conn.close()
                return
            frames.send(conn, {"type": "relay_welcome", "host": self.host, "pid": os.getpid()})
            conn.settimeout(None)
            keepalive(conn)
        except (OSError, frames.FrameError, ValueError):
            conn.close()
            return
        t = threading.Thread(target=pump, args=(pool, conn), daemon=True)
        t.start()
        pump(conn, pool)
        t.join()
        conn.close()
        pool.close()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m looseleaf_cluster.relay")
    ap.add_argument("--bind", required=True, help="this host's address in the cluster")
    ap.add_argument("--host", required=True, help="this host's name")
    ap.add_argument("--runtime-dir", required=True, help="the user's host pool's runtime dir here")
    ap.add_argument("--looseleaf", required=True, help="the looseleaf binary (starts the pool)")
    a = ap.parse_args(argv)
    token = sys.stdin.readline().strip()
    if len(token) < 32:
        print(json.dumps({"error": "no token on stdin"}), flush=True)
        return 2
    relay = Relay(a.host, a.runtime_dir, a.looseleaf, token)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((a.bind, 0))
    srv.listen(64)
    print(json.dumps({"port": srv.getsockname()[1], "pid": os.getpid()}), flush=True)

    def watch_agent():  # the agent holds our stdin: when it goes, so do we
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch_agent, daemon=True).start()
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=relay.serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())

"""The user's *cluster pool* on the kernels' host: what a kernel in cluster mode (LOOSELEAF_CLUSTER=HEAD:PORT)
talks to instead of a host pool.  It speaks the host pool's protocol (zygote/API.md) on its unix socket, so the
kernel's relay of GPU cells (gateway/ll_route.c) is unchanged, and sends each cell to a GPU host:

    kernel ──unix (pool.sock)──▶ cluster pool (this, as the user) ──TCP──▶ relay on host B (as the user)
                                   │ Ray driver: agents' loads,                └─unix─▶ user's host pool on B
                                   │ ll_place's rule, relay addresses                   └─fork─▶ worker
                                   └─ Redis forward: TCP on this host ──unix──▶ the kernel's redis-server

- Placement: a run (or prefetch) of session S goes to S's home host (where its warm worker is) when it is
  alive; otherwise the host ``ll_place_choose`` picks from every agent's load (the most loaded host with a
  free slot: consolidation).  The host's own pool then leases its slot from the host's hostd, as for a local
  user, so the broker counts it and the next placement sees it.
- Carrying: one TCP connection per (kernel, host) to the user's relay on that host (agent.relay, through Ray:
  address and token), on which the kernel's frames go as they are, but for the store's address: the
  kernel's private redis-server (a unix socket here) is forwarded on this host's cluster address and the
  run's ``redis_url`` becomes ``redis://looseleaf:PASSWORD@ADDR:PORT`` (the ACL user of the kernel's server,
  its password from ``redis.pass`` beside the socket).  Events come back as they are;
  ``reply.metadata.looseleaf.host`` names the host.  interrupt, cancel and input replies follow their cell.
- A host that goes while a cell runs there (its connection breaks) ends the cell with ``HostGone`` naming the
  host; the session's next cell is placed among the live hosts and restores from the committed versions.

Started by the kernel (ll_zclient_connect, posix_spawn) as
    python -m looseleaf_cluster.remote --runtime-dir DIR --address HEAD:PORT --build ID
and detached like a host pool: DIR/pool.sock, pool.lock, pool.build, pool.log; it exits LL_POOL_IDLE_EXIT
(300) s after its last kernel left.
"""
import argparse
import fcntl
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
import traceback

from looseleaf_cluster import HostGone, NoHost, frames, place
from looseleaf_cluster.relay import keepalive, pump

log = logging.getLogger("looseleaf.cluster")


def _peer_uid(sock):
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class RedisForward:
    """The kernel's private redis-server (unix socket PATH) on ADDR:port, for workers on other hosts.  Only
    the server's ACL user gets in (its password), as on the socket."""

    def __init__(self, path, addr):
        self.path = path
        d = os.path.dirname(path)
        with open(os.path.join(d, "redis.pass")) as f:
            self.password = f.readline().strip()
        self.srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind((addr, 0))
        self.srv.listen(64)
        self.addr = addr
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self):
        return "redis://looseleaf:%s@%s:%d" % (self.password, self.addr, self.port)

    def _accept(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(self.path)
            except OSError:
                conn.close()
                up.close()
                continue
            keepalive(conn)
            threading.Thread(target=pump, args=(conn, up), daemon=True).start()
            threading.Thread(target=pump, args=(up, conn), daemon=True).start()

    def close(self):
        self.srv.close()


class ClusterPool:
    """What every kernel connection shares: the Ray driver, the Redis forwards, the user's name."""

    def __init__(self, address):
        self.address = address
        self.lock = threading.Lock()
        self.cluster = None
        self.forwards = {}  # unix socket path -> RedisForward
        import pwd
        self.user = pwd.getpwuid(os.getuid()).pw_name

    def ray(self):
        with self.lock:
            if self.cluster is None:
                from looseleaf_cluster.client import Cluster
                self.cluster = Cluster(self.address)
            return self.cluster

    def advertise(self):
        """This host's address as the GPU hosts reach it."""
        a = os.environ.get("LOOSELEAF_CLUSTER_ADVERTISE")
        if a:
            return a
        return self.ray().ray.util.get_node_ip_address()

    def redis_url(self, url):
        """URL (the kernel's Redis, as the kernel names it) as a worker on another host reaches it."""
        if not url:
            raise RuntimeError("the run names no Redis: a worker on another host could not reach the store")
        if url.startswith("unix://") or url.startswith("/"):
            path = url[7:] if url.startswith("unix://") else url
            with self.lock:
                fw = self.forwards.get(path)
            if fw is None:
                fw = RedisForward(path, self.advertise())
                with self.lock:
                    self.forwards[path] = fw
            return fw.url()
        return url  # already a network address (an administrator's Redis)

    def choose(self, home):
        """The host for a cell whose session's home is HOME (or None): (host, how)."""
        hosts = self.ray().status()
        names = [h["host"] for h in hosts]
        hi = names.index(home) if home in names and "gone" not in hosts[names.index(home)] else -1
        # home_slot stays False: whether the session's worker there still holds its slot (not evicted by
        # the host's broker for a local user) is not known here; rule 1 still keeps a home whose slot is
        # free or held by an idle warm worker (ours, most likely), so a warm hit is kept.
        i, how = place.choose(hosts, home=hi, home_slot=False)
        if i < 0:
            gone = [h["gone"] for h in hosts if "gone" in h]
            raise NoHost("no GPU host can take the cell now (%d host(s)%s)" % (
                len(hosts), "; " + "; ".join(gone) if gone else ""))
        return hosts[i]["host"], how

    def relay_of(self, host):
        """(addr, port, token) of the user's relay on HOST (started by its agent when none runs)."""
        info = self.ray().call(host, "relay", self.user, None, os.environ.get("LOOSELEAF_PYTHON") or None)
        return info["addr"], int(info["port"]), info["token"]


class HostLink:
    """One kernel's connection to its user's relay on one host; a reader thread hands the host's events to
    the kernel."""

    def __init__(self, kernel, host):
        self.kernel = kernel
        self.host = host
        addr, port, token = kernel.pool.relay_of(host)
        self.sock = socket.create_connection((addr, port), timeout=20)
        frames.send(self.sock, {"type": "relay_hello", "token": token, "user": kernel.pool.user})
        w = frames.recv(self.sock, limit=1 << 16)
        if w.get("type") != "relay_welcome":
            self.sock.close()
            raise HostGone(host, "its relay refused: %s" % w.get("error"))
        self.sock.settimeout(None)
        keepalive(self.sock)
        self.wlock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, msg):
        with self.wlock:
            frames.send(self.sock, msg)

    def _read(self):
        why = None
        try:
            while True:
                self.kernel.from_host(self, frames.recv(self.sock))
        except (OSError, frames.FrameError) as e:
            why = str(e)
        self.alive = False
        try:
            self.sock.close()
        except OSError:
            pass
        self.kernel.host_lost(self, why)


class KernelConn:
    """One kernel (one client of the pool protocol)."""

    def __init__(self, pool, sock):
        self.pool = pool
        self.sock = sock
        self.wlock = threading.Lock()
        self.lock = threading.Lock()
        self.links = {}  # host -> HostLink
        self.jobs = {}  # id -> {"host", "session", "kind"}
        self.homes = {}  # session -> host of its warm worker
        self.held = {}  # session -> (host, {pid}): its workers holding values no store holds (reply "home")
        self.last_host = None

    def to_kernel(self, msg):
        try:
            with self.wlock:
                frames.send(self.sock, msg)
        except OSError:
            pass

    def link(self, host):
        with self.lock:
            ln = self.links.get(host)
            if ln is not None and ln.alive:
                return ln
        ln = HostLink(self, host)
        with self.lock:
            self.links[host] = ln
        return ln

    # -- kernel -> hosts ------------------------------------------------
    def _fail(self, m, ename, evalue, host=None):
        kind = m.get("type")
        if kind == "prefetch":
            self.to_kernel({"type": "prefetched", "id": m.get("id"), "ok": False, "skipped": evalue})
            return
        self.to_kernel({"type": "reply", "id": m.get("id"),
                        "content": {"status": "error", "ename": ename, "evalue": evalue, "traceback": [
                            "\x1b[0;31m%s\x1b[0m: %s" % (ename, evalue)],
                            "execution_count": m.get("execution_count")},
                        "metadata": {"looseleaf": {"route": "gpu", "host": host, "cluster_error": evalue}}})

    def submit(self, m):
        session = m.get("session")
        home = self.homes.get(session)
        try:
            host, how = self.pool.choose(home)
            ln = self.link(host)
            fwd = dict(m)
            fwd["redis_url"] = self.pool.redis_url(m.get("redis_url"))
        except (HostGone, NoHost) as e:
            return self._fail(m, type(e).__name__, str(e))
        except Exception as e:  # noqa: BLE001 - the cell ends with why, the kernel goes on
            log.error("placing %s: %s", m.get("id"), traceback.format_exc())
            return self._fail(m, "ClusterError", "the cluster could not take the cell: %s" % e)
        with self.lock:
            self.jobs[m["id"]] = {"host": host, "session": session, "kind": m.get("type"), "how": how}
            self.last_host = host
        try:
            ln.send(fwd)
        except OSError:
            pass  # the link's reader reports the host's loss for this job

    def from_kernel(self, m):
        t = m.get("type")
        if t in ("run", "prefetch") and isinstance(m.get("id"), str) and isinstance(m.get("session"), str):
            self.submit(m)
        elif t in ("interrupt", "cancel", "input_reply"):
            with self.lock:
                job = self.jobs.get(m.get("id"))
                ln = self.links.get(job["host"]) if job else None
            if ln is not None and ln.alive:
                try:
                    ln.send(m)
                except OSError:
                    pass
        elif t == "stats":
            with self.lock:
                ln = self.links.get(self.last_host) if self.last_host else None
            if ln is not None and ln.alive:
                try:
                    ln.send(m)
                    return
                except OSError:
                    pass
            self.to_kernel({"type": "stats", "cluster": True, "sessions": [], "workers": [], "runs": [],
                            "nodes": [], "slots": 0})
        else:
            self.to_kernel({"type": "error", "id": m.get("id"), "error": "unknown request %r" % t})

    # -- hosts -> kernel ------------------------------------------------
    def from_host(self, ln, m):
        t = m.get("type")
        if t == "reply":
            md = m.setdefault("metadata", {})
            ll = md.setdefault("looseleaf", {}) if isinstance(md, dict) else {}
            with self.lock:
                job = self.jobs.pop(m.get("id"), None)
                if job and isinstance(ll, dict) and ll.get("stays_warm"):
                    self.homes[job["session"]] = ln.host
                elif job and self.homes.get(job["session"]) == ln.host:
                    del self.homes[job["session"]]
            if job and isinstance(ll, dict) and isinstance(ll.get("home"), dict):
                pids = {v.get("pid") for v in ll["home"].values() if isinstance(v, dict) and v.get("pid")}
                with self.lock:
                    if pids:
                        self.held[job["session"]] = (ln.host, pids)
                    else:
                        self.held.pop(job["session"], None)
            if isinstance(ll, dict):
                ll["host"] = ln.host
                if job:
                    ll["placed"] = job["how"]
        elif t == "prefetched":
            with self.lock:
                job = self.jobs.pop(m.get("id"), None)
                if job and m.get("ok") and m.get("stays_warm", True):
                    self.homes[job["session"]] = ln.host
            m["host"] = ln.host
        self.to_kernel(m)

    def host_lost(self, ln, why):
        """HOST's connection broke (the host, or its relay, died): its cells end with HostGone naming it,
        its sessions lose their home there, and the kernel hears that the workers holding values no store
        holds are gone (``worker_gone``, as a host pool says it), so reading such a value raises
        LostVariable naming the host instead of a NameError."""
        at = time.strftime("%H:%M:%S")
        with self.lock:
            if self.links.get(ln.host) is ln:
                del self.links[ln.host]
            lost = [(i, j) for i, j in self.jobs.items() if j["host"] == ln.host]
            for i, _ in lost:
                del self.jobs[i]
            for s in [s for s, h in self.homes.items() if h == ln.host]:
                del self.homes[s]
            held = [(s, pids) for s, (h, pids) in self.held.items() if h == ln.host]
            for s, _ in held:
                del self.held[s]
        log.warning("GPU host %s is gone (%s): %d cell(s) lost", ln.host, why, len(lost))
        for session, pids in held:
            for pid in sorted(pids):
                self.to_kernel({"type": "worker_gone", "pid": pid, "session": session,
                                "why": "which was on GPU host %s, gone at %s" % (ln.host, at)})
        msg = ("GPU host %s is gone while the cell ran there (its connection broke at %s: %s); the session "
               "continues from the last committed versions of its variables" % (
                   ln.host, at, why or "end of stream"))
        for i, j in lost:
            self._fail({"type": j["kind"], "id": i}, "HostGone", msg, ln.host)

    def serve(self):
        try:
            while True:
                self.from_kernel(frames.recv(self.sock))
        except (OSError, frames.FrameError):
            pass
        with self.lock:
            links = list(self.links.values())
            self.links.clear()
        for ln in links:  # the host pools end this kernel's workers, as a host pool does
            try:
                ln.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.sock.close()


def daemonize(dir_):
    """Fork; the parent (the kernel's launcher) exits 0 once the child listens (it writes to the pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(w)
        ok = os.read(r, 1)
        os._exit(0 if ok == b"1" else 1)
    os.close(r)
    os.setsid()
    os.chdir("/")
    os.umask(0o022)
    fd = os.open(os.path.join(dir_, "pool.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return w


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m looseleaf_cluster.remote")
    ap.add_argument("--runtime-dir", required=True)
    ap.add_argument("--address", required=True, help="the Ray head, HOST:PORT")
    ap.add_argument("--build", default="", help="the kernel's build id (pool.build)")
    ap.add_argument("--foreground", action="store_true")
    a = ap.parse_args(argv)
    d = a.runtime_dir
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        print("runtime dir %s is not ours or not private" % d, file=sys.stderr)
        return 2
    w = None if a.foreground else daemonize(d)
    logging.basicConfig(level=logging.INFO, format="%(process)d:C %(asctime)s %(levelname)s cluster: %(message)s")
    lockf = open(os.path.join(d, "pool.lock"), "w")
    try:
        fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log.error("another cluster pool holds %s/pool.lock", d)
        return 1
    with open(os.path.join(d, "pool.build"), "w") as f:
        f.write(a.build + "\n")
    path = os.path.join(d, "pool.sock")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o600)
    srv.listen(64)
    pool = ClusterPool(a.address)
    # Connecting to Ray takes seconds: done now, while the user writes the first GPU cell.
    threading.Thread(target=pool.ray, daemon=True).start()
    log.info("cluster pool for %s on %s, Ray head %s", pool.user, d, a.address)
    if w is not None:
        os.write(w, b"1")
        os.close(w)
    idle_exit = float(os.environ.get("LL_POOL_IDLE_EXIT", "300"))
    clients = [0]
    last_left = [time.monotonic()]
    clock = threading.Lock()

    def serve(conn):
        try:
            KernelConn(pool, conn).serve()
        finally:
            with clock:
                clients[0] -= 1
                last_left[0] = time.monotonic()

    srv.settimeout(5.0)
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            with clock:
                if clients[0] == 0 and time.monotonic() - last_left[0] > idle_exit:
                    log.info("no kernel for %g s: exiting", idle_exit)
                    os.unlink(path)
                    os._exit(0)
            continue
        if _peer_uid(conn) != os.getuid():  # as a host pool: only our own user's kernels
            conn.close()
            continue
        conn.settimeout(None)
        with clock:
            clients[0] += 1
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())

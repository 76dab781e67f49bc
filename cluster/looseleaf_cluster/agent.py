"""The per-host agent: a Ray actor pinned to its host's node (the node's ``looseleaf_host`` label), holding
all of the node's ``looseleaf_slot`` resource (so Ray schedules nothing else onto those slots), and bridging
Ray to that host's ``looseleaf hostd``: it reports the host's load as the broker counts it (``snapshot``) and
leases slots from the broker for the cluster's requests (``acquire`` / ``release``).

It never runs a user's cell: per-cell workers stay LooseLeaf's own forks from its zygotes (CUDA-clean,
fork-fast), run as their user in that user's pool.  For remote cells (``relay``) it starts, once per user and
once ``authorize_remote_user`` accepted, that user's relay (relay.py) on this host, as that user: the relay
carries the user's cluster pool's frames to the user's host pool here.

Started on the host (in its network namespace, by its systemd unit or a test) as a detached named actor:
    python -m looseleaf_cluster.agent --address HEAD:PORT --host NAME --hostd-socket PATH
which returns once the actor answers.  Ray's token (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``) comes from
the environment, as for every Ray process of the cluster.
"""
import argparse
import json
import os
import pwd
import secrets
import subprocess
import sys
import tempfile
import threading
import zlib

from looseleaf_cluster import AGENT_PREFIX, HOST_LABEL, RAY_NAMESPACE, SLOT_RESOURCE, hostd


class HostAgent:
    def __init__(self, host, hostd_socket, nslots):
        import ray
        self.host = host
        self.socket = hostd_socket
        self.nslots = int(nslots)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.lock = threading.Lock()  # the lease connection is one request at a time
        self.lease = hostd.Lease(hostd_socket, self.nslots)
        self.requests = {}  # request id -> broker slot
        self.relays = {}  # (uid, python) -> {"proc", "info"}: each user's relay on this host (relay.py)

    def info(self):
        return {"host": self.host, "node_id": self.node_id, "pid": os.getpid(), "slots": self.nslots,
                "hostd_socket": self.socket, "hostd_slots": self.lease.slots}

    def snapshot(self):
        """The host as placement sees it (its broker's count, every user's leases included)."""
        st = hostd.stats(self.socket)
        snap = hostd.load(st)
        snap.update(host=self.host, accepting=True, held=sorted(self.requests),
                    users=[{k: u.get(k) for k in ("uid", "name", "busy", "warm", "waiting")}
                           for u in st.get("users", [])])
        return snap

    def acquire(self, request_id):
        """A slot of this host's broker for REQUEST_ID: {"host", "slot"}, or None when the broker has none
        for us now (another user's cells took the free one since the snapshot: place again)."""
        with self.lock:
            if request_id in self.requests:
                return {"host": self.host, "slot": self.requests[request_id]}
            slot = self.lease.take()
            if slot is None:
                return None
            self.requests[request_id] = slot
            return {"host": self.host, "slot": slot}

    def relay(self, user, lease=None, python=None):
        """The relay (relay.py) carrying USER's cells to USER's host pool on this host, started as USER
        when none runs: {host, addr, port, token}.  The token goes only through Ray (token-authenticated).
        PYTHON: the kernel's Python environment (LOOSELEAF_PYTHON), which the pool's zygotes and workers
        here must run too (the same path on every host, as the same users are); None: the build's."""
        pw = authorize_remote_user(self.host, user, lease)
        if python and not os.access(python, os.X_OK):
            raise RuntimeError("the kernel's Python %s is not on host %s" % (python, self.host))
        key = (pw.pw_uid, python or "")
        with self.lock:
            r = self.relays.get(key)
            if r is not None and r["proc"].poll() is None:
                return dict(r["info"])
            import ray
            addr = ray.util.get_node_ip_address()
            token = secrets.token_hex(32)
            # The user's host pool here: its own runtime dir per host (hosts may share a file system).
            rdir = os.path.join(os.environ.get("LL_REMOTE_POOL_ROOT") or tempfile.gettempdir(),
                                "looseleaf-pool-%d-%s%s" % (pw.pw_uid, self.host,
                                                            "-%08x" % zlib.crc32(python.encode()) if python else ""))
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("RAY_", "LOOSELEAF_CLUSTER")) and k not in ("USER", "LOGNAME", "HOME")}
            # LL_STORE_FOREIGN_HOST: the workers here never make a session's payload pool anew (store/ll_store.c).
            env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name, LL_HOSTD_SOCKET=self.socket,
                       LL_STORE_FOREIGN_HOST=self.host)
            env.setdefault("LL_POOL_WARM_IDLE_S", "300")  # as a local kernel starts its pool
            if python:
                env["LOOSELEAF_PYTHON"] = python
            kw = {}
            if os.geteuid() != pw.pw_uid:
                kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid))
            proc = subprocess.Popen(
                [sys.executable, "-m", "looseleaf_cluster.relay", "--bind", addr, "--host", self.host,
                 "--runtime-dir", rdir, "--looseleaf", looseleaf_exe()],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/",
                start_new_session=True, **kw)
            proc.stdin.write(token + "\n")
            proc.stdin.flush()  # stdin stays open: the relay ends when we do
            line = proc.stdout.readline()
            try:
                port = int(json.loads(line)["port"])
            except (ValueError, KeyError, TypeError):
                proc.kill()
                proc.wait()
                raise RuntimeError("the relay for %s on %s did not start: %r" % (user, self.host, line))
            info = {"host": self.host, "addr": addr, "port": port, "token": token, "pid": proc.pid}
            self.relays[key] = {"proc": proc, "info": info}
            return dict(info)

    def release(self, request_id):
        with self.lock:
            slot = self.requests.pop(request_id, None)
            if slot is None:
                raise KeyError("request %s holds no slot on host %s" % (request_id, self.host))
            self.lease.give_back(slot)
            return slot


def authorize_remote_user(host, user, lease):
    """THE SEAM FOR SIGNED LEASES: whether HOST may run workers for USER (a user name) on behalf of a kernel
    elsewhere; the user's passwd entry, or PermissionError.

    Today the request came through Ray, which runs with token authentication (only the cluster's own
    processes reach the agent), and names the user the cluster pool runs as; LEASE is None.  Once hostds
    sign leases (branch ``clusterops``), LEASE is the lease the kernel host's hostd issued (it knows the
    caller by SO_PEERCRED): check here its signature (a key only the hostds hold), that it names USER and
    HOST, its expiry and its nonce (no replay), and refuse anything else."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise PermissionError("user %r is unknown on host %s (the same users must exist on every host)" % (
            user, host)) from None
    if os.geteuid() != 0 and pw.pw_uid != os.geteuid():
        raise PermissionError("the agent of %s runs as uid %d and cannot run workers as %s" % (
            host, os.geteuid(), user))
    return pw


def looseleaf_exe():
    from looseleaf_cluster import place
    return os.environ.get("LL_LOOSELEAF_EXE") or os.path.join(place._REPO, "build", "looseleaf")


def node_slots(ray, host):
    """The ``looseleaf_slot`` resource of the live node labelled HOST, or None."""
    for n in ray.nodes():
        if n.get("Alive") and n.get("Labels", {}).get(HOST_LABEL) == host:
            return int(n.get("Resources", {}).get(SLOT_RESOURCE, 0)) or None
    return None


def start(ray, host, hostd_socket, nslots=None, timeout=60):
    """Create HOST's agent (detached, named AGENT_PREFIX + HOST, on the node labelled HOST), holding NSLOTS
    (default: all the node's) slots; its info once it answers."""
    nslots = nslots or node_slots(ray, host)
    if not nslots:
        raise RuntimeError("no live Ray node labelled %s=%s offers %s" % (HOST_LABEL, host, SLOT_RESOURCE))
    cls = ray.remote(HostAgent)
    actor = cls.options(name=AGENT_PREFIX + host, namespace=RAY_NAMESPACE, lifetime="detached", num_cpus=0,
                        resources={SLOT_RESOURCE: nslots}, label_selector={HOST_LABEL: host},
                        max_concurrency=4, max_restarts=0).remote(host, hostd_socket, nslots)
    return ray.get(actor.info.remote(), timeout=timeout)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m looseleaf_cluster.agent", description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="the Ray head, HOST:PORT")
    ap.add_argument("--host", required=True, help="this host's name (its raylet's looseleaf_host label)")
    ap.add_argument("--hostd-socket", default=os.environ.get("LL_HOSTD_SOCKET", "/run/looseleaf/hostd.sock"))
    ap.add_argument("--slots", type=int, default=None, help="slots to hold (default: the node's all)")
    a = ap.parse_args(argv)
    import ray
    ray.init(address=a.address, namespace=RAY_NAMESPACE, logging_level="ERROR", log_to_driver=False)
    try:
        print(json.dumps(start(ray, a.host, a.hostd_socket, a.slots)), flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

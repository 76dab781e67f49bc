"""The per-host agent: a Ray actor pinned to its host's node (the node's ``looseleaf_host`` label), holding
all of the node's ``looseleaf_slot`` resource (so Ray schedules nothing else onto those slots), and bridging
Ray to that host's ``looseleaf hostd``: it reports the host's load as the broker counts it (``snapshot``) and
leases slots from the broker for the cluster's requests (``acquire`` / ``release``).

It never runs a user's cell: per-cell workers stay LooseLeaf's own forks from its zygotes (CUDA-clean,
fork-fast), run as their user in that user's pool; the agent only lends slots.

Started on the host (in its network namespace, by its systemd unit or a test) as a detached named actor:
    python -m looseleaf_cluster.agent --address HEAD:PORT --host NAME --hostd-socket PATH
which returns once the actor answers.  Ray's token (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``) comes from
the environment, as for every Ray process of the cluster.
"""
import argparse
import json
import os
import sys
import threading

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

    def info(self):
        return {"host": self.host, "node_id": self.node_id, "pid": os.getpid(), "slots": self.nslots,
                "hostd_socket": self.socket, "hostd_slots": self.lease.slots}

    def snapshot(self):
        """The host as placement sees it (its broker's count, every user's leases included)."""
        st = hostd.stats(self.socket)
        snap = hostd.load(st)
        snap.update(host=self.host, accepting=True, held=sorted(self.requests))
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

    def release(self, request_id):
        with self.lock:
            slot = self.requests.pop(request_id, None)
            if slot is None:
                raise KeyError("request %s holds no slot on host %s" % (request_id, self.host))
            self.lease.give_back(slot)
            return slot


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

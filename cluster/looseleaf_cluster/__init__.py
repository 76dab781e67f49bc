"""LooseLeaf's cluster mode on Ray (in progress; README "Cluster mode").

- ``place``: the consolidation rule (C ``ll_place_choose``, through build/cluster/libllplace.so).
- ``hostd``: a client of one host's ``looseleaf hostd`` (hostd/API.md's frames on its unix socket).
- ``agent``: the per-host Ray actor that holds its node's slots and leases them from that host's hostd.
- ``client``: the server side: finds the agents, asks them how loaded they are, places a request with the
  C rule and has the chosen host's agent take the slot.
- ``remote``: the user's cluster pool on the kernels' host (a kernel with LOOSELEAF_CLUSTER talks to it as to
  a host pool): places each GPU cell and carries its frames to the user's relay on the chosen host.
- ``relay``: on a GPU host, as the user (started by the agent): TCP from the cluster pool to the user's host
  pool there.  ``frames``: the length + JSON frames they speak (proto/ll_zframe.h).

Ray is imported only by ``agent`` and ``client``: ``place`` and ``hostd`` work without it.
"""

# Ray names the agents (detached actors) in this namespace, one per host: AGENT_PREFIX + host name.
RAY_NAMESPACE = "looseleaf"
AGENT_PREFIX = "ll-agent-"
# The custom resource a host's raylet offers, one unit per GPU slot, and the node label naming the host.
SLOT_RESOURCE = "looseleaf_slot"
HOST_LABEL = "looseleaf_host"


class HostGone(RuntimeError):
    """A GPU host of the cluster is gone (its Ray node, agent or hostd died or went unreachable)."""

    def __init__(self, host, why):
        self.host = host
        self.why = why
        super().__init__("GPU host %s is gone: %s" % (host, why))


class NoHost(RuntimeError):
    """No GPU host of the cluster can take the request now."""

"""Cluster scenarios on namespaces (clusterhelp.Cluster: a server and three GPU hosts of LL_POOL_SLOTS slots,
each with its raylet, hostd and agent).  The tests of this module share one cluster and run in order; the
host-killed one is last (it leaves a host dead)."""
import json
import subprocess

import pytest

import clusterhelp

pytestmark = pytest.mark.timeout(900)

# A local user's pool on a host, as the broker sees it: a connection holding K busy leases (the agent's
# Lease, as a pool would hold them), until its stdin closes.
HOLDER = """
import sys
from looseleaf_cluster import hostd
lease = hostd.Lease(sys.argv[1], int(sys.argv[2]))
print(" ".join(str(lease.take()) for _ in range(int(sys.argv[2]))), flush=True)
sys.stdin.read()
"""


class Holder:
    def __init__(self, cluster, host, k):
        self.proc = subprocess.Popen(["ip", "netns", "exec", cluster.ns(host), clusterhelp.PYTHON, "-c", HOLDER,
                                      cluster.hostd_socket(host), str(k)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=cluster.env)
        slots = self.proc.stdout.readline().split()
        assert len(slots) == k and "None" not in slots, slots

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


def leases(cluster, host):
    return len(cluster.hostd_stats(host)["lease_list"])


def test_nodes_joined_with_slots_and_labels(cluster):
    """Every host's raylet joined the head with its slots and label, and its agent holds all its slots."""
    code = ("import json, ray\n"
            "ray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n"
            "print(json.dumps([[n['Alive'], n['Labels'].get('looseleaf_host'), n['Resources'], "
            "n['NodeManagerAddress'], n['NodeID']] for n in ray.nodes()]))\n"
            "print(json.dumps(ray.available_resources()))\n"
            "print(json.dumps([ray.get(ray.get_actor('ll-agent-' + h, namespace='looseleaf').info.remote()) "
            "for h in %r]))\n" % (cluster.head, cluster.hosts))
    out = cluster.py_in(cluster.server, ["-c", code]).stdout.splitlines()
    nodes, avail, agents = json.loads(out[-3]), json.loads(out[-2]), json.loads(out[-1])
    hosts = {n[1]: n for n in nodes if n[1]}
    assert sorted(hosts) == cluster.hosts
    for h, (alive, _, res, addr, _) in hosts.items():
        assert alive and res.get("looseleaf_slot") == cluster.slots and addr == cluster.addr(h)
    # Each agent runs on its own host's node, registered with that host's broker.
    for h, a in zip(cluster.hosts, agents):
        assert a["host"] == h and a["node_id"] == hosts[h][4], (h, a, hosts[h])
        assert a["hostd_socket"] == cluster.hostd_socket(h) and a["hostd_slots"] == cluster.slots, a
    # The agents hold every slot: Ray has none left to give anything else.
    assert avail.get("looseleaf_slot", 0) == 0, avail
    st = {s["host"]: s for s in cluster.client("status")[0]}
    assert sorted(st) == cluster.hosts
    assert all(s["accepting"] and s["slots"] == cluster.slots and s["busy"] == 0 for s in st.values()), st


def test_ray_refuses_a_driver_without_the_token(cluster):
    """Token authentication is on: a driver with a wrong token is refused by the head."""
    code = ("import ray\n"
            "try:\n"
            "    ray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n"
            "    print('CONNECTED')\n"
            "except Exception as e:\n"
            "    print('REFUSED', type(e).__name__)\n" % cluster.head)
    r = subprocess.run(["ip", "netns", "exec", cluster.server, clusterhelp.PYTHON, "-c", code],
                       capture_output=True, text=True, timeout=180, cwd=cluster.dir,
                       env=dict(cluster.env, RAY_AUTH_TOKEN="0" * 64))
    assert "REFUSED" in r.stdout and "CONNECTED" not in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "InvalidAuthToken" in r.stderr or "uthentication" in r.stderr, r.stderr[-2000:]


def test_consolidation_fills_the_fullest_host_first(cluster):
    """With h2 holding 2 of its slots and h3 1 (other users' cells, through each host's broker), the cluster's
    requests go to h2 until it is full, then h3, then h1: the most loaded host with a free slot (ll_place),
    not the emptiest.  Each placement is a lease of the chosen host's broker (looseleaf top sees it)."""
    assert cluster.slots == 4 and cluster.hosts == ["h1", "h2", "h3"], "written for 3 hosts of 4 slots"
    holders = [Holder(cluster, "h2", 2), Holder(cluster, "h3", 1)]
    placed = []
    try:
        placed = cluster.client("place", *["r%d" % i for i in range(7)])
        assert [p["host"] for p in placed] == ["h2", "h2", "h3", "h3", "h3", "h1", "h1"], placed
        assert all(p["how"] == "free" for p in placed), placed
        assert [leases(cluster, h) for h in cluster.hosts] == [2, 4, 4]
        st = {s["host"]: s for s in cluster.client("status")[0]}
        assert [st[h]["busy"] for h in cluster.hosts] == [2, 4, 4], st
        # The slots each agent holds are the broker's: no two requests share one.
        for h in cluster.hosts:
            slots = [p["slot"] for p in placed if p["host"] == h]
            assert len(set(slots)) == len(slots), placed
    finally:
        for p in placed:
            cluster.client("release", p["host"], p["request_id"])
        for hd in holders:
            hd.close()
    assert [leases(cluster, h) for h in cluster.hosts] == [0, 0, 0]


def test_a_killed_host_is_reported_gone(cluster):
    """Every process of h3's namespace killed (raylet, hostd, agent) while a request holds a slot there: the
    cluster reports h3 gone, naming it and why (its Ray node is dead); the request held there fails with that
    error; placement goes on with the live hosts and says why none can take a request when they are full."""
    held = cluster.client("place", *["k%d" % i for i in range(9)])  # all empty: ties go to the lower index
    assert [p["host"] for p in held] == ["h1"] * 4 + ["h2"] * 4 + ["h3"], held
    cluster.kill_host("h3")
    assert cluster.pids(cluster.ns("h3")) == []

    def gone():
        st = {s["host"]: s for s in cluster.client("status")[0]}
        return st if "gone" in st.get("h3", {}) and "dead" in st["h3"]["gone"] else None
    st = clusterhelp.wait_for(gone, 120, "h3 reported gone")
    assert st["h3"]["accepting"] is False
    assert st["h3"]["gone"].startswith("GPU host h3 is gone: its Ray node %s" % cluster.addr("h3")), st["h3"]
    assert all(st[h]["accepting"] and "gone" not in st[h] for h in ("h1", "h2")), st

    # The request that held a slot on h3: a clear error naming the host.
    err = cluster.client("release", "h3", "k8", check=False)[-1]
    assert err["error"] == "HostGone" and "GPU host h3 is gone" in err["message"], err

    # h1 and h2 full, h3 gone: no host, and the error says why.
    nohost = cluster.client("place", "m0", check=False)[-1]
    assert nohost["error"] == "NoHost" and "h3 is gone" in nohost["message"], nohost
    # A slot freed on h2: placement goes on there, never on h3.
    cluster.client("release", "h2", "k7")
    one = cluster.client("place", "m1")[0]
    assert one["host"] == "h2", one
    for p in held[:7] + [one]:
        cluster.client("release", p["host"], p["request_id"])
    assert [leases(cluster, h) for h in ("h1", "h2")] == [0, 0]

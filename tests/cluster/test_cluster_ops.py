"""The cluster as an administrator runs it, on namespaces (clusterhelp.Cluster: a server running the Ray head
and a hostd, two GPU hosts started by the helper, and h3 joined here from a cluster config the way a host
joins: its hostd reading the config, `looseleaf cluster check`, `looseleaf cluster raylet` (what its systemd
unit runs), `looseleaf cluster agent`).  Then cluster leases across hosts (issued by the server's hostd,
redeemed on h1's, refused on h2's), `looseleaf top --cluster` and its per-host metrics, a host killed
showing as gone.  The tests share one cluster and run in order (the kill last)."""
import json
import os
import subprocess

import pytest

import clusterhelp

pytestmark = pytest.mark.timeout(900)

LEASE_CODE = """
import json, sys
from looseleaf_cluster import hostd
op, sock = sys.argv[1], sys.argv[2]
try:
    if op == "issue":
        print(json.dumps(hostd.issue_lease(sock, sys.argv[3], sys.argv[4])))
    else:
        print(json.dumps({"redeemed": hostd.redeem_lease(sock, json.loads(sys.argv[3]))}))
except hostd.LeaseRefused as e:
    print(json.dumps({"refused": str(e)}))
"""


@pytest.fixture(scope="module")
def cluster():
    why = clusterhelp.usable()
    if why:
        pytest.skip(why)
    c = clusterhelp.Cluster(nhosts=3, slots=2, manual=("h3",))
    try:
        try:
            c.start()
        except Exception as e:
            raise RuntimeError("the cluster did not start: %s\n%s" % (e, c.logs()[-8000:])) from e
        yield c
    finally:
        c.close()


def lease_op(cluster, ns_host, *args):
    ns = cluster.server if ns_host == "srv" else cluster.ns(ns_host)
    r = cluster.py_in(ns, ["-c", LEASE_CODE] + list(args))
    return json.loads(r.stdout.strip().splitlines()[-1])


def looseleaf(cluster, ns, *args, check=True):
    return cluster.run_in(ns, [clusterhelp.LOOSELEAF] + list(args), timeout=180, check=check)


def test_a_host_joins_from_its_config(cluster):
    """h3 joins as an administrator's units would make it: config, key, token; check; raylet; agent."""
    d = os.path.join(cluster.dir, "h3")
    os.makedirs(d, exist_ok=True)
    token = os.path.join(d, "ray.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(cluster.token + "\n")
    conf = os.path.join(d, "cluster.json")
    with open(conf, "w") as f:
        json.dump({"head": cluster.head, "host": "h3", "role": "gpu", "slots": cluster.slots,
                   "key_file": cluster.key, "ray_token_file": token, "hostd_socket": cluster.hostd_socket("h3"),
                   "node_ip": cluster.addr("h3"),
                   "ray_args": ["--num-cpus", "1", "--object-store-memory", str(80 * 1024 * 1024),
                                "--include-log-monitor=false"]}, f)
    ns = cluster.ns("h3")
    # Before its hostd runs, check says so.
    r = looseleaf(cluster, ns, "cluster", "check", "--config", conf, check=False)
    assert r.returncode == 1 and "does not answer" in r.stderr, r.stderr
    cluster.start_hostd(ns, "h3", ["--cluster-config", conf])
    r = looseleaf(cluster, ns, "cluster", "check", "--config", conf)
    assert "h3 (gpu) ok" in r.stdout and cluster.head in r.stdout, r.stdout + r.stderr
    # The raylet, as its unit runs it (in the foreground: `ray start --block`), without the test's token in
    # its environment: it must come from the config's token file.
    env = dict(cluster.env)
    env.pop("RAY_AUTH_TOKEN")
    log = open(os.path.join(d, "raylet-unit.log"), "w")
    cluster.procs.append(subprocess.Popen(["ip", "netns", "exec", ns, clusterhelp.LOOSELEAF, "cluster", "raylet",
                                           "--config", conf], stdout=log, stderr=log, env=env, cwd=cluster.dir))
    log.close()

    def joined():
        code = ("import ray, json\n"
                "ray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n"
                "print(json.dumps([n['Labels'].get('looseleaf_host') for n in ray.nodes() if n['Alive']]))\n"
                % cluster.head)
        r = cluster.py_in(cluster.server, ["-c", code], check=False)
        return r.returncode == 0 and "h3" in json.loads(r.stdout.strip().splitlines()[-1])
    clusterhelp.wait_for(joined, 120, "h3's raylet joining")
    r = cluster.run_in(ns, [clusterhelp.LOOSELEAF, "cluster", "agent", "--config", conf], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["host"] == "h3" and info["slots"] == cluster.slots, info
    st = {s["host"]: s for s in cluster.client("status")[0]}
    assert sorted(st) == ["h1", "h2", "h3"] and st["h3"]["slots"] == cluster.slots and "gone" not in st["h3"], st


def test_lease_issued_on_the_server_redeems_on_its_target_only(cluster):
    lease = lease_op(cluster, "srv", "issue", cluster.hostd_socket("srv"), "h1", "kernel-9/cell-2")
    assert lease["issuer"] == "srv" and lease["target"] == "h1" and lease["user"] == "root", lease
    got = lease_op(cluster, "h2", "redeem", cluster.hostd_socket("h2"), json.dumps(lease))
    assert "the lease is for host h1, this is host h2" in got.get("refused", ""), got
    got = lease_op(cluster, "h1", "redeem", cluster.hostd_socket("h1"), json.dumps(lease))
    assert got.get("redeemed", {}).get("request") == "kernel-9/cell-2", got
    got = lease_op(cluster, "h1", "redeem", cluster.hostd_socket("h1"), json.dumps(lease))
    assert "replayed" in got.get("refused", ""), got
    forged = dict(lease, uid=12345, nonce="1" * 32)
    got = lease_op(cluster, "h1", "redeem", cluster.hostd_socket("h1"), json.dumps(forged))
    assert "bad signature" in got.get("refused", ""), got
    # h3's hostd took its name and key from its config: a lease for h3 redeems there.
    lease = lease_op(cluster, "srv", "issue", cluster.hostd_socket("srv"), "h3", "kernel-9/cell-3")
    got = lease_op(cluster, "h3", "redeem", cluster.hostd_socket("h3"), json.dumps(lease))
    assert got.get("redeemed", {}).get("issuer") == "srv", got


def test_top_cluster_shows_every_host_its_load_and_users(cluster):
    placed = cluster.client("place", "r1", "r2")
    hosts = {p["host"] for p in placed}
    assert len(hosts) == 1, placed  # consolidation: both on one host
    busy = hosts.pop()
    r = looseleaf(cluster, cluster.server, "top", "--cluster", "--address", cluster.head)
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:] if line.split()}
    for h in ("h1", "h2", "h3"):
        assert rows[h][1] == "up" and rows[h][2] == str(cluster.slots), r.stdout
    assert rows[busy][3] == "2" and "root(2 busy)" in r.stdout, r.stdout
    r = looseleaf(cluster, cluster.server, "top", "--cluster", "--address", cluster.head, "--prometheus")
    assert 'looseleaf_cluster_host_busy_slots{host="%s"} 2' % busy in r.stdout, r.stdout
    assert 'looseleaf_cluster_host_user_busy_slots{host="%s",uid="0",user="root"} 2' % busy in r.stdout
    for p in placed:
        cluster.client("release", p["host"], p["request_id"])


def test_a_killed_host_shows_as_gone(cluster):
    cluster.kill_host("h3")

    def gone():
        r = looseleaf(cluster, cluster.server, "top", "--cluster", "--address", cluster.head, check=False)
        return r.returncode == 0 and any(line.split()[:2] == ["h3", "GONE"] for line in r.stdout.splitlines()) \
            and r.stdout
    out = clusterhelp.wait_for(gone, 90, "h3 shown gone")
    assert "GPU host h3 is gone" in out and "1 gone" in out, out
    r = looseleaf(cluster, cluster.server, "top", "--cluster", "--address", cluster.head, "--prometheus")
    assert 'looseleaf_cluster_host_up{host="h3"} 0' in r.stdout and \
        'looseleaf_cluster_host_up{host="h1"} 1' in r.stdout, r.stdout

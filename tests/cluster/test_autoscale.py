"""Autoscaling on namespaces: a server namespace whose Ray head runs the autoscaler with the namespace node
provider (cluster/looseleaf_cluster/provider.py) and the scaler (autoscale.py: ll_provision's target handed to
Ray as request_resources), and no GPU host at first.  Requests waiting for a slot make hosts come (a namespace
with its raylet, hostd and agent each); idle hosts are drained and go.  The tests share the cluster and run
in order, each starting and ending with no GPU host."""
import json
import os
import subprocess
import time

import pytest

import clusterhelp

pytestmark = pytest.mark.timeout(600)

SLOTS = 4
MAX_HOSTS = 2

# Every request placed at once, each waiting for a slot (the scaler counts it as demand meanwhile).
PLACE_ALL = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from looseleaf_cluster.client import Cluster
from looseleaf_cluster import NoHost
c = Cluster(sys.argv[1])
wait = float(sys.argv[2])
def one(rid):
    try:
        return c.place(rid, wait_s=wait)
    except NoHost as e:
        return {"request_id": rid, "error": "NoHost", "message": str(e)}
with ThreadPoolExecutor(len(sys.argv) - 3) as ex:
    for r in ex.map(one, sys.argv[3:]):
        print(json.dumps(r), flush=True)
c.close()
"""

HOLDER = """
import sys
from looseleaf_cluster import hostd
lease = hostd.Lease(sys.argv[1], 1)
print(lease.take(), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def ascluster():
    why = clusterhelp.usable()
    if why:
        pytest.skip(why)
    c = clusterhelp.Cluster(nhosts=0, slots=SLOTS, autoscale={"max_hosts": MAX_HOSTS, "idle_timeout_minutes": 0.1})
    try:
        # `ray start` of the hosts goes through a wrapper that fails once when the test asks it to (the
        # raylet "binary failing"), else runs the real one.
        wrapper = os.path.join(c.dir, "ray-wrapper")
        with open(wrapper, "w") as fh:
            fh.write("#!/bin/sh\n"
                     "f=%s\n"
                     # mv: of starts racing, exactly one takes the failure
                     "if mv \"$f\" \"$f.taken\" 2>/dev/null; then "
                     "echo 'raylet: injected failure (the test ray wrapper)' >&2; exit 1; fi\n"
                     "exec %s \"$@\"\n" % (os.path.join(c.dir, "fail-ray-starts"), clusterhelp.RAY))
        os.chmod(wrapper, 0o755)
        c.autoscale["provider"] = {"ray": wrapper}
        try:
            c.start()
            r = c.py_in(c.server, ["-m", "looseleaf_cluster.autoscale", "--address", c.head, "start",
                                   "--slots", str(SLOTS), "--target-util", "1.0", "--p-wait", "0.5",
                                   "--window-s", "2", "--down-hold-s", "3", "--max-hosts", str(MAX_HOSTS),
                                   "--tick-s", "0.5", "--drain-timeout-s", "120"])
            assert json.loads(r.stdout.strip().splitlines()[-1])["config"]["slots"] == SLOTS
        except Exception as e:
            raise RuntimeError("the autoscaling cluster did not start: %s\n%s" % (e, c.logs()[-8000:])) from e
        yield c
    finally:
        c.close()


def host_namespaces(c):
    return sorted(ns for ns in c.our_namespaces() if ns != c.server)


def ray_hosts(c):
    """host label -> [alive, address] of every Ray node labelled with a host."""
    code = ("import json, ray\n"
            "ray.init(address=%r, logging_level='ERROR', log_to_driver=False)\n"
            "print(json.dumps({n['Labels']['looseleaf_host']: [n['Alive'], n['NodeManagerAddress']] "
            "for n in ray.nodes() if n['Labels'].get('looseleaf_host') and n['Alive']}))\n" % c.head)
    return json.loads(c.py_in(c.server, ["-c", code]).stdout.strip().splitlines()[-1])


def events(c):
    try:
        with open(os.path.join(c.autoscale_dir, "events.log")) as fh:
            return [json.loads(line) for line in fh]
    except FileNotFoundError:
        return []


def scaler_status(c):
    r = c.py_in(c.server, ["-m", "looseleaf_cluster.autoscale", "--address", c.head, "status"])
    return json.loads(r.stdout.strip().splitlines()[-1])


def place_all(c, rids, wait):
    r = c.py_in(c.server, ["-c", PLACE_ALL, c.head, str(wait)] + rids, timeout=wait + 120)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def wait_empty(c, timeout=240):
    """No GPU host left: no namespace of ours but the server's, no live Ray node labelled with a host."""
    clusterhelp.wait_for(lambda: not host_namespaces(c) and not ray_hosts(c), timeout,
                         "every GPU host gone (namespaces %s)" % host_namespaces(c))


def test_grows_from_zero_to_two_hosts_and_shrinks_back(ascluster):
    c = ascluster
    assert host_namespaces(c) == [] and ray_hosts(c) == {}
    # 8 requests at once, more than one host holds: the scaler's target (8 + 0.5*sqrt(8) -> 10 slots, 3 hosts,
    # capped at 2) goes to Ray's autoscaler, which starts two hosts through the provider.
    rids = ["g%d" % i for i in range(8)]
    placed = place_all(c, rids, 240)
    assert all("error" not in p for p in placed), (placed, c.logs()[-4000:])
    by_host = {}
    for p in placed:
        by_host.setdefault(p["host"], []).append(p["slot"])
    assert sorted(by_host) == ["a1", "a2"] and all(len(set(s)) == SLOTS for s in by_host.values()), \
        (placed, events(c))
    # They really came: a namespace each, linked and running their raylet (alive in Ray, at the address
    # the provider gave), broker (its leases are these requests) and agent.
    assert host_namespaces(c) == [c.prefix + "-a1", c.prefix + "-a2"]
    rh = ray_hosts(c)
    assert sorted(rh) == ["a1", "a2"] and {a for _, a in rh.values()} == {"10.251.0.101", "10.251.0.102"}, rh
    for h in ("a1", "a2"):
        assert c.pids(c.prefix + "-" + h), h
        st = c.run_in(c.prefix + "-" + h, [clusterhelp.LOOSELEAF, "top", "--socket",
                                            os.path.join(c.autoscale_dir, c.prefix + "-" + h, "hostd.sock"),
                                            "--json"], check=True)
        assert len(json.loads(st.stdout)["lease_list"]) == SLOTS, st.stdout
    clusterhelp.wait_for(lambda: len([e for e in events(c) if e["event"] == "started"]) == 2, 60, "starts noted")
    started = [e for e in events(c) if e["event"] == "started"]
    assert sorted(e["host"] for e in started) == ["a1", "a2"], events(c)
    print("host starts (namespace, hostd, raylet, agent): %s s" % [e["seconds"] for e in started])
    st = scaler_status(c)
    assert st["requested_hosts"] == MAX_HOSTS and st["accepting"] == 2 and st["busy"] == 8, st

    # Full at the fleet's cap: a ninth request waits, then fails clearly, naming what was asked of Ray.
    late = place_all(c, ["late"], 4)[0]
    assert late["error"] == "NoHost" and "no GPU host took late within 4 s" in late["message"] and \
        "asked for 2 host(s) of 4 slot(s)" in late["message"], late

    # The load falls to two slots: a local user's pool on a1 holds one (through a1's broker, as a pool
    # would) and one request on a2 is kept.  The scaler wants one host and drains the one ll_place_drain
    # picks (both hold one slot: the higher, a2).  a2 takes no new request and stays up while its request
    # holds its slot, well beyond Ray's idle timeout; released, a2 goes.  a1 keeps working.
    keep = next(p for p in placed if p["host"] == "a2")
    a1 = c.prefix + "-a1"
    for p in placed:  # a1's first: the pool takes its slot there while a2 is still full (two hosts wanted)
        if p["host"] == "a1":
            c.client("release", p["host"], p["request_id"])
    holder = subprocess.Popen(["ip", "netns", "exec", a1, clusterhelp.PYTHON, "-c", HOLDER,
                               os.path.join(c.autoscale_dir, a1, "hostd.sock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=c.env)
    try:
        assert holder.stdout.readline().strip().isdigit()
        for p in placed:
            if p["host"] == "a2" and p is not keep:
                c.client("release", p["host"], p["request_id"])
        clusterhelp.wait_for(lambda: scaler_status(c)["draining"] == ["a2"], 60, "a2 draining")
        # The load comes back while a2 drains: a1 takes what it can, and the request left waiting puts a2
        # back to work (no third host is asked for).  Then the load falls again and a2 drains again.
        back = place_all(c, ["b0", "b1", "b2", "b3"], 120)
        assert sorted(p.get("host") for p in back) == ["a1", "a1", "a1", "a2"], back
        assert host_namespaces(c) == [a1, c.prefix + "-a2"] and scaler_status(c)["draining"] == []
        for p in back:
            c.client("release", p["host"], p["request_id"])
        clusterhelp.wait_for(lambda: scaler_status(c)["draining"] == ["a2"], 60, "a2 draining again")
        other = c.client("place", "while-draining")[0]
        assert other["host"] == "a1", other  # a draining host takes no new request
        c.client("release", "a1", "while-draining")
        time.sleep(12)  # beyond Ray's idle timeout (6 s) and many autoscaler updates: a2 must stay
        assert host_namespaces(c) == [c.prefix + "-a1", c.prefix + "-a2"], events(c)
        assert scaler_status(c)["draining"] == ["a2"]
        c.client("release", "a2", keep["request_id"])
        clusterhelp.wait_for(lambda: host_namespaces(c) == [a1] and sorted(ray_hosts(c)) == ["a1"], 180,
                             "a2 gone, a1 kept")
        term = [e for e in events(c) if e["event"] == "terminated"]
        assert [(e["host"], e["leases_left"]) for e in term] == [("a2", 0)], term
        assert scaler_status(c)["accepting"] == 1
    finally:
        holder.stdin.close()
        holder.wait(30)
    # Nothing left: a1 drains and goes too.
    wait_empty(c)
    term = [e for e in events(c) if e["event"] == "terminated"]
    assert [(e["host"], e["leases_left"]) for e in term] == [("a2", 0), ("a1", 0)], term
    assert scaler_status(c)["requested_hosts"] == 0


def test_a_failed_host_start_is_cleaned_and_retried(ascluster):
    """The raylet of the next host fails to start (after its namespace and broker were made): the provider
    ends what it made, deletes the namespace and says why; Ray's autoscaler counts the failed launch and
    starts a host again, which takes the waiting request."""
    c = ascluster
    wait_empty(c)
    before = len(events(c))
    with open(os.path.join(c.dir, "fail-ray-starts"), "w") as fh:
        fh.write("once")
    seen = set()
    import threading
    stop = threading.Event()

    def watch():  # the namespaces that exist while the host starts, failed one included
        while not stop.is_set():
            seen.update(host_namespaces(c))
            time.sleep(0.2)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        placed = place_all(c, ["f0"], 240)[0]
    finally:
        stop.set()
        t.join(10)
    assert "error" not in placed, (placed, events(c)[before:])
    # (The request may be placed as soon as the host's agent answers, a moment before the provider notes it.)
    clusterhelp.wait_for(lambda: any(e["event"] == "started" for e in events(c)[before:]), 60, "the start noted")
    new = events(c)[before:]
    failed = [e for e in new if e["event"] == "start_failed"]
    assert len(failed) == 1, [e.get("error") for e in failed]
    f = failed[0]
    assert f["step"] == "raylet" and "injected failure" in f["error"] and "its namespace is deleted" in f["error"]
    assert f["error"].startswith("host %s (namespace %s) did not start: raylet failed: ray-wrapper exited 1"
                                 % (f["host"], f["node"])), f
    ok = [e for e in new if e["event"] == "started"]
    assert len(ok) == 1 and ok[0]["host"] != f["host"] and placed["host"] == ok[0]["host"], (placed, new)
    # The failed host's namespace was made (the broker ran in it) and is gone; nothing half-made is left.
    assert f["node"] in seen, seen
    assert host_namespaces(c) == [ok[0]["node"]]
    # Ray's autoscaler saw the failed launch (its monitor's log says so).
    logs = ""
    for root, _, files in os.walk(os.path.join(c.dir, "srv")):
        for name in files:
            if name.startswith("monitor"):
                with open(os.path.join(root, name), errors="replace") as fh:
                    logs += fh.read()
    assert "Failed to launch" in logs and "did not start: raylet failed" in logs, logs[-3000:]
    c.client("release", placed["host"], "f0")  # (the fixture's teardown ends the host: shrinking is tested above)


def test_a_half_made_host_is_deleted(ascluster):
    """A namespace of the provider's naming without its record (a monitor that died mid-start leaves one:
    made here by hand, with a process in it) is ended and deleted the next time the autoscaler lists the
    nodes; the hosts that are whole stay."""
    c = ascluster
    whole = host_namespaces(c)
    ns = c.prefix + "-a99"
    clusterhelp.ip("netns", "add", ns)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"])
    try:
        clusterhelp.wait_for(lambda: ns not in host_namespaces(c), 60, "%s deleted" % ns)
        assert sleeper.wait(30) != 0  # ended by the provider, not by itself
        assert host_namespaces(c) == whole
        assert any(e["event"] == "half_made_deleted" and e["node"] == ns for e in events(c)), events(c)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()

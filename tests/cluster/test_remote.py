"""Remote GPU cells (issue 25, items 1-2): real kernels in the server namespace, in cluster mode
(LOOSELEAF_CLUSTER names the Ray head), send their GPU cells to the GPU hosts through the user's cluster pool
(cluster/looseleaf_cluster/remote.py) and the user's relay on each host (relay.py); the workers are forks of
that host's zygotes in the user's host pool there.  Compared with ipykernel running the same cells.

Own module, own cluster (conftest's fixture is per module): test_cluster.py leaves a host dead.  The tests
run in order and share the kernels."""
import json
import os
import signal
import subprocess

import pytest

import clusterhelp
from test_cluster import Holder

pytestmark = pytest.mark.timeout(900)

HERE = os.path.dirname(os.path.abspath(__file__))
REF = [None]  # the reference kernel's id in the driver


class Driver:
    """kerneldriver.py in the server namespace: kernels started and run from there (their sockets are on
    the namespace's loopback)."""

    def __init__(self, cluster):
        env = dict(cluster.env, PYTHONPATH=HERE)
        for k in ("JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR",
                  "JUPYTER_PREFER_ENV_PATH", "PYDEVD_DISABLE_FILE_VALIDATION"):
            if k in os.environ:
                env[k] = os.environ[k]
        self.proc = subprocess.Popen(["ip", "netns", "exec", cluster.server, clusterhelp.PYTHON,
                                      os.path.join(HERE, "kerneldriver.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=cluster.dir)

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the kernel driver ended (rc %s)" % self.proc.poll()
        out = json.loads(line)
        assert "error" not in out, out
        return out

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def driver(cluster):
    d = Driver(cluster)
    yield d
    d.close()


def cluster_env(cluster):
    """What an administrator puts in the kernelspec's env for cluster mode (README "Cluster mode")."""
    return {"LOOSELEAF_CLUSTER": cluster.head, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster.token,
            "LOOSELEAF_PYTHON": clusterhelp.PYTHON, "LOOSELEAF_POOL_DIR": os.path.join(cluster.dir, "srvpool"),
            "LOOSELEAF_POOL_START_MS": "0"}


@pytest.fixture(scope="module")
def kernels(cluster, driver):
    ks = {"ll": driver.call(op="start", name="looseleaf", env=cluster_env(cluster))["kernel"],
          "ll2": driver.call(op="start", name="looseleaf", env=cluster_env(cluster))["kernel"],
          "ref": driver.call(op="start", name="python3")["kernel"]}
    REF[0] = ks["ref"]
    yield ks
    for k in ks.values():  # (a test may have stopped one: it pops it)
        driver.call(op="stop", kernel=k)


def gpu(driver, kernel, code):
    """Run CODE; ipykernel (the reference) gets it without its %%gpu line."""
    if kernel == REF[0]:
        code = code.replace("%%gpu\n", "", 1)
    return driver.call(op="exec", kernel=kernel, code=code)


def host_of(r):
    ll = r["reply_md"].get("looseleaf", {})
    assert ll.get("route") == "gpu", r
    return ll.get("host")


def in_namespace(cluster, host, pid):
    return pid in clusterhelp.Cluster.pids(cluster.ns(host))


def pool_logs(cluster):
    """The tails of the pools' logs (the cluster pool's, the hosts' pools'), for a failure's message."""
    out = []
    for root, _, files in os.walk(cluster.dir):
        for f in files:
            if f == "pool.log":
                with open(os.path.join(root, f), errors="replace") as fh:
                    out.append("== %s\n%s" % (os.path.join(root, f), fh.read()[-3000:]))
    return "\n".join(out)


def busy_slots(cluster, host):
    return len(cluster.hostd_stats(host)["lease_list"])


CELLS_1 = [
    "%%gpu\nx = 41\nnames = ['a', 'b']\nconf = {'lr': 0.1, 'layers': [3, 4]}\nprint('first', x, names)\nx + 1",
]
CELLS_2 = [
    "%%gpu\nx += 1\nnames.append('c')\nconf['layers'].append(5)\nprint(x, names, conf)\nlen(names)",
    "%%gpu\nraise ValueError('bad %d' % x)",
    "print(x, names, sorted(conf))",
]


def test_gpu_cell_runs_on_a_cluster_host(cluster, driver, kernels):
    """A GPU cell of a kernel on the server runs on a GPU host chosen by the placer, in a worker forked there
    (its pid lives in that host's namespace); outputs stream back as for a local worker and the reply names
    the host."""
    for code in CELLS_1:
        r = gpu(driver, kernels["ll"], code)
        ref = gpu(driver, kernels["ref"], code)
        assert r["status"] == ref["status"] == "ok", (r, ref)
        assert r["outputs"] == ref["outputs"], (r, ref)
    host = host_of(r)
    assert host in cluster.hosts, r["reply_md"]
    ll = r["reply_md"]["looseleaf"]
    assert ll.get("stays_warm"), ll
    assert in_namespace(cluster, host, ll["worker_pid"]), (host, ll["worker_pid"])
    # The worker is a fork of that host's zygote, in the user's host pool there, which leased its slot from
    # that host's broker (the warm worker holds it).
    assert busy_slots(cluster, host) == 1, cluster.hostd_stats(host)
    assert all(busy_slots(cluster, h) == 0 for h in cluster.hosts if h != host)


def test_cells_pack_onto_the_fullest_host(cluster, driver, kernels):
    """Consolidation with real kernels: a second session's first cell goes to the most loaded host with a
    free slot (the first session's host), and when another host is fuller, there."""
    r1 = gpu(driver, kernels["ll"], "%%gpu\nx")
    home = host_of(r1)
    assert r1["reply_md"]["looseleaf"].get("warm_hit"), r1  # the session's warm worker, on its home host
    r2 = gpu(driver, kernels["ll2"], "%%gpu\ny = 7\ny * 6")
    assert r2["status"] == "ok" and r2["outputs"] == [["result", "42"]], r2
    assert host_of(r2) == home, (home, r2["reply_md"])
    # A local user's pool on another host holds 3 of its 4 slots: that host is now the fullest with a free
    # slot (home: 2 warm workers), so a new session's cell packs there.
    other = [h for h in cluster.hosts if h != home][0]
    holder = Holder(cluster, other, 3)
    try:
        ll3 = driver.call(op="start", name="looseleaf", env=cluster_env(cluster))["kernel"]
        try:
            r3 = gpu(driver, ll3, "%%gpu\nz = 1\nz")
            assert r3["status"] == "ok", r3
            assert host_of(r3) == other, (other, r3["reply_md"])
            assert in_namespace(cluster, other, r3["reply_md"]["looseleaf"]["worker_pid"])
        finally:
            driver.call(op="stop", kernel=ll3)
    finally:
        holder.close()


def test_next_cell_on_another_host_sees_its_variables(cluster, driver, kernels):
    """The session's home host fills with a local user's cells and its warm worker there is gone (killed:
    an OOM kill, say): the session's next cells run on another host, restore what the earlier cells
    committed, commit what they change, and the kernel (CPU cell) sees it: same outputs as ipykernel."""
    r = gpu(driver, kernels["ll"], "%%gpu\nx")
    home = host_of(r)
    warm_pid = r["reply_md"]["looseleaf"]["worker_pid"]
    driver.call(op="stop", kernel=kernels.pop("ll2"))  # its warm worker on the home leaves with it
    clusterhelp.wait_for(lambda: busy_slots(cluster, home) == 1, 60, "the other session's lease on %s" % home)
    holders = [Holder(cluster, home, cluster.slots - 1)]
    try:
        os.kill(warm_pid, signal.SIGKILL)
        clusterhelp.wait_for(lambda: busy_slots(cluster, home) == cluster.slots - 1, 60,
                             "the killed warm worker's lease on %s" % home)
        holders.append(Holder(cluster, home, 1))  # the home is full: no slot, no warm worker of ours
        for code in CELLS_2:
            r = gpu(driver, kernels["ll"], code)
            ref = gpu(driver, kernels["ref"], code)
            assert r["status"] == ref["status"], (r, ref)
            assert r["outputs"] == ref["outputs"], (code, r, ref)
            if code.startswith("%%gpu"):
                h = host_of(r)
                assert h in cluster.hosts and h != home, (home, r["reply_md"])
                assert in_namespace(cluster, h, r["reply_md"]["looseleaf"]["worker_pid"])
    finally:
        for h in holders:
            h.close()


def send_marked(driver, kernel, mark, body="print('started', flush=True)\ntime.sleep(300)"):
    """Send a GPU cell that writes its worker's pid to MARK, then runs BODY; its msg_id and the pid."""
    sent = driver.call(op="send", kernel=kernel, code="%%gpu\nimport os, time\n" + (
        "with open(%r, 'w') as f:\n    f.write(str(os.getpid()))\n" % mark) + body)
    pid = int(clusterhelp.wait_for(lambda: os.path.exists(mark) and open(mark).read(), 120,
                                   "the cell to start"))
    return sent["msg_id"], pid


def test_interrupt_reaches_the_remote_worker(cluster, driver, kernels):
    """The frontend's interrupt (a signal to the kernel) reaches the worker on the GPU host: the cell ends in
    KeyboardInterrupt there, and the session's next cell runs on."""
    mark = os.path.join(cluster.dir, "interrupt.pid")
    msg_id, pid = send_marked(driver, kernels["ll"], mark)
    assert any(in_namespace(cluster, h, pid) for h in cluster.hosts), pid
    driver.call(op="interrupt", kernel=kernels["ll"])
    r = driver.call(op="collect", kernel=kernels["ll"], msg_id=msg_id)
    assert r["status"] == "error" and r["reply"]["ename"] == "KeyboardInterrupt", r
    assert r["outputs"][0] == ["stream", "stdout", "started\n"], r
    assert host_of(r) in cluster.hosts and in_namespace(cluster, host_of(r), pid), r["reply_md"]
    r = gpu(driver, kernels["ll"], "%%gpu\nx")
    assert r["status"] == "ok" and r["outputs"] == [["result", "42"]], r


def test_host_killed_mid_cell(cluster, driver, kernels):
    """Last (it leaves a host dead).  The host running a session's cell dies (its namespace: raylet, hostd,
    relay, pool, workers): the cell ends in HostGone naming the host, the session's next cell runs on another
    host from the last committed versions (same outputs as ipykernel), and a value whose only copy was in a
    worker on the dead host (a generator: no store holds it) raises LostVariable naming the host."""
    ll, ref = kernels["ll"], kernels["ref"]
    code = "%%gpu\ngen = (i * i for i in range(5))\nnext(gen)"
    r = gpu(driver, ll, code)
    assert r["status"] == "ok" and r["outputs"] == gpu(driver, ref, code)["outputs"], r
    home = host_of(r)
    assert "gen" in r["reply_md"]["looseleaf"].get("home", {}), r["reply_md"]  # it lives only there
    try:
        msg_id, pid = send_marked(driver, ll, os.path.join(cluster.dir, "mid-cell.pid"))
    except AssertionError as e:
        raise AssertionError("%s\n%s" % (e, pool_logs(cluster))) from None
    assert in_namespace(cluster, home, pid), (home, pid)
    cluster.kill_host(home)
    r = driver.call(op="collect", kernel=ll, msg_id=msg_id)
    assert r["status"] == "error" and r["reply"]["ename"] == "HostGone", r
    assert "GPU host %s is gone" % home in r["reply"]["evalue"], r
    assert any(o[0] == "error" and o[1] == "HostGone" for o in r["outputs"]), r
    # The session goes on elsewhere from its last committed versions.
    for code in ("%%gpu\nprint(x, names, conf)\nx", "print(x + 1)"):
        r = gpu(driver, ll, code)
        assert r["status"] == "ok" and r["outputs"] == gpu(driver, ref, code)["outputs"], r
    assert host_of(gpu(driver, ll, "%%gpu\nx")) not in (home, None)
    r = gpu(driver, ll, "%%gpu\nnext(gen)")
    assert r["status"] == "error" and r["reply"]["ename"] == "LostVariable", r
    assert "GPU host %s" % home in r["reply"]["evalue"], r

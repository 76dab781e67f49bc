"""A LooseLeaf cluster on one machine: network namespaces as hosts (the cluster mode's test bed).

One "server" namespace (the kernels' host, running the Ray head) and N "GPU host" namespaces, each linked to
the server's bridge by a veth pair (every interface lives inside a namespace: nothing is added to the
machine's own network), each running its `looseleaf hostd` (LL_POOL_SLOTS virtual slots), a raylet joined with
`ray start --address` (a `looseleaf_slot` resource of that many slots, a `looseleaf_host` label) and its agent
(cluster/looseleaf_cluster/agent.py).  Ray runs with token authentication.  The server runs a hostd too (it
issues cluster leases), and every hostd knows its host name and the cluster key (hostd/API.md, "Cluster
leases"); hosts named in `manual` get their namespace and link only (a test joins them, as an administrator
would, from a cluster config).

Names carry a per-run prefix (`llc<pid>x<random>-`); everything made is recorded before it is made, and
close() ends every process of the namespaces (by the pids `ip netns pids` lists: only ours live there), deletes
them (their veths go with them) and the run's temp dir, whatever failed before.  Root only.
"""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
RAY = os.path.join(REPO, ".venv", "bin", "ray")
LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
SUBNET = "10.251.0"  # inside the namespaces only: never seen by the machine's own network
HEAD_PORT = 6379


def usable():
    """Why the cluster tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not shutil.which("ip"):
        return "needs ip(8) (iproute2)"
    if not os.path.exists(RAY):
        return "Ray is not installed in .venv (requirements.txt pins it)"
    if not os.path.exists(os.path.join(REPO, "build", "cluster", "libllplace.so")):
        return "build/cluster/libllplace.so is missing: make all"
    return None


def ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.2)


def _run_alive(name):
    """Whether the run that named NAME (llc<pid>x...) is still alive; None when NAME is not a run's."""
    m = re.match(r"llc(\d+)x[0-9a-f]{4}(-|$)", name)
    if not m:
        return None
    return os.path.exists("/proc/%s" % m.group(1))


def sweep_dead_runs():
    """Namespaces and temp dirs of earlier runs whose test process died without its teardown (killed): their
    processes SIGKILLed, the namespaces deleted.  Only names this module makes (llc<pid>x<hex4>-...) whose pid
    is gone; another live run's are left alone."""
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if _run_alive(name) is False:
            try:
                Cluster.kill_ns(name)
            except AssertionError:
                continue
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    tmp = tempfile.gettempdir()
    for d in os.listdir(tmp):
        if re.fullmatch(r"llc\d+x[0-9a-f]{4}", d) and _run_alive(d) is False:
            shutil.rmtree(os.path.join(tmp, d), True)


class Cluster:
    """NHOSTS GPU-host namespaces of SLOTS slots each plus a server namespace, with Ray, brokers and agents."""

    def __init__(self, nhosts=3, slots=4, manual=()):
        self.prefix = "llc%dx%s" % (os.getpid(), secrets.token_hex(2))
        self.namespaces = []  # made so far, torn down by close()
        self.procs = []
        # Short: Ray's unix sockets live under it (session_<date>_<pid>/sockets/plasma_store, 107 bytes at most).
        self.dir = os.path.join(tempfile.gettempdir(), self.prefix)
        os.mkdir(self.dir, 0o700)
        self.slots = slots
        self.hosts = ["h%d" % (i + 1) for i in range(nhosts)]
        self.manual = set(manual)
        self.token = secrets.token_hex(32)
        self.key = os.path.join(self.dir, "cluster.key")  # the cluster key every hostd holds (0600, root's)
        with open(os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        self.head = "%s.1:%d" % (SUBNET, HEAD_PORT)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RAY_", "LL_", "LOOSELEAF_")) and k not in ("PYTHONPATH",)}
        self.env.update(
            HOME=self.dir, TMPDIR=self.dir, PYTHONPATH=os.path.join(REPO, "cluster"),
            RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0",
            # A dead host is noticed within seconds, not Ray's default half minute.
            RAY_health_check_initial_delay_ms="1000", RAY_health_check_period_ms="1000",
            RAY_health_check_timeout_ms="1000", RAY_health_check_failure_threshold="3")

    # -- names -----------------------------------------------------------
    def ns(self, host):
        return "%s-%s" % (self.prefix, host)

    @property
    def server(self):
        return self.ns("srv")

    def addr(self, host):
        return "%s.%d" % (SUBNET, 10 + self.hosts.index(host) + 1)

    def hostd_socket(self, host):
        return os.path.join(self.dir, host, "hostd.sock")

    # -- building ----------------------------------------------------------
    def _add_ns(self, name):
        self.namespaces.append(name)  # recorded first: close() deletes it even if what follows fails
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")

    def start(self):
        sweep_dead_runs()
        self._add_ns(self.server)
        ip("-n", self.server, "link", "add", "br0", "type", "bridge")
        ip("-n", self.server, "addr", "add", "%s.1/24" % SUBNET, "dev", "br0")
        ip("-n", self.server, "link", "set", "br0", "up")
        for h in self.hosts:
            ns = self.ns(h)
            self._add_ns(ns)
            ip("-n", self.server, "link", "add", "v" + h, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", self.server, "link", "set", "v" + h, "master", "br0")
            ip("-n", self.server, "link", "set", "v" + h, "up")
            ip("-n", ns, "addr", "add", "%s/24" % self.addr(h), "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
        self.start_hostd(self.server, "srv")
        self.ray_start(self.server, ["--head", "--port", str(HEAD_PORT), "--node-ip-address", "%s.1" % SUBNET,
                                     "--num-cpus", "0"], "srv")
        for h in self.hosts:
            if h not in self.manual:
                self.start_host(h)
        return self

    def ray_start(self, ns, args, tag):
        tmp = os.path.join(self.dir, tag, "ray")
        os.makedirs(tmp, exist_ok=True)
        head = ["--include-dashboard=false"] if "--head" in args else []  # refused on other nodes
        argv = [RAY, "start"] + args + head + [
            "--num-gpus", "0", "--include-log-monitor=false",
            "--object-store-memory", str(80 * 1024 * 1024), "--temp-dir", tmp, "--disable-usage-stats"]
        r = self.run_in(ns, argv, timeout=180)
        if r.returncode != 0:
            raise RuntimeError("ray start in %s failed:\n%s\n%s" % (ns, r.stdout[-3000:], r.stderr[-3000:]))

    def start_hostd(self, ns, h, args=None):
        """HOST's `looseleaf hostd` in namespace NS (ARGS: its cluster arguments, default the key and name)."""
        os.makedirs(os.path.join(self.dir, h), exist_ok=True)
        log = open(os.path.join(self.dir, h, "hostd.log"), "a")
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, LOOSELEAF, "hostd", "--socket", self.hostd_socket(h),
             "--slots", str(self.slots)] + (args or ["--cluster-key", self.key, "--host", h]),
            stdout=log, stderr=log, env=dict(self.env, LL_POOL_NO_CUDA="1")))
        log.close()
        wait_for(lambda: os.path.exists(self.hostd_socket(h)), 30, "hostd of %s" % h)

    def start_host(self, h):
        ns = self.ns(h)
        self.start_hostd(ns, h)
        self.ray_start(ns, ["--address", self.head, "--node-ip-address", self.addr(h), "--num-cpus", "1",
                            "--resources", json.dumps({"looseleaf_slot": self.slots}),
                            "--labels", "looseleaf_host=%s" % h], h)
        r = self.py_in(ns, ["-m", "looseleaf_cluster.agent", "--address", self.head, "--host", h,
                            "--hostd-socket", self.hostd_socket(h)])
        info = json.loads(r.stdout.strip().splitlines()[-1])
        assert info["host"] == h and info["slots"] == self.slots, info

    # -- running things --------------------------------------------------
    def run_in(self, ns, argv, timeout=120, check=False):
        r = subprocess.run(["ip", "netns", "exec", ns] + list(argv), capture_output=True, text=True,
                           env=self.env, timeout=timeout, cwd=self.dir)
        if check and r.returncode != 0:
            raise AssertionError("%s in %s: rc %d\n%s\n%s" % (argv, ns, r.returncode, r.stdout[-3000:],
                                                               r.stderr[-3000:]))
        return r

    def py_in(self, ns, args, timeout=120, check=True):
        return self.run_in(ns, [PYTHON] + list(args), timeout=timeout, check=check)

    def client(self, *args, check=True):
        """`python -m looseleaf_cluster.client ARGS` in the server namespace: its JSON lines."""
        r = self.py_in(self.server, ["-m", "looseleaf_cluster.client", "--address", self.head] + list(args),
                       check=False)
        if check:
            assert r.returncode == 0, (args, r.stdout[-3000:], r.stderr[-3000:])
        return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{") or
                line.startswith("[")]

    def hostd_stats(self, h):
        """HOST's broker's stats, asked in its namespace with `looseleaf top --json` (the administrator's view)."""
        r = self.run_in(self.ns(h), [LOOSELEAF, "top", "--socket", self.hostd_socket(h), "--json"], check=True)
        return json.loads(r.stdout)

    # -- faults and teardown ----------------------------------------------
    @staticmethod
    def pids(ns):
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    @staticmethod
    def kill_ns(ns, timeout=30):
        """SIGKILL every process of namespace NS (a host's raylet, broker, agent...) until none is left."""
        deadline = time.monotonic() + timeout
        while True:
            pids = Cluster.pids(ns)
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError("processes %s of %s survive SIGKILL" % (pids, ns))
            time.sleep(0.1)

    def kill_host(self, h):
        self.kill_ns(self.ns(h))

    def close(self):
        errors = []
        for ns in reversed(self.namespaces):  # the hosts first, the head last
            try:
                self.kill_ns(ns)
            except Exception as e:  # noqa: BLE001 - tear everything down, report after
                errors.append(str(e))
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                errors.append("pid %d did not end" % p.pid)
        for ns in reversed(self.namespaces):
            r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if r.returncode != 0 and ns in ip("netns", "list", check=False):
                errors.append("ip netns del %s: %s" % (ns, r.stderr.strip()))
        self.namespaces = []
        shutil.rmtree(self.dir, True)
        left = [ns for ns in ip("netns", "list", check=False).split() if ns.startswith(self.prefix)]
        if left or os.path.exists(self.dir):
            errors.append("left behind: %s" % (left + ([self.dir] if os.path.exists(self.dir) else [])))
        if errors:
            raise AssertionError("cluster teardown: " + "; ".join(errors))

    def logs(self):
        """The brokers' logs and Ray's raylet logs' tails, for a failure's message."""
        out = []
        for root, _, files in os.walk(self.dir):
            for f in files:
                if f in ("hostd.log", "raylet.out", "raylet.err", "gcs_server.err") or f.startswith("python-core-worker"):
                    try:
                        with open(os.path.join(root, f), errors="replace") as fh:
                            out.append("== %s\n%s" % (os.path.join(root, f), fh.read()[-2000:]))
                    except OSError:
                        pass
        return "\n".join(out)

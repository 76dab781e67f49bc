"""A Ray autoscaler node provider whose "machines" are network namespaces on this machine: each GPU host it
creates is a namespace linked to the server namespace's bridge by a veth pair, running its `looseleaf hostd`,
a raylet joined to the head (`ray start --address`, the `looseleaf_slot` resource, the `looseleaf_host` label)
and its agent (agent.py).  Ray's own `fake_multinode` provider starts its fake nodes in the head's namespace,
so they would share one address and one broker; this one gives each host its own, like separate machines.

Ray's autoscaler (the monitor on the head, `ray start --head --autoscaling-config FILE`) loads it by name:

    provider:
      type: external
      module: looseleaf_cluster.provider.NamespaceProvider
      disable_node_updaters: true        # nothing to ssh into: create_node starts the host itself
      disable_launch_config_check: true
      prefix: llhost                     # namespaces PREFIX-a1, PREFIX-a2, ...
      bridge_ns: llsrv                   # the namespace holding the bridge (the head's)
      bridge: br0
      subnet: 10.251.0                   # hosts get SUBNET.(first_addr + n)
      first_addr: 100
      head: 10.251.0.1:6379
      head_ip: 10.251.0.1
      state_dir: /var/lib/looseleaf/autoscale   # records, logs, hostd sockets, Ray temp dirs
      slots: 4                           # LL_POOL_SLOTS of each host
      (optional) ray, python, looseleaf, pythonpath, object_store_bytes, start_timeout_s, drain_timeout_s,
      hostd_args: [...]                  # more `looseleaf hostd` arguments; "{host}" becomes the host's name

A host is made whole or not at all.  Its record (STATE_DIR/NS.json) is written only once its raylet joined and
its agent answered; a start that fails at any step (the namespace, the broker, `ray start`, the agent) ends
every process of the namespace and deletes it, is logged and noted in STATE_DIR/events.log naming the host and
the step, and raises, so the autoscaler counts a failed launch and tries again at its next update.  A namespace
of ours without a record that no create of this process is making (the monitor died mid-start) is deleted
the next time the autoscaler lists the nodes.

Termination (the autoscaler's idle timeout, after the scaler drained the host and ended its agent: see
autoscale.py) waits up to drain_timeout_s for the host's broker to lend nothing, then ends every process of
the namespace (SIGTERM, then SIGKILL) and deletes it; its veth goes with it.  Root only.

The monitor must run in the machine's mount namespace: `ip netns add` mounts a new namespace on
/run/netns/NAME in its caller's mount namespace, and `ip netns exec` gives what it runs a mount namespace of
its own (a slave of the machine's), so a host added from under `ip netns exec` would be mounted for the monitor
only: everyone else (`ip netns pids`, an administrator, a teardown) would see an empty file and could not
reach its processes.  A head in a network namespace of its own is started with `nsenter --net=/run/netns/NS`,
which enters the network namespace only (tests/cluster/clusterhelp.py does so).
"""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (NODE_KIND_HEAD, NODE_KIND_WORKER, STATUS_UP_TO_DATE, TAG_RAY_NODE_KIND,
                                 TAG_RAY_NODE_NAME, TAG_RAY_NODE_STATUS, TAG_RAY_USER_NODE_TYPE)

from looseleaf_cluster import HOST_LABEL, SLOT_RESOURCE, hostd

logger = logging.getLogger(__name__)

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAD_ID = "head"


class HostStartFailed(RuntimeError):
    """A host could not be made; nothing of it is left."""


def _ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def netns_list():
    return [line.split()[0] for line in _ip("netns", "list", check=False).splitlines() if line.split()]


def ns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in r.stdout.split()]


def end_ns(ns, grace_s=5.0, timeout=30.0):
    """End every process of namespace NS (SIGTERM, SIGKILL after GRACE_S) and delete it.  Raises when a
    process survives or the namespace stays."""
    deadline = time.monotonic() + timeout
    sig, kill_at = signal.SIGTERM, time.monotonic() + grace_s
    while True:
        pids = ns_pids(ns)
        if not pids:
            break
        if time.monotonic() > kill_at:
            sig = signal.SIGKILL
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError("processes %s of namespace %s survive SIGKILL" % (pids, ns))
        time.sleep(0.1)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    if ns in netns_list():
        raise RuntimeError("namespace %s is still there after ip netns del" % ns)


class NamespaceProvider(NodeProvider):
    def __init__(self, provider_config, cluster_name):
        NodeProvider.__init__(self, provider_config, cluster_name)
        c = provider_config
        self.prefix = c["prefix"]
        self.bridge_ns = c["bridge_ns"]
        self.bridge = c.get("bridge", "br0")
        self.subnet = c["subnet"]
        self.first_addr = int(c.get("first_addr", 100))
        self.head = c["head"]
        self.head_ip = c.get("head_ip", self.head.rsplit(":", 1)[0])
        self.state_dir = c["state_dir"]
        self.slots = int(c["slots"])
        venv = os.path.join(_REPO, ".venv", "bin")
        self.ray = c.get("ray", os.path.join(venv, "ray"))
        self.python = c.get("python", os.path.join(venv, "python"))
        self.looseleaf = c.get("looseleaf", os.path.join(_REPO, "build", "looseleaf"))
        self.pythonpath = c.get("pythonpath", os.path.join(_REPO, "cluster"))
        self.object_store = int(c.get("object_store_bytes", 80 * 1024 * 1024))
        self.start_timeout = float(c.get("start_timeout_s", 180))
        self.drain_timeout = float(c.get("drain_timeout_s", 60))
        self.hostd_args = [str(a) for a in c.get("hostd_args", [])]
        os.makedirs(self.state_dir, 0o700, exist_ok=True)
        self.lock = threading.RLock()
        self.creating = set()  # namespaces a create of this process is making now: not half-made
        self.procs = {}  # namespace -> the broker's Popen (reaped when the host ends)
        self.head_tags = {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: c.get("head_type", "head"),
                          TAG_RAY_NODE_NAME: HEAD_ID, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}
        self._healed_at = 0.0
        self._heal()

    # -- records -------------------------------------------------------------
    def _ours(self, ns):
        """Whether NS names a host of this provider (PREFIX-a<n>): nothing else sharing the prefix (the
        server's namespace, an administrator's) is ever touched."""
        tail = ns[len(self.prefix) + 2:] if ns.startswith(self.prefix + "-a") else ""
        return tail.isdigit()

    def _rec_path(self, ns):
        return os.path.join(self.state_dir, ns + ".json")

    def _records(self):
        out = {}
        for f in os.listdir(self.state_dir):
            if f.endswith(".json") and self._ours(f[:-5]):
                try:
                    with open(os.path.join(self.state_dir, f)) as fh:
                        out[f[:-5]] = json.load(fh)
                except (OSError, ValueError):
                    continue  # written atomically: a torn one is not ours
        return out

    def _write_record(self, ns, rec):
        tmp = self._rec_path(ns) + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(rec, fh)
        os.rename(tmp, self._rec_path(ns))

    def _event(self, **kw):
        kw["t"] = time.time()
        try:
            with open(os.path.join(self.state_dir, "events.log"), "a") as fh:
                fh.write(json.dumps(kw) + "\n")
        except OSError:
            pass

    def _heal(self, force=False):
        """Delete our namespaces that are half-made (no record, no create making them) and records whose
        namespace is gone.  At most once a second (the autoscaler lists the nodes often)."""
        with self.lock:
            if not force and time.monotonic() - self._healed_at < 1.0:
                return
            self._healed_at = time.monotonic()
            recs = self._records()
            live = [ns for ns in netns_list() if self._ours(ns)]
            for ns in live:
                if ns not in recs and ns not in self.creating:
                    logger.warning("LooseLeaf: namespace %s is a half-made host (no record): deleting it", ns)
                    self._event(event="half_made_deleted", node=ns)
                    self._destroy(ns)
            for ns in recs:
                if ns not in live:
                    self._event(event="record_without_namespace", node=ns)
                    self._forget(ns)

    def _forget(self, ns):
        for p in (self._rec_path(ns),):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        shutil.rmtree(os.path.join(self.state_dir, ns), True)

    def _destroy(self, ns):
        try:
            end_ns(ns)
        finally:
            proc = self.procs.pop(ns, None)
            if proc is not None:
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            self._forget(ns)

    # -- NodeProvider ---------------------------------------------------------
    def non_terminated_nodes(self, tag_filters):
        self._heal()
        with self.lock:
            nodes = {HEAD_ID: self.head_tags}
            nodes.update({ns: r["tags"] for ns, r in self._records().items()})
        return [n for n, tags in nodes.items() if all(tags.get(k) == v for k, v in tag_filters.items())]

    def is_running(self, node_id):
        return node_id == HEAD_ID or os.path.exists(self._rec_path(node_id))

    def is_terminated(self, node_id):
        return not self.is_running(node_id)

    def node_tags(self, node_id):
        if node_id == HEAD_ID:
            return dict(self.head_tags)
        with self.lock:
            rec = self._records().get(node_id)
        if rec is None:
            raise KeyError("no LooseLeaf host %s" % node_id)
        return dict(rec["tags"])

    def set_node_tags(self, node_id, tags):
        with self.lock:
            if node_id == HEAD_ID:
                self.head_tags.update(tags)
                return
            rec = self._records().get(node_id)
            if rec is not None:
                rec["tags"].update(tags)
                self._write_record(node_id, rec)

    def internal_ip(self, node_id):
        if node_id == HEAD_ID:
            return self.head_ip
        with self.lock:
            rec = self._records().get(node_id)
        if rec is None:
            raise KeyError("no LooseLeaf host %s" % node_id)
        return rec["addr"]

    def external_ip(self, node_id):
        return self.internal_ip(node_id)

    def create_node(self, node_config, tags, count):
        return self.create_node_with_resources_and_labels(node_config, tags, count, {}, {})

    def create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        made, errors = {}, []
        for _ in range(count):
            try:
                ns = self._create_one(tags)
                made[ns] = self._records().get(ns, {})
            except HostStartFailed as e:
                errors.append(str(e))
        if errors:
            raise NodeLaunchException("host start failed", "%d of %d LooseLeaf host(s) did not start: %s" % (
                len(errors), count, "; ".join(errors)), None)
        return made

    def _next_host(self):
        """The next host number: one above every number in use or recorded (kept in STATE_DIR/next, so a
        host that went is not named again soon)."""
        used = set()
        for ns in netns_list() + list(self._records()):
            if self._ours(ns):
                used.add(int(ns[len(self.prefix) + 2:]))
        path = os.path.join(self.state_dir, "next")
        try:
            with open(path) as fh:
                n = int(fh.read().strip() or 1)
        except (OSError, ValueError):
            n = 1
        n = max([n] + [u + 1 for u in used])
        # Addresses wrap within the /24; skip those of hosts that are up.
        while self._addr(n) in {self._addr(u) for u in used}:
            n += 1
        with open(path, "w") as fh:
            fh.write(str(n + 1))
        return n

    def _addr(self, n):
        """Host N's address: SUBNET.(FIRST_ADDR + N), wrapping below .255."""
        return "%s.%d" % (self.subnet, self.first_addr + 1 + (n - 1) % (254 - self.first_addr))

    def _create_one(self, tags):
        with self.lock:
            n = self._next_host()
            name = "a%d" % n
            ns = "%s-%s" % (self.prefix, name)
            addr = self._addr(n)
            self.creating.add(ns)
        hdir = os.path.join(self.state_dir, ns)
        step = "namespace"
        t0 = time.monotonic()
        try:
            os.makedirs(hdir, 0o700, exist_ok=True)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            veth = "vl%s" % n  # the bridge side, in the server namespace (15 characters at most)
            _ip("-n", self.bridge_ns, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.bridge_ns, "link", "set", veth, "master", self.bridge)
            _ip("-n", self.bridge_ns, "link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", "%s/24" % addr, "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

            step = "hostd"
            env = self._env(ns, tags)
            sock = os.path.join(hdir, "hostd.sock")
            with open(os.path.join(hdir, "hostd.log"), "a") as log:
                proc = subprocess.Popen(["ip", "netns", "exec", ns, self.looseleaf, "hostd", "--socket", sock,
                                         "--slots", str(self.slots)] +
                                        [a.replace("{host}", name) for a in self.hostd_args], stdout=log, stderr=log,
                                        env=dict(env, LL_POOL_NO_CUDA="1"), start_new_session=True)
            self.procs[ns] = proc
            deadline = time.monotonic() + 30
            while not os.path.exists(sock):
                if proc.poll() is not None:
                    raise RuntimeError("looseleaf hostd exited %s: %s" % (proc.returncode, self._tail(hdir)))
                if time.monotonic() > deadline:
                    raise RuntimeError("looseleaf hostd made no socket in 30 s")
                time.sleep(0.1)

            step = "raylet"
            tmp = os.path.join(hdir, "ray")
            os.makedirs(tmp, exist_ok=True)
            self._run(ns, env, [self.ray, "start", "--address", self.head, "--node-ip-address", addr,
                                "--num-cpus", "1", "--num-gpus", "0",
                                "--resources", json.dumps({SLOT_RESOURCE: self.slots}),
                                "--labels", "%s=%s" % (HOST_LABEL, name), "--include-log-monitor=false",
                                "--object-store-memory", str(self.object_store), "--temp-dir", tmp,
                                "--disable-usage-stats"])

            step = "agent"
            out = self._run(ns, env, [self.python, "-m", "looseleaf_cluster.agent", "--address", self.head,
                                      "--host", name, "--hostd-socket", sock])
            info = json.loads(out.strip().splitlines()[-1])
            if info.get("host") != name or info.get("slots") != self.slots:
                raise RuntimeError("the agent answered %s" % info)

            all_tags = {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_NODE_NAME: name}
            all_tags.update(tags)
            all_tags[TAG_RAY_NODE_STATUS] = STATUS_UP_TO_DATE
            self._write_record(ns, {"tags": all_tags, "host": name, "addr": addr, "hostd_socket": sock,
                                    "node_id": info.get("node_id"), "created": time.time()})
            secs = time.monotonic() - t0
            logger.info("LooseLeaf: host %s (namespace %s, %s) is up in %.1f s", name, ns, addr, secs)
            self._event(event="started", node=ns, host=name, addr=addr, seconds=round(secs, 2))
            return ns
        except Exception as e:  # noqa: BLE001 - whatever failed, nothing of the host is left
            why = "host %s (namespace %s) did not start: %s failed: %s" % (name, ns, step, e)
            try:
                self._destroy(ns)
                why += "; its namespace is deleted"
            except Exception as e2:  # noqa: BLE001
                why += "; deleting its namespace failed too (%s): the next listing retries" % e2
            logger.error("LooseLeaf: %s", why)
            self._event(event="start_failed", node=ns, host=name, step=step, error=why)
            raise HostStartFailed(why) from None
        finally:
            with self.lock:
                self.creating.discard(ns)

    def _env(self, ns, tags):
        env = {k: v for k, v in os.environ.items()
               if k.startswith(("RAY_AUTH", "RAY_USAGE", "RAY_health", "RAY_TLS", "RAY_USE_TLS",
                                "RAY_raylet_start_wait_time_s"))
               or not k.startswith(("RAY_", "LL_", "LOOSELEAF_"))}
        env.update(PYTHONPATH=self.pythonpath, RAY_CLOUD_INSTANCE_ID=ns,
                   RAY_NODE_TYPE_NAME=tags.get(TAG_RAY_USER_NODE_TYPE, ""))
        return env

    def _run(self, ns, env, argv):
        r = subprocess.run(["ip", "netns", "exec", ns] + argv, capture_output=True, text=True, env=env,
                           timeout=self.start_timeout, cwd=self.state_dir)
        if r.returncode != 0:
            tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
            raise RuntimeError("%s exited %d: %s" % (os.path.basename(argv[0]), r.returncode, " | ".join(tail)))
        return r.stdout

    @staticmethod
    def _tail(hdir):
        try:
            with open(os.path.join(hdir, "hostd.log"), errors="replace") as fh:
                return fh.read()[-500:]
        except OSError:
            return ""

    def terminate_node(self, node_id):
        if node_id == HEAD_ID:
            logger.warning("LooseLeaf: the autoscaler asked to end the head: refused")
            return None
        with self.lock:
            rec = self._records().get(node_id)
        sock = rec.get("hostd_socket") if rec else None
        left = []
        deadline = time.monotonic() + self.drain_timeout
        while sock:
            try:
                left = hostd.stats(sock).get("lease_list", [])
            except hostd.HostdError:
                left = []
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if left:
            logger.error("LooseLeaf: host %s still lends %d slot(s) after %.0f s: ending it anyway (%s)",
                         node_id, len(left), self.drain_timeout, left)
        self._event(event="terminated", node=node_id, host=rec.get("host") if rec else None,
                    leases_left=len(left))
        with self.lock:
            self._destroy(node_id)
        logger.info("LooseLeaf: host %s ended", node_id)
        return None

    @staticmethod
    def bootstrap_config(cluster_config):
        return cluster_config


if __name__ == "__main__":
    sys.exit("a node provider: named in the autoscaling config, not run")

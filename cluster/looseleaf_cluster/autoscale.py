"""The cluster grows and shrinks with demand: the scaler, a detached Ray actor on the head (``ll-scaler``).

Every TICK_S it observes the cluster's load (the agents' snapshots: slots busy, cells queued at the brokers;
plus the requests waiting for a slot that ``client.Cluster.place(..., wait_s=...)`` registered here) and asks
ll_provision's C controller (the simulator's: square-root staffing over a window, hysteresis on the way down;
build/cluster/libllplace.so) how many GPU hosts to have.  The target goes to Ray's autoscaler as
``ray.autoscaler.sdk.request_resources`` bundles, one ``{looseleaf_slot: SLOTS}`` bundle per host; the
autoscaler starts hosts through its node provider (provider.py for network namespaces; a cloud's for
machines).

On the way down the scaler picks the host to release with ll_place_drain (the accepting host holding the
fewest slots: the consolidation rule emptied it) and has its agent drain it (no new request; wait until the
host's broker lends nothing); once drained the agent ends, the node holds nothing, and Ray's autoscaler
removes it after its idle timeout (``idle_timeout_minutes``), through the provider.  A drain that does not
finish in DRAIN_TIMEOUT_S is given up (the host takes requests again) and tried later; a rise of the load
while a host drains puts it back to work before any new host is asked for.

    python -m looseleaf_cluster.autoscale --address HEAD:PORT start [--slots 4 --target-util 0.8 ...]
    python -m looseleaf_cluster.autoscale --address HEAD:PORT status
    python -m looseleaf_cluster.autoscale --address HEAD:PORT stop
"""
import argparse
import ctypes
import json
import sys
import threading
import time

from looseleaf_cluster import AGENT_PREFIX, RAY_NAMESPACE, SLOT_RESOURCE, place

SCALER_NAME = "ll-scaler"
WAIT_TTL_S = 10.0  # a waiting request not renewed for this long is dropped (its client went)

DEFAULTS = dict(slots=4, target_util=0.8, p_wait=0.05, window_s=300.0, down_hold_s=600.0, min_hosts=0,
                max_hosts=0, idle_load=0.01, tick_s=2.0, drain_timeout_s=600.0)


class Provision:
    """ll_provision's controller (policy/ll_provision.h) through ctypes: ``observe``, ``load``, ``decide``."""

    def __init__(self, slots, target_util, p_wait, window_s, down_hold_s, min_hosts, max_hosts, idle_load):
        lib = place._load()
        if not hasattr(lib, "_ll_provision_typed"):
            vp, d, i = ctypes.c_void_p, ctypes.c_double, ctypes.c_int
            lib.ll_cluster_provision_new.argtypes = [i, d, d, d, d, i, i, d]
            lib.ll_cluster_provision_new.restype = vp
            lib.ll_cluster_provision_free.argtypes = [vp]
            lib.ll_provision_observe.argtypes = [vp, d, d, i]
            lib.ll_provision_load.argtypes = [vp]
            lib.ll_provision_load.restype = d
            lib.ll_provision_decide.argtypes = [vp, d, i]
            lib.ll_provision_decide.restype = i
            lib.ll_provision_gpus.argtypes = [d, d, d]
            lib.ll_provision_gpus.restype = i
            lib.ll_provision_beta.argtypes = [d]
            lib.ll_provision_beta.restype = d
            lib._ll_provision_typed = True
        self.lib = lib
        self.p = lib.ll_cluster_provision_new(int(slots), float(target_util), float(p_wait), float(window_s),
                                              float(down_hold_s), int(min_hosts), int(max_hosts),
                                              float(idle_load))
        if not self.p:
            raise ValueError("ll_provision refused the configuration: slots > 0, 0 < target_util <= 1, "
                             "0 < p_wait < 1, window_s > 0, down_hold_s >= 0, 0 <= min_hosts <= max_hosts "
                             "(0: unbounded), idle_load >= 0")

    def observe(self, now, busy, queued):
        self.lib.ll_provision_observe(self.p, float(now), float(busy), int(queued))

    def load(self):
        return self.lib.ll_provision_load(self.p)

    def decide(self, now, powered):
        return self.lib.ll_provision_decide(self.p, float(now), int(powered))

    def gpus(self, load, target_util, p_wait):
        return self.lib.ll_provision_gpus(float(load), float(target_util), self.lib.ll_provision_beta(p_wait))

    def __del__(self):
        if getattr(self, "p", None):
            self.lib.ll_cluster_provision_free(self.p)
            self.p = None


class Scaler:
    """The actor.  Its loop runs in a thread of its own; calls (``want``, ``status``...) come on others."""

    def __init__(self, cfg):
        import ray
        self.ray = ray
        self.cfg = dict(DEFAULTS, **cfg)
        c = self.cfg
        self.ctl = Provision(c["slots"], c["target_util"], c["p_wait"], c["window_s"], c["down_hold_s"],
                             c["min_hosts"], c["max_hosts"], c["idle_load"])
        self.lock = threading.Lock()
        self.waiting = {}  # request id -> when its client last said it waits
        self.requested = None  # hosts last asked of Ray's autoscaler
        self.draining = {}  # host -> (its drain's ObjectRef, since)
        self.last = {}  # what the last tick saw and decided, for status()
        self.errors = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="ll-scaler", daemon=True)
        self.thread.start()

    # -- the clients' side --------------------------------------------------
    def want(self, request_id):
        """REQUEST_ID waits for a slot (renewed by its client while it waits); the target counts it."""
        with self.lock:
            self.waiting[request_id] = time.monotonic()
            return dict(self.last, slots=self.cfg["slots"])

    def done(self, request_id):
        with self.lock:
            self.waiting.pop(request_id, None)

    def status(self):
        with self.lock:
            return dict(self.last, waiting=sorted(self.waiting), draining=sorted(self.draining),
                        errors=self.errors[-5:], config=self.cfg)

    def stop(self):
        self.stop_flag.set()
        self.thread.join(30)
        self._request(0)
        return True

    # -- the loop -------------------------------------------------------------
    def _loop(self):
        while not self.stop_flag.is_set():
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the scaler must outlive a bad tick; noted for status
                with self.lock:
                    self.errors.append("%s: %s: %s" % (time.strftime("%H:%M:%S"), type(e).__name__, e))
                    del self.errors[:-20]
            self.stop_flag.wait(self.cfg["tick_s"])

    def _agents(self):
        out = []
        for a in self.ray.util.list_named_actors(all_namespaces=True):
            if a.get("namespace") == RAY_NAMESPACE and a.get("name", "").startswith(AGENT_PREFIX):
                out.append(a["name"][len(AGENT_PREFIX):])
        return sorted(out)

    def _snapshots(self):
        refs = {}
        for h in self._agents():
            try:
                refs[h] = self.ray.get_actor(AGENT_PREFIX + h, namespace=RAY_NAMESPACE).snapshot.remote()
            except ValueError:
                continue
        out = []
        for h, ref in refs.items():
            try:
                out.append(self.ray.get(ref, timeout=10))
            except Exception:  # noqa: BLE001 - a host that does not answer counts as none
                continue
        return out

    def _request(self, hosts):
        from ray.autoscaler import sdk
        sdk.request_resources(bundles=[{SLOT_RESOURCE: self.cfg["slots"]}] * int(hosts))
        self.requested = int(hosts)

    def tick(self):
        now = time.monotonic()
        self._finish_drains()
        snaps = self._snapshots()
        with self.lock:
            for rid, t in list(self.waiting.items()):
                if now - t > WAIT_TTL_S:
                    del self.waiting[rid]
            nwait = len(self.waiting)
        up = [s for s in snaps if s.get("accepting")]
        busy = sum(s["busy"] for s in snaps)  # a draining host's running cells are load too
        queued = sum(s.get("queued", 0) for s in snaps) + nwait
        self.ctl.observe(now, busy, queued)
        # Powered: the hosts taking work, or what Ray was asked for while they boot.
        powered = max(len(up), self.requested or 0)
        want = self.ctl.decide(now, powered)
        if want > len(up) and self.draining:
            for h in sorted(self.draining)[:want - len(up)]:  # back to work before asking for new hosts
                self._resume(h)
        if want != self.requested:
            self._request(want)
        if want < len(up):
            for _ in range(len(up) - want):  # (UP: the hosts not draining already)
                cand = [s for s in up if s["host"] not in self.draining]
                i = place.drain(cand)
                if i < 0:
                    break
                self._drain(cand[i]["host"])
        with self.lock:
            self.last = {"t": time.time(), "hosts": sorted(s["host"] for s in snaps), "accepting": len(up),
                         "busy": busy, "queued": queued, "waiting_requests": nwait, "load": self.ctl.load(),
                         "target_hosts": want, "requested_hosts": self.requested}

    def _drain(self, host):
        try:
            agent = self.ray.get_actor(AGENT_PREFIX + host, namespace=RAY_NAMESPACE)
        except ValueError:
            return
        self.draining[host] = (agent.drain.remote(self.cfg["drain_timeout_s"]), time.monotonic())

    def _resume(self, host):
        self.draining.pop(host, None)
        try:
            self.ray.get(self.ray.get_actor(AGENT_PREFIX + host, namespace=RAY_NAMESPACE).resume.remote(),
                         timeout=30)
        except Exception as e:  # noqa: BLE001 - a host gone meanwhile: nothing to resume
            self.errors.append("resume %s: %s" % (host, e))

    def _finish_drains(self):
        for host, (ref, _since) in list(self.draining.items()):
            ready, _ = self.ray.wait([ref], timeout=0)
            if not ready:
                continue
            del self.draining[host]
            try:
                r = self.ray.get(ref)
            except Exception as e:  # noqa: BLE001 - the agent died while draining: Ray removes its node
                self.errors.append("drain %s: %s" % (host, e))
                continue
            if r.get("drained"):
                # Drained: the agent ends, its node holds nothing, and Ray's autoscaler removes it after
                # its idle timeout (the provider deletes the host).
                self.ray.kill(self.ray.get_actor(AGENT_PREFIX + host, namespace=RAY_NAMESPACE))
            else:
                self.errors.append("drain of %s gave up after %ss, leases left %s" % (
                    host, self.cfg["drain_timeout_s"], r.get("left")))
                self._resume(host)


def scaler(ray):
    """The running scaler's handle, or None (autoscaling is off)."""
    try:
        return ray.get_actor(SCALER_NAME, namespace=RAY_NAMESPACE)
    except ValueError:
        return None


def start(ray, cfg, timeout=60):
    """Start the scaler (detached, on the head node) with CFG over DEFAULTS; its status once it answers.
    Refuses a bad configuration before anything starts."""
    Provision(**{k: dict(DEFAULTS, **cfg)[k] for k in ("slots", "target_util", "p_wait", "window_s",
                                                        "down_hold_s", "min_hosts", "max_hosts", "idle_load")})
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    node = next((n["NodeID"] for n in ray.nodes()
                 if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})), None)
    opts = dict(name=SCALER_NAME, namespace=RAY_NAMESPACE, lifetime="detached", num_cpus=0,
                max_concurrency=8, max_restarts=-1)
    if node:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    actor = ray.remote(Scaler).options(**opts).remote(cfg)
    return ray.get(actor.status.remote(), timeout=timeout)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m looseleaf_cluster.autoscale", description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="the Ray head, HOST:PORT")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    for k, v in DEFAULTS.items():
        s.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    sub.add_parser("status")
    sub.add_parser("stop")
    a = ap.parse_args(argv)
    import ray
    ray.init(address=a.address, namespace=RAY_NAMESPACE, logging_level="ERROR", log_to_driver=False)
    try:
        if a.cmd == "start":
            print(json.dumps(start(ray, {k: getattr(a, k) for k in DEFAULTS})), flush=True)
            return 0
        sc = scaler(ray)
        if sc is None:
            print(json.dumps({"error": "autoscaling is off: no %s actor" % SCALER_NAME}))
            return 2
        if a.cmd == "status":
            print(json.dumps(ray.get(sc.status.remote(), timeout=30)))
        else:
            ray.get(sc.stop.remote(), timeout=60)
            ray.kill(sc)
            print(json.dumps({"stopped": True}))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The server side of the cluster (the kernels' host): which GPU hosts there are and how loaded, placement of
a slot request with ll_place's rule, and the chosen host's agent taking the slot.  A host whose node, agent or
broker is gone is reported so (``HostGone``, naming the host and why), never a bare Ray error.

CLI (JSON on stdout), for administrators and the tests:
    python -m looseleaf_cluster.client --address HEAD:PORT status
    python -m looseleaf_cluster.client --address HEAD:PORT place REQUEST_ID [REQUEST_ID ...]
    python -m looseleaf_cluster.client --address HEAD:PORT release HOST REQUEST_ID
"""
import argparse
import json
import sys

from looseleaf_cluster import AGENT_PREFIX, HOST_LABEL, RAY_NAMESPACE, HostGone, NoHost, place

CALL_TIMEOUT = 20.0  # s an agent may take to answer before its host counts as unreachable


class Cluster:
    def __init__(self, address=None):
        import ray
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, namespace=RAY_NAMESPACE, logging_level="ERROR", log_to_driver=False)

    def close(self):
        self.ray.shutdown()

    def nodes(self):
        """host name -> its Ray node (the live one when a host's raylet came back under the same name)."""
        out = {}
        for n in self.ray.nodes():
            host = n.get("Labels", {}).get(HOST_LABEL)
            if host and (host not in out or n.get("Alive")):
                out[host] = n
        return out

    def hosts(self):
        """Every GPU host the cluster knows: a node labelled with a host name (alive or dead) or an agent."""
        names = set(self.nodes())
        for a in self.ray.util.list_named_actors(all_namespaces=True):
            if a.get("namespace") == RAY_NAMESPACE and a.get("name", "").startswith(AGENT_PREFIX):
                names.add(a["name"][len(AGENT_PREFIX):])
        return sorted(names)

    def _gone_why(self, host, err=None):
        node = self.nodes().get(host)
        if node is None:
            why = "no Ray node is labelled %s=%s" % (HOST_LABEL, host)
        elif not node.get("Alive"):
            why = "its Ray node %s (%s) is dead" % (node.get("NodeManagerAddress"), node.get("NodeID", "")[:12])
        else:
            why = "its agent does not answer"
        if err is not None:
            why += " (%s: %s)" % (type(err).__name__, str(err).strip().splitlines()[0][:200] if str(err) else "")
        return why

    def call(self, host, method, *args, timeout=CALL_TIMEOUT):
        """METHOD(*ARGS) of HOST's agent; HostGone when the host's node, agent or broker is gone."""
        from ray import exceptions as rx
        try:
            actor = self.ray.get_actor(AGENT_PREFIX + host, namespace=RAY_NAMESPACE)
        except ValueError as e:
            raise HostGone(host, self._gone_why(host, e)) from None
        try:
            return self.ray.get(getattr(actor, method).remote(*args), timeout=timeout)
        except (rx.RayActorError, rx.GetTimeoutError) as e:
            raise HostGone(host, self._gone_why(host, e)) from None
        except rx.RayTaskError as e:  # the agent's own error (its broker gone, a bad request): named as such
            cause = e.cause if getattr(e, "cause", None) is not None else e
            if type(cause).__name__ == "HostdError":
                raise HostGone(host, "its hostd: %s" % cause) from None
            raise cause from None

    def status(self):
        """[{host, accepting, slots, busy, warm, queued} or {host, accepting: False, gone: why}], by name."""
        import ray
        out = []
        actors = {}
        for host in self.hosts():
            try:
                actors[host] = self.ray.get_actor(AGENT_PREFIX + host, namespace=RAY_NAMESPACE).snapshot.remote()
            except ValueError as e:
                actors[host] = e
        for host, ref in actors.items():
            try:
                if isinstance(ref, Exception):
                    raise HostGone(host, self._gone_why(host, ref))
                try:
                    out.append(ray.get(ref, timeout=CALL_TIMEOUT))
                except Exception as e:  # noqa: BLE001 - every failure of a host makes it gone
                    raise HostGone(host, self._gone_why(host, e)) from None
            except HostGone as g:
                out.append({"host": host, "accepting": False, "slots": 0, "busy": 0, "warm": 0, "queued": 0,
                            "gone": str(g)})
        return out

    def place(self, request_id, tries=5):
        """Place REQUEST_ID: the host ll_place's rule picks among the hosts as they are now, whose agent then
        leases a slot from its broker.  {host, slot, how, request_id}; NoHost when no host can take it."""
        last = None
        for _ in range(tries):
            hosts = self.status()
            i, how = place.choose(hosts)
            if i < 0:
                gone = [h["gone"] for h in hosts if "gone" in h]
                raise NoHost("no GPU host can take %s now (%d host(s)%s)" % (
                    request_id, len(hosts), "; " + "; ".join(gone) if gone else ""))
            host = hosts[i]["host"]
            if how == "queue":
                gone = [h["gone"] for h in hosts if "gone" in h]
                raise NoHost("every GPU host is full: %s would wait on %s (queueing is not done yet)%s" % (
                    request_id, host, "; " + "; ".join(gone) if gone else ""))
            try:
                got = self.call(host, "acquire", request_id)
            except HostGone as g:  # gone between the snapshot and the call: place again without it
                last = g
                continue
            if got is not None:
                return dict(got, how=how, request_id=request_id)
        raise last or NoHost("no GPU host granted %s after %d tries" % (request_id, tries))

    def release(self, host, request_id):
        return self.call(host, "release", request_id)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m looseleaf_cluster.client")
    ap.add_argument("--address", required=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status")
    p = sub.add_parser("place")
    p.add_argument("request_ids", nargs="+")
    r = sub.add_parser("release")
    r.add_argument("host")
    r.add_argument("request_id")
    a = ap.parse_args(argv)
    c = Cluster(a.address)
    try:
        if a.cmd == "status":
            print(json.dumps(c.status()))
        elif a.cmd == "place":
            for rid in a.request_ids:
                print(json.dumps(c.place(rid)), flush=True)
        else:
            print(json.dumps({"host": a.host, "slot": c.release(a.host, a.request_id)}))
    except (HostGone, NoHost) as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
        return 2
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

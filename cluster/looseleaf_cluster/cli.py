"""`looseleaf cluster ...` and `looseleaf top --cluster` (the C program execs this module; README, "Cluster
mode"): an administrator's commands, each reading the cluster config (config.py) unless told otherwise.

    looseleaf cluster keygen [PATH]        write a new cluster key (default: the config's key_file), 0600
    looseleaf cluster check                the config, the key, Ray's token, the hostd, the head: each
                                           problem on a line, exit 1 if any
    looseleaf cluster raylet               run this host's raylet in the foreground (its systemd unit)
    looseleaf cluster raylet-stop          stop it (`ray stop`: the unit's ExecStopPost)
    looseleaf cluster agent                start this host's agent (its systemd unit; returns once it answers)
    looseleaf cluster status               every GPU host as the server sees it (JSON)
    looseleaf top --cluster [--json | --prometheus]
                                           every host: slots busy / warm / queued, its users, gone or not
Options: --config PATH (else $LL_CLUSTER_CONFIG, else /etc/looseleaf/cluster.json); status and top also take
--address HEAD:PORT instead of a config (Ray's token then comes from RAY_AUTH_TOKEN)."""
import argparse
import json
import os
import secrets
import shutil
import sys

from looseleaf_cluster import HOST_LABEL, SLOT_RESOURCE, config, hostd


def _fail(msg, code=1):
    print("looseleaf cluster: %s" % msg, file=sys.stderr)
    return code


def keygen(path, force=False):
    if os.path.exists(path) and not force:
        raise config.ConfigError("cluster key %s exists (--force replaces it; every host needs the same key)"
                                 % path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    tmp = path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def check(c, head=True):
    """Problems with this host's setup, one line each (empty: all is well)."""
    problems = []
    try:
        # The key is root's: a non-root administrator can check its mode, not read it.
        config.check_secret_file(c["key_file"], "cluster key", must_read=os.geteuid() == 0)
    except config.ConfigError as e:
        problems.append(str(e))
    try:
        config.check_secret_file(c["ray_token_file"], "Ray token", must_read=False)
    except config.ConfigError as e:
        problems.append(str(e))
    r = c.get("redis") or {}
    if "password_file" in r:
        try:
            config.check_secret_file(r["password_file"], "Redis password file", must_read=False)
        except config.ConfigError as e:
            problems.append(str(e))
    try:
        hostd.stats(c["hostd_socket"])
    except hostd.HostdError as e:
        problems.append("%s (is looseleaf-hostd running? systemctl status looseleaf-hostd)" % e)
    if head:
        why = config.head_reachable(c)
        if why:
            problems.append(why)
    return problems


def raylet_argv(c, ray="ray"):
    """The `ray start` of this host, from its config (--block: the unit's main process)."""
    argv = [ray, "start", "--block", "--disable-usage-stats", "--num-gpus", "0"]
    if c["role"] == "server":
        host, port = config._address("cluster config", "head", c["head"])
        argv += ["--head", "--port", str(port), "--num-cpus", "0", "--include-dashboard=false"]
    else:
        argv += ["--address", c["head"], "--resources", json.dumps({SLOT_RESOURCE: c["slots"]}),
                 "--labels", "%s=%s" % (HOST_LABEL, c["host"])]
    if "node_ip" in c:
        argv += ["--node-ip-address", c["node_ip"]]
    return argv + list(c.get("ray_args", []))


# -- top --cluster ----------------------------------------------------------------------------------------

def _users(h):
    """HOST's users as `alice(2 busy) bob(1 warm 1 waiting)`."""
    out = []
    for u in h.get("users", []):
        name = u.get("name") or "uid %s" % u.get("uid")
        load = " ".join("%d %s" % (u[k], k) for k in ("busy", "warm", "waiting") if u.get(k))
        out.append("%s(%s)" % (name, load) if load else name)
    return " ".join(out)


def render_table(status):
    """`looseleaf top --cluster`: a line per host."""
    rows = [("HOST", "STATE", "SLOTS", "BUSY", "WARM", "QUEUED", "USERS")]
    for h in status:
        if "gone" in h:
            rows.append((h["host"], "GONE", "-", "-", "-", "-", h["gone"]))
        else:
            rows.append((h["host"], "up", str(h["slots"]), str(h["busy"]), str(h["warm"]), str(h["queued"]),
                         _users(h) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6] for r in rows]
    up = [h for h in status if "gone" not in h]
    lines.append("%d host(s), %d gone; slots %d, busy %d, warm %d, queued %d" % (
        len(status), len(status) - len(up), sum(h["slots"] for h in up), sum(h["busy"] for h in up),
        sum(h["warm"] for h in up), sum(h["queued"] for h in up)))
    return "\n".join(lines) + "\n"


def _label(v):
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(status):
    """Per-host metrics (Prometheus text): the hosts' own hostds serve theirs on 127.0.0.1 only; this is the
    cluster's view, for a node_exporter textfile or a scrape job running it."""
    out = []

    def metric(name, help_, rows):
        out.append("# HELP looseleaf_cluster_%s %s" % (name, help_))
        out.append("# TYPE looseleaf_cluster_%s gauge" % name)
        for labels, v in rows:
            out.append("looseleaf_cluster_%s{%s} %s" % (
                name, ",".join('%s="%s"' % (k, _label(x)) for k, x in labels), v))

    metric("host_up", "1 while the GPU host answers, 0 when it is gone.",
           [((("host", h["host"]),), 0 if "gone" in h else 1) for h in status])
    up = [h for h in status if "gone" not in h]
    for key, name, help_ in (("slots", "host_slots", "GPU slots of the host."),
                             ("busy", "host_busy_slots", "Slots running a cell (every user's)."),
                             ("warm", "host_warm_slots", "Slots holding a warm worker."),
                             ("queued", "host_queued_cells", "Cells waiting for a slot on the host.")):
        metric(name, help_, [((("host", h["host"]),), h[key]) for h in up])
    for key, name in (("busy", "host_user_busy_slots"), ("warm", "host_user_warm_slots"),
                      ("waiting", "host_user_waiting_cells")):
        metric(name, "Per user on the host: %s." % key,
               [((("host", h["host"]), ("uid", u.get("uid")), ("user", u.get("name") or "")), u.get(key, 0))
                for h in up for u in h.get("users", [])])
    return "\n".join(out) + "\n"


def _cluster(a):
    from looseleaf_cluster import client
    address = a.address
    if not address:
        c = config.load(a.config)
        os.environ.update(config.ray_env(c))
        address = c["head"]
        why = config.head_reachable(c)
        if why:
            raise config.ConfigError(why)
    return client.Cluster(address)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="looseleaf cluster",
                                 description="The cluster administrator's commands (README, \"Cluster mode\").")
    ap.add_argument("--config", default=None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keygen")
    k.add_argument("path", nargs="?")
    k.add_argument("--force", action="store_true")
    ch = sub.add_parser("check")
    ch.add_argument("--no-head", action="store_true", help="do not try to reach the Ray head")
    sub.add_parser("raylet")
    sub.add_parser("raylet-stop")
    sub.add_parser("agent")
    for name in ("status", "top"):
        p = sub.add_parser(name)
        p.add_argument("--address", default=None)
        if name == "top":
            p.add_argument("--json", action="store_true")
            p.add_argument("--prometheus", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    where = None  # --config may come anywhere (`looseleaf top --cluster --config X`)
    if "--config" in argv[:-1]:
        i = argv.index("--config")
        where = argv[i + 1]
        del argv[i:i + 2]
    a = ap.parse_args(argv)
    a.config = where or a.config
    try:
        if a.cmd == "keygen":
            path = a.path or (config.load(a.config)["key_file"] if a.config or
                              os.path.exists(config.path_of()) else config.DEFAULTS["key_file"])
            print("looseleaf cluster: wrote a new cluster key to %s (copy it to every host, root 0600)"
                  % keygen(path, a.force))
            return 0
        if a.cmd in ("status", "top"):
            cl = _cluster(a)
            try:
                st = cl.status()
            finally:
                cl.close()
            if a.cmd == "status" or a.json:
                print(json.dumps(st))
            else:
                sys.stdout.write(render_prometheus(st) if a.prometheus else render_table(st))
            return 0
        c = config.load(a.config)
        if a.cmd == "check":
            problems = check(c, head=not a.no_head)
            for p in problems:
                print("looseleaf cluster check: %s" % p, file=sys.stderr)
            if not problems:
                print("looseleaf cluster check: %s (%s) ok: config %s, key, token, hostd %s%s" % (
                    c["host"], c["role"], c["path"], c["hostd_socket"], "" if a.no_head else ", head " + c["head"]))
            return 1 if problems else 0
        os.environ.update(config.ray_env(c))
        os.environ.update(config.redis_env(c))
        if a.cmd in ("raylet", "raylet-stop"):
            if c["role"] == "gpu" and a.cmd == "raylet":
                why = config.head_reachable(c)
                if why:
                    raise config.ConfigError(why)
            ray = shutil.which("ray", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
            if not ray:
                raise config.ConfigError("no `ray` beside %s or on PATH (requirements.txt pins it)" % sys.executable)
            os.execv(ray, raylet_argv(c, ray) if a.cmd == "raylet" else [ray, "stop"])
        if a.cmd == "agent":
            if c["role"] != "gpu":
                raise config.ConfigError("cluster config %s: role %s runs no agent" % (c["path"], c["role"]))
            from looseleaf_cluster import agent
            return agent.main(["--address", c["head"], "--host", c["host"], "--hostd-socket", c["hostd_socket"],
                               "--slots", str(c["slots"])])
    except config.ConfigError as e:
        return _fail(str(e))
    except Exception as e:  # noqa: BLE001 - an administrator's command: one clear line, not a traceback
        return _fail("%s: %s" % (type(e).__name__, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())

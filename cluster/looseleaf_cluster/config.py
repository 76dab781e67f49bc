"""The cluster config: one JSON file per host (default /etc/looseleaf/cluster.json, else $LL_CLUSTER_CONFIG),
read by the agent, the raylet's unit, `looseleaf cluster` and `looseleaf hostd --cluster-config` (which reads
its "host" and "key_file").  JSON, not TOML: the hostd (C) reads it with the JSON library it already links.

    {
      "head": "10.0.0.1:6379",              the Ray head (GCS) address, HOST:PORT
      "host": "gpu1",                       this host's name: its raylet's looseleaf_host label, its hostd's
                                            name in leases ([A-Za-z0-9._-], 1..63)
      "role": "gpu",                        "gpu" (raylet + hostd + agent) or "server" (the kernels' host:
                                            the Ray head and a hostd that issues leases)
      "slots": 4,                           GPU slots this host offers the cluster (gpu role; 1..64)
      "key_file": "/etc/looseleaf/cluster.key",        the cluster key (root, 0600; the same everywhere)
      "ray_token_file": "/etc/looseleaf/ray.token",    Ray's auth token (RAY_AUTH_MODE=token), 0600
      "hostd_socket": "/run/looseleaf/hostd.sock",
      "redis": {"address": "10.0.0.1:6380", "user": "looseleaf",
                "password_file": "/etc/looseleaf/redis.pass"},
      "python": "/opt/looseleaf/.venv/bin/python",     the Python with Ray (for `looseleaf cluster`)
      "node_ip": "10.0.0.11",               optional: this host's address in the cluster (multi-homed hosts)
      "ray_args": ["--object-store-memory", "8000000000"]   optional: more `ray start` arguments
    }

Every key is checked (type, range, unknown keys are refused: a typo is an error, not a default), and every
error names the file and the key."""
import json
import os
import re
import socket
import stat

DEFAULT_PATH = "/etc/looseleaf/cluster.json"
DEFAULTS = {"role": "gpu", "key_file": "/etc/looseleaf/cluster.key", "hostd_socket": "/run/looseleaf/hostd.sock",
            "ray_token_file": "/etc/looseleaf/ray.token"}
KEYS = {"head", "host", "role", "slots", "key_file", "ray_token_file", "hostd_socket", "redis", "python",
        "node_ip", "ray_args"}
REDIS_KEYS = {"address", "user", "password_file"}
NAME = re.compile(r"[A-Za-z0-9._-]{1,63}\Z")
ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})\Z")


class ConfigError(ValueError):
    """The cluster config (or a file it names) is missing, malformed or unusable; the message says which
    file, which key and what to do."""


def path_of(path=None):
    return path or os.environ.get("LL_CLUSTER_CONFIG") or DEFAULT_PATH


def _address(where, key, value):
    m = ADDRESS.match(value) if isinstance(value, str) else None
    if not m or not 0 < int(m.group("port")) < 65536:
        raise ConfigError("%s: '%s' must be HOST:PORT, not %r" % (where, key, value))
    return m.group("host").strip("[]"), int(m.group("port"))


def parse(text, where="cluster config"):
    """The config in TEXT (JSON), checked; a dict with the defaults filled in."""
    try:
        c = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError("%s: not valid JSON: %s (line %d, column %d)" % (where, e.msg, e.lineno, e.colno)) \
            from None
    if not isinstance(c, dict):
        raise ConfigError("%s: must be a JSON object" % where)
    unknown = sorted(set(c) - KEYS)
    if unknown:
        raise ConfigError("%s: unknown key(s) %s (known: %s)" % (where, ", ".join(unknown), ", ".join(sorted(KEYS))))
    for key in ("head", "host"):
        if key not in c:
            raise ConfigError("%s: '%s' is missing" % (where, key))
    _address(where, "head", c["head"])
    if not isinstance(c["host"], str) or not NAME.match(c["host"]):
        raise ConfigError("%s: 'host' must be a name of 1..63 [A-Za-z0-9._-], not %r" % (where, c["host"]))
    out = dict(DEFAULTS, **c)
    if out["role"] not in ("gpu", "server"):
        raise ConfigError("%s: 'role' must be \"gpu\" or \"server\", not %r" % (where, out["role"]))
    if out["role"] == "gpu":
        s = out.get("slots")
        if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= 64:
            raise ConfigError("%s: 'slots' must be an integer 1..64 on a gpu host, not %r" % (where, s))
    for key in ("key_file", "ray_token_file", "hostd_socket", "python"):
        if key in out and (not isinstance(out[key], str) or not out[key].startswith("/")):
            raise ConfigError("%s: '%s' must be an absolute path, not %r" % (where, key, out[key]))
    if "node_ip" in out and (not isinstance(out["node_ip"], str) or not out["node_ip"]):
        raise ConfigError("%s: 'node_ip' must be an address" % where)
    if "ray_args" in out and (not isinstance(out["ray_args"], list)
                              or not all(isinstance(x, str) for x in out["ray_args"])):
        raise ConfigError("%s: 'ray_args' must be a list of strings" % where)
    r = out.get("redis")
    if r is not None:
        if not isinstance(r, dict):
            raise ConfigError("%s: 'redis' must be an object" % where)
        unknown = sorted(set(r) - REDIS_KEYS)
        if unknown:
            raise ConfigError("%s: unknown key(s) redis.%s" % (where, ", redis.".join(unknown)))
        if "address" not in r:
            raise ConfigError("%s: 'redis.address' is missing" % where)
        _address(where, "redis.address", r["address"])
        if ("user" in r) != ("password_file" in r):
            raise ConfigError("%s: 'redis.user' and 'redis.password_file' go together (an ACL user and its "
                              "password)" % where)
        if "user" in r and (not isinstance(r["user"], str) or not NAME.match(r["user"])):
            raise ConfigError("%s: 'redis.user' must be a name, not %r" % (where, r["user"]))
        if "password_file" in r and (not isinstance(r["password_file"], str)
                                     or not r["password_file"].startswith("/")):
            raise ConfigError("%s: 'redis.password_file' must be an absolute path" % where)
    return out


def load(path=None):
    """The config at PATH (else $LL_CLUSTER_CONFIG, else DEFAULT_PATH), checked."""
    path = path_of(path)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError("cluster config %s: %s (write one: README, \"Cluster mode\"; or set "
                          "LL_CLUSTER_CONFIG)" % (path, e.strerror)) from None
    c = parse(text, "cluster config %s" % path)
    c["path"] = path
    return c


def check_secret_file(path, what, must_read=True):
    """A secret file (the cluster key, Ray's token, Redis's password): present, a regular file, closed to
    group and others.  Its text when MUST_READ (stripped)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError as e:
        hint = " (make one with `looseleaf cluster keygen %s`, as root, and copy it to every host)" % path \
            if what == "cluster key" and e.errno == 2 else ""
        raise ConfigError("%s %s: %s%s" % (what, path, e.strerror, hint)) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("%s %s: not a regular file" % (what, path))
    if st.st_mode & 0o077:
        raise ConfigError("%s %s: mode %04o: others may read it (chmod 600)" % (what, path, st.st_mode & 0o7777))
    if not must_read:
        return None
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        raise ConfigError("%s %s: %s" % (what, path, e.strerror)) from None


def ray_env(c):
    """What every Ray process of the cluster needs in its environment: token authentication on, the token
    from the config's ray_token_file (when it exists; else the environment's RAY_AUTH_TOKEN is kept)."""
    env = {"RAY_AUTH_MODE": "token"}
    if os.path.exists(c["ray_token_file"]) or not os.environ.get("RAY_AUTH_TOKEN"):
        env["RAY_AUTH_TOKEN"] = check_secret_file(c["ray_token_file"], "Ray token")
    return env


def redis_env(c):
    """The store's Redis login (store/ll_redis.c reads these): LL_REDIS_USER, LL_REDIS_PASSWORD_FILE."""
    r = c.get("redis") or {}
    if "user" not in r:
        return {}
    return {"LL_REDIS_USER": r["user"], "LL_REDIS_PASSWORD_FILE": r["password_file"]}


def head_reachable(c, timeout=3.0):
    """None when the Ray head answers a TCP connection, else why not (for a clear error)."""
    host, port = _address("cluster config", "head", c["head"])
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return "the Ray head %s (cluster config %s, 'head') is unreachable: %s" % (
            c["head"], c.get("path", "?"), e.strerror or e)

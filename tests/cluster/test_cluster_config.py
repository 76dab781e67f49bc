"""The administrator's side of the cluster without Ray: the cluster config (every error names the file and
the key), `looseleaf cluster check` (a missing key file, a key others may read, a malformed config, an
unreachable head, no hostd: each said), `keygen`, the systemd units (`systemd-analyze verify`), `make
install-cluster` with DESTDIR, and what `looseleaf top --cluster` prints for a status (a gone host included).
The cluster itself: tests/cluster/test_cluster_ops.py."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "cluster"))

from looseleaf_cluster import cli, config  # noqa: E402

LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
GOOD = {"head": "10.0.0.1:6379", "host": "gpu1", "role": "gpu", "slots": 4}


def write(path, obj, mode=0o600):
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    os.chmod(path, mode)
    return str(path)


@pytest.mark.parametrize("text,want", [
    ('{"head": "10.0.0.1:6379", "host": ', "not valid JSON"),
    ('[1]', "must be a JSON object"),
    (json.dumps({"host": "gpu1", "slots": 4}), "'head' is missing"),
    (json.dumps(dict(GOOD, head="10.0.0.1")), "'head' must be HOST:PORT"),
    (json.dumps(dict(GOOD, head="10.0.0.1:99999")), "'head' must be HOST:PORT"),
    (json.dumps(dict(GOOD, host="gpu 1")), "'host' must be a name"),
    (json.dumps(dict(GOOD, role="worker")), "'role' must be \"gpu\" or \"server\""),
    (json.dumps(dict(GOOD, slots=0)), "'slots' must be an integer 1..64"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "slots"}), "'slots' must be an integer 1..64"),
    (json.dumps(dict(GOOD, slot=4)), "unknown key(s) slot"),
    (json.dumps(dict(GOOD, key_file="cluster.key")), "'key_file' must be an absolute path"),
    (json.dumps(dict(GOOD, redis={"address": "r:6380", "user": "ll"})), "go together"),
    (json.dumps(dict(GOOD, redis={"user": "ll"})), "'redis.address' is missing"),
])
def test_config_errors_name_the_key(text, want):
    with pytest.raises(config.ConfigError) as e:
        config.parse(text, "cluster config /etc/x.json")
    assert want in str(e.value) and "/etc/x.json" in str(e.value), str(e.value)


def test_config_defaults_and_envs():
    c = config.parse(json.dumps(dict(GOOD, redis={"address": "10.0.0.1:6380", "user": "looseleaf",
                                                  "password_file": "/etc/looseleaf/redis.pass"})))
    assert c["key_file"] == "/etc/looseleaf/cluster.key" and c["hostd_socket"] == "/run/looseleaf/hostd.sock"
    assert config.redis_env(c) == {"LL_REDIS_USER": "looseleaf", "LL_REDIS_PASSWORD_FILE": "/etc/looseleaf/redis.pass"}
    server = config.parse(json.dumps({"head": "10.0.0.1:6379", "host": "srv", "role": "server"}))
    assert "slots" not in server
    argv = cli.raylet_argv(server)
    assert "--head" in argv and argv[argv.index("--port") + 1] == "6379" and "--block" in argv
    argv = cli.raylet_argv(c)
    assert argv[argv.index("--address") + 1] == "10.0.0.1:6379"
    assert json.loads(argv[argv.index("--resources") + 1]) == {"looseleaf_slot": 4}
    assert argv[argv.index("--labels") + 1] == "looseleaf_host=gpu1"


def run(*args, env=None, check=None):
    r = subprocess.run([LOOSELEAF] + list(args), capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    if check is not None:
        assert r.returncode == check, (r.returncode, r.stdout, r.stderr)
    return r


def test_keygen_writes_a_private_key_once(tmp_path):
    key = str(tmp_path / "etc" / "cluster.key")
    r = run("cluster", "keygen", key, check=0)
    assert key in r.stdout
    assert (os.stat(key).st_mode & 0o777) == 0o600
    text = open(key).read().strip()
    assert len(text) == 64 and int(text, 16) >= 0
    r = run("cluster", "keygen", key, check=1)
    assert "exists" in r.stderr and open(key).read().strip() == text


@pytest.fixture
def head():
    """A TCP port that answers, standing in for the Ray head (check only connects)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield "127.0.0.1:%d" % s.getsockname()[1]
    s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the hostd owns its key: root")
def test_check_says_what_is_wrong(tmp_path, head):
    key = write(tmp_path / "cluster.key", "k" * 64)
    token = write(tmp_path / "ray.token", "t" * 64)
    sock = str(tmp_path / "hostd.sock")
    conf = write(tmp_path / "cluster.json", dict(GOOD, head=head, key_file=key, ray_token_file=token,
                                                 hostd_socket=sock), mode=0o644)
    p = subprocess.Popen([LOOSELEAF, "hostd", "--socket", sock, "--slots", "2", "--cluster-config", conf],
                         stderr=subprocess.DEVNULL, env=dict(os.environ, LL_POOL_NO_CUDA="1"))
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = run("cluster", "check", "--config", conf, check=0)
        assert "gpu1 (gpu) ok" in r.stdout, r.stdout
        # The hostd took its host name from the config: a lease for gpu1 redeems there.
        from looseleaf_cluster import hostd
        lease = hostd.issue_lease(sock, "gpu1", "r1")
        assert lease["issuer"] == "gpu1" and hostd.redeem_lease(sock, lease)["request"] == "r1"
        # A key others may read; a missing key; an unreachable head.
        os.chmod(key, 0o644)
        r = run("cluster", "check", "--config", conf, check=1)
        assert "cluster key %s: mode 0644: others may read it (chmod 600)" % key in r.stderr, r.stderr
        os.unlink(key)
        r = run("cluster", "check", "--config", conf, check=1)
        assert "cluster key %s: No such file or directory" % key in r.stderr and "keygen" in r.stderr, r.stderr
        write(key, "k" * 64)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()  # nobody listens there now
        write(conf, dict(GOOD, head="127.0.0.1:%d" % port, key_file=key, ray_token_file=token, hostd_socket=sock))
        r = run("cluster", "check", "--config", conf, check=1)
        assert "the Ray head 127.0.0.1:%d (cluster config %s, 'head') is unreachable: Connection refused" % (
            port, conf) in r.stderr, r.stderr
        r = run("top", "--cluster", "--config", conf, check=1)
        assert "is unreachable: Connection refused" in r.stderr, r.stderr
    finally:
        p.terminate()
        p.wait(30)
    # No hostd; a malformed config.
    r = run("cluster", "check", "--config", conf, "--no-head", check=1)
    assert "hostd %s does not answer" % sock in r.stderr and "looseleaf-hostd" in r.stderr, r.stderr
    write(conf, '{"head": "x:1",\n "host": gpu1}')
    r = run("cluster", "check", "--config", conf, check=1)
    assert "cluster config %s: not valid JSON" % conf in r.stderr and "line 2" in r.stderr, r.stderr
    r = run("cluster", "agent", "--config", str(tmp_path / "none.json"), check=1)
    assert "none.json: No such file or directory" in r.stderr, r.stderr


def test_top_cluster_renders_hosts_users_and_gone():
    status = [
        {"host": "h1", "accepting": True, "slots": 4, "busy": 2, "warm": 1, "queued": 0,
         "users": [{"uid": 1001, "name": "alice", "busy": 2, "warm": 0, "waiting": 0},
                   {"uid": 1002, "name": "bob", "busy": 0, "warm": 1, "waiting": 0}]},
        {"host": "h2", "accepting": True, "slots": 4, "busy": 0, "warm": 0, "queued": 0, "users": []},
        {"host": "h3", "accepting": False, "slots": 0, "busy": 0, "warm": 0, "queued": 0,
         "gone": "GPU host h3 is gone: its Ray node 10.251.0.13 (abc) is dead"},
    ]
    t = cli.render_table(status)
    lines = t.splitlines()
    assert lines[0].split()[:6] == ["HOST", "STATE", "SLOTS", "BUSY", "WARM", "QUEUED"]
    assert lines[1].split()[:6] == ["h1", "up", "4", "2", "1", "0"] and lines[1].endswith("alice(2 busy) bob(1 warm)")
    assert lines[3].split()[:2] == ["h3", "GONE"] and "its Ray node 10.251.0.13 (abc) is dead" in lines[3]
    assert "3 host(s), 1 gone; slots 8, busy 2, warm 1, queued 0" in t
    p = cli.render_prometheus(status)
    assert 'looseleaf_cluster_host_up{host="h3"} 0' in p and 'looseleaf_cluster_host_up{host="h1"} 1' in p
    assert 'looseleaf_cluster_host_busy_slots{host="h1"} 2' in p
    assert 'looseleaf_cluster_host_user_warm_slots{host="h1",uid="1002",user="bob"} 1' in p
    assert "# TYPE looseleaf_cluster_host_slots gauge" in p
    assert 'host="h3"' not in p.replace('looseleaf_cluster_host_up{host="h3"} 0', "")


UNITS = ["cluster/looseleaf-raylet.service", "cluster/looseleaf-agent.service", "hostd/looseleaf-hostd.service"]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_units_verify(tmp_path):
    for u in UNITS:
        text = open(os.path.join(REPO, u)).read()
        assert "@BINDIR@/looseleaf" in text, u
        (tmp_path / os.path.basename(u)).write_text(text.replace("@BINDIR@", os.path.join(REPO, "build")))
    dropin = tmp_path / "looseleaf-hostd.service.d"
    dropin.mkdir()
    (dropin / "cluster.conf").write_text(open(os.path.join(REPO, "cluster", "looseleaf-hostd-cluster.conf")).read())
    r = subprocess.run(["systemd-analyze", "verify"] + [str(tmp_path / os.path.basename(u)) for u in UNITS],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if "looseleaf" in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr
    # What verify says of a broken one (so the check above can fail).
    bad = tmp_path / "looseleaf-agent.service"
    bad.write_text(bad.read_text().replace("RemainAfterExit=", "RemainAfterExitt="))
    r = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=60,
                       cwd=str(tmp_path))
    assert "RemainAfterExitt" in r.stdout + r.stderr, r.stdout + r.stderr


def test_install_cluster_puts_everything_in_place(tmp_path):
    dest, prefix = tmp_path / "root", "/opt/llc"
    r = subprocess.run(["make", "-s", "install-cluster", "DESTDIR=%s" % dest, "PREFIX=%s" % prefix], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    etc = dest / "etc" / "systemd" / "system"
    for u in ("looseleaf-raylet.service", "looseleaf-agent.service", "looseleaf-hostd.service"):
        text = (etc / u).read_text()
        assert "@BINDIR@" not in text and "%s/bin/looseleaf" % prefix in text, u
    dropin = (etc / "looseleaf-hostd.service.d" / "cluster.conf").read_text()
    assert "LL_CLUSTER_CONFIG=/etc/looseleaf/cluster.json" in dropin
    config.parse((dest / "etc" / "looseleaf" / "cluster.json.example").read_text())  # the example is valid
    lib = dest / prefix.lstrip("/") / "lib" / "looseleaf"
    assert (lib / "build" / "cluster" / "libllplace.so").exists()
    # The installed binary finds the installed package (the Python is the administrator's: here the venv's).
    exe = dest / prefix.lstrip("/") / "bin" / "looseleaf"
    r = subprocess.run([str(exe), "cluster", "check", "--config", str(tmp_path / "none.json")],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LL_CLUSTER_PYTHON=os.path.join(REPO, ".venv", "bin", "python"),
                                PYTHONPATH=""))
    assert r.returncode == 1 and "none.json: No such file" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "import looseleaf_cluster.cli as c; print(c.__file__)"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(lib / "cluster")))
    assert r.stdout.strip().startswith(str(lib)), r.stdout + r.stderr

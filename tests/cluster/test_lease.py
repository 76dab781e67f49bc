"""Signed cluster leases through real hostds (hostd/API.md, "Cluster leases"): three `looseleaf hostd`s on one
machine named srv, h1 and h2 sharing a cluster key, and a rogue one (host srv) with another key.  A lease srv
issues for h1 is redeemed once on h1; forged (another key, an altered field), replayed, expired, another host's,
and asked for another user's uid by a non-root caller: all refused with their reason.  Then the operator's
errors: a missing key file, one others may read, a malformed config.  Root only (hostds own their key; the
other users are run with setpriv); no Ray, no namespaces (tests/cluster/test_cluster_ops.py does the cluster)."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "cluster"))

from looseleaf_cluster import hostd  # noqa: E402

LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (hostds owning their key) and setpriv")


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.05)


def write_key(path, key=None, mode=0o600):
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
        f.write((key or secrets.token_hex(32)) + "\n")
    os.chmod(path, mode)
    return path


@pytest.fixture(scope="module")
def hostds():
    d = tempfile.mkdtemp(prefix="llc-lease-")
    os.chmod(d, 0o755)  # other users reach the sockets (0666)
    key = write_key(os.path.join(d, "cluster.key"))
    rogue_key = write_key(os.path.join(d, "rogue.key"))
    procs, socks = [], {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LL_", "LOOSELEAF_"))}
    env["LL_POOL_NO_CUDA"] = "1"
    try:
        for name, host, k in (("srv", "srv", key), ("h1", "h1", key), ("h2", "h2", key),
                              ("rogue", "srv", rogue_key)):
            socks[name] = os.path.join(d, name + ".sock")
            log = open(os.path.join(d, name + ".log"), "w")
            procs.append(subprocess.Popen([LOOSELEAF, "hostd", "--socket", socks[name], "--slots", "2",
                                           "--cluster-key", k, "--host", host],
                                          stdout=log, stderr=log, env=env))
            log.close()
        for name, s in socks.items():
            wait_for(lambda s=s: os.path.exists(s), 30, "hostd " + name)
        yield dict(socks, dir=d)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        shutil.rmtree(d, True)


def as_nobody(code, *args):
    """Run CODE (Python, with looseleaf_cluster importable) as uid nobody; its JSON answer."""
    r = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                        sys.executable, "-c", "import sys, json; sys.path.insert(0, %r)\n"
                        "from looseleaf_cluster import hostd\n" % os.path.join(REPO, "cluster") + code]
                       + list(args), capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_lease_is_redeemed_once_on_its_target(hostds):
    lease = hostd.issue_lease(hostds["srv"], "h1", "kernel-1/cell-1", ttl_s=60)
    assert lease["uid"] == 0 and lease["user"] == "root" and lease["issuer"] == "srv"
    assert lease["target"] == "h1" and lease["request"] == "kernel-1/cell-1"
    # Another host: refused, and the lease is not spent by the attempt.
    with pytest.raises(hostd.LeaseRefused, match="for host h1, this is host h2"):
        hostd.redeem_lease(hostds["h2"], lease)
    got = hostd.redeem_lease(hostds["h1"], lease)
    assert got["uid"] == 0 and got["user"] == "root" and got["request"] == "kernel-1/cell-1", got
    with pytest.raises(hostd.LeaseRefused, match="replayed"):
        hostd.redeem_lease(hostds["h1"], lease)


def test_forged_leases_are_refused(hostds):
    # Signed with another key (a hostd that is not the cluster's, even one calling itself srv).
    forged = hostd.issue_lease(hostds["rogue"], "h1", "r-forged")
    with pytest.raises(hostd.LeaseRefused, match="bad signature"):
        hostd.redeem_lease(hostds["h1"], forged)
    # A real lease for nobody, altered to root's uid, to another target, with a later expiry.
    lease = as_nobody("print(json.dumps(hostd.issue_lease(sys.argv[1], 'h1', 'r-alter')))", hostds["srv"])
    assert lease["uid"] == NOBODY and lease["user"] == "nobody"
    for field, value in (("uid", 0), ("user", "root"), ("expires", lease["expires"] + 3600000),
                         ("request", "other"), ("target", "h2"), ("nonce", "0" * 32)):
        bad = dict(lease, **{field: value})
        with pytest.raises(hostd.LeaseRefused, match="bad signature"):
            hostd.redeem_lease(hostds["h1" if field != "target" else "h2"], bad)
    # None of that spent it: the genuine lease still redeems (root may redeem any user's).
    assert hostd.redeem_lease(hostds["h1"], lease)["uid"] == NOBODY


def test_expired_lease_is_refused(hostds):
    lease = hostd.issue_lease(hostds["srv"], "h1", "r-expire", ttl_s=1)
    wait_for(lambda: time.time() * 1000 > lease["expires"] + 50, 10, "the lease's expiry")
    with pytest.raises(hostd.LeaseRefused, match="expired"):
        hostd.redeem_lease(hostds["h1"], lease)


def test_no_lease_for_another_users_uid(hostds):
    """A non-root caller cannot get a lease naming another uid, nor redeem another user's lease."""
    r = as_nobody("try:\n"
                  "    hostd.issue_lease(sys.argv[1], 'h1', 'r-steal', uid=0)\n"
                  "    print(json.dumps('ISSUED'))\n"
                  "except hostd.LeaseRefused as e:\n"
                  "    print(json.dumps(str(e)))\n", hostds["srv"])
    assert "uid 0 is not the caller's (uid %d)" % NOBODY in r, r
    root_lease = hostd.issue_lease(hostds["srv"], "h1", "r-root")
    r = as_nobody("try:\n"
                  "    print(json.dumps(hostd.redeem_lease(sys.argv[1], json.loads(sys.argv[2]))))\n"
                  "except hostd.LeaseRefused as e:\n"
                  "    print(json.dumps(str(e)))\n", hostds["h1"], json.dumps(root_lease))
    assert "the lease is for uid 0 (root), the caller is uid %d" % NOBODY in r, r
    # ... and its own lease it may redeem itself.
    r = as_nobody("l = hostd.issue_lease(sys.argv[1], 'h1', 'r-own')\n"
                  "print(json.dumps(hostd.redeem_lease(sys.argv[2], l)))\n", hostds["srv"], hostds["h1"])
    assert r["uid"] == NOBODY and r["user"] == "nobody", r


def test_a_hostd_without_a_key_says_so(tmp_path):
    sock = str(tmp_path / "plain.sock")
    p = subprocess.Popen([LOOSELEAF, "hostd", "--socket", sock, "--slots", "1"], stderr=subprocess.DEVNULL,
                         env=dict(os.environ, LL_POOL_NO_CUDA="1", LL_CLUSTER_CONFIG=""))
    try:
        wait_for(lambda: os.path.exists(sock), 30, "hostd")
        with pytest.raises(hostd.LeaseRefused, match="no cluster key"):
            hostd.issue_lease(sock, "h1", "r")
    finally:
        p.terminate()
        p.wait(30)


def hostd_refuses(args, tmp_path):
    r = subprocess.run([LOOSELEAF, "hostd", "--socket", str(tmp_path / "x.sock"), "--slots", "1"] + args,
                       capture_output=True, text=True, timeout=30, env=dict(os.environ, LL_POOL_NO_CUDA="1"))
    assert r.returncode == 2, (r.returncode, r.stderr)
    return r.stderr


def test_operator_errors_are_clear(tmp_path):
    missing = str(tmp_path / "nokey")
    err = hostd_refuses(["--cluster-key", missing, "--host", "h1"], tmp_path)
    assert "cluster key %s: No such file or directory" % missing in err and "keygen" in err, err
    loose = write_key(str(tmp_path / "loose.key"), mode=0o644)
    err = hostd_refuses(["--cluster-key", loose, "--host", "h1"], tmp_path)
    assert "readable by it alone" in err and "0644" in err, err
    short = write_key(str(tmp_path / "short.key"), key="abc")
    assert "at least 32" in hostd_refuses(["--cluster-key", short, "--host", "h1"], tmp_path)
    os.symlink(write_key(str(tmp_path / "real.key")), str(tmp_path / "link.key"))
    assert "symbolic link" in hostd_refuses(["--cluster-key", str(tmp_path / "link.key"), "--host", "h1"],
                                            tmp_path)
    conf = tmp_path / "cluster.json"
    conf.write_text('{"host": "h1", "key_file": ')
    err = hostd_refuses(["--cluster-config", str(conf)], tmp_path)
    assert "cluster config %s" % conf in err and "line 1" in err, err
    conf.write_text(json.dumps({"host": "bad name", "key_file": str(tmp_path / "real.key")}))
    assert "host name 'bad name'" in hostd_refuses(["--cluster-config", str(conf)], tmp_path)
    conf.write_text(json.dumps({"host": "h1", "key_file": missing}))
    assert "No such file" in hostd_refuses(["--cluster-config", str(conf)], tmp_path)


def top(sock, *args):
    r = subprocess.run([LOOSELEAF, "top", "--socket", sock] + list(args), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_top_and_metrics_count_leases(hostds):
    before = {h: json.loads(top(hostds[h], "--json"))["cluster_leases"] for h in ("srv", "h1", "h2")}
    assert before["h1"]["host"] == "h1" and before["srv"]["host"] == "srv"
    lease = hostd.issue_lease(hostds["srv"], "h1", "r-count")
    with pytest.raises(hostd.LeaseRefused):
        hostd.redeem_lease(hostds["h2"], lease)
    hostd.redeem_lease(hostds["h1"], lease)
    after = {h: json.loads(top(hostds[h], "--json"))["cluster_leases"] for h in ("srv", "h1", "h2")}
    assert after["srv"]["issued"] == before["srv"]["issued"] + 1
    assert after["h1"]["redeemed"] == before["h1"]["redeemed"] + 1 and after["h1"]["replay_cache"] >= 1
    assert after["h2"]["refused"] == before["h2"]["refused"] + 1
    assert "cluster leases (this is host h1): " in top(hostds["h1"])
    prom = top(hostds["h2"], "--prometheus")
    assert 'looseleaf_hostd_cluster_leases_refused_total{host="h2"} %d' % after["h2"]["refused"] in prom, prom
    assert "looseleaf_hostd_slots 2" in prom  # the broker's own metrics, as before

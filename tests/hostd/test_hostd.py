"""`looseleaf hostd`, the host's slot broker, with real OS users (issue 17; hostd/API.md).

Two test users (useradd), each with a private store and host pool run as that user (setpriv), share one
broker of 2 slots run as root.  Checked: the broker never lends more than its slots and no two users' workers
run at once beyond them; workers run as their user; a user cannot give back or mark another user's lease
(an error, nothing changes); a user above share loses its warm (then its busy) leases first when another
waits, and the newcomer's cell starts before the heavy user's next one; the broker killed mid-session: pools
fall back to their own slots, re-register when it is back, and no variable is lost.

Also: a user cannot reach anything of another user's (sockets, files, processes: permission errors), and one
user's worker crash or zygote kill touches no other user; three users' kernels (two each, through
jupyter_client) run cells of the real PyTorch notebooks in ../shared/notebooks: every output equal to
ipykernel's, no variable or output crossing users, the broker never lending more than its 2 slots.

Also: several slots per (fake) GPU, counted by the broker as a pool counts them, with the pools placing each
worker on its broker slot's device; a prefetch lent a free slot at the lowest priority and taken back first when
another user's cell waits; a per-user cap on store memory (StoreQuotaExceeded, the variable kept).

Root only (CI runs as root); skipped elsewhere.  Costs ~160 s on 2 cores, ~100 s of it the notebook test (nine
kernels, three pools, 15-16 notebook cells per user on two slots).
"""
import os
import shutil
import subprocess
import tempfile
import sys
import threading
import time

import pytest

import hdhelp
from hdhelp import Hostd, User, reply_ok, started, stdout, user_stats, wait_for

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "routing"))
from routehelp import comparable  # noqa: E402
from itest_util import norm_varying  # noqa: E402,I100  (tests/integration: put on sys.path by routehelp)

pytestmark = pytest.mark.skipif(not hdhelp.usable(), reason="needs root, useradd and setpriv (real OS users)")


@pytest.fixture
def users(bins, hostd):
    made = []
    tag = "%05d" % (os.getpid() % 100000)
    try:
        for letter in "ab":
            made.append(User("llhd%s%s" % (tag, letter), bins, hostd.socket))
        yield made
    finally:
        for u in made:
            u.close()


class Sampler:
    """Polls the broker's stats on a thread: the most leases and held slots it ever showed."""

    def __init__(self, hostd):
        self.hostd = hostd
        self.max_leases = self.max_busy = 0
        self.samples = 0
        self.stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop:
            st = self.hostd.stats(check=False)
            if st:
                self.samples += 1
                self.max_leases = max(self.max_leases, st["leases"])
                self.max_busy = max(self.max_busy, st["busy_slots"])
            time.sleep(0.01)

    def close(self):
        self.stop = True
        self.t.join()


def test_two_users_share_two_slots(hostd, users):
    a, b = users
    clients = [a.client("a1"), a.client("a2"), b.client("b1"), b.client("b2")]
    sampler = Sampler(hostd)
    try:
        # Every session defines its own x, then four cells at once that each hold a slot ~1 s.
        for i, c in enumerate(clients):
            ev = c.run("def", "x = %d" % (100 + i))
            assert reply_ok(ev), ev
        for c in clients:
            c.submit("busy", "import os, time\ntime.sleep(1.0)\nprint(x, os.getuid())", state_closure=["x"])
        outs = [c.collect("busy") for c in clients]
    finally:
        sampler.close()
    for i, ev in enumerate(outs):
        assert reply_ok(ev), ev
        # No variable crosses sessions or users; the worker runs as its user.
        assert stdout(ev) == "%d %d\n" % (100 + i, [a, a, b, b][i].uid)
    assert sampler.samples > 10
    assert sampler.max_leases <= 2 and sampler.max_busy <= 2, (sampler.max_leases, sampler.max_busy)
    # Both users waited for each other: somebody was told to wait, and the broker took slots back.
    st = hostd.stats()
    ua, ub = user_stats(st, a), user_stats(st, b)
    assert ua and ub and ua["gpu_held_s"] > 0 and ub["gpu_held_s"] > 0
    assert ua["grants"] + ub["grants"] >= 3
    # `looseleaf top` prints the same (run as an unprivileged user: the broker answers anyone).
    top = a.as_user([a.bins.looseleaf, "top", "--socket", hostd.socket])
    assert a.name in top and b.name in top and "2 slot(s)" in top
    # ... and its metrics endpoint, as Prometheus text.
    status, text = hostd.http("/metrics")
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert status == 200 and lines["looseleaf_hostd_slots"] == "2"
    assert int(lines["looseleaf_hostd_slots_held"]) <= 2 and lines["looseleaf_hostd_waiting_cells"] == "0"
    for u in (a, b):
        held = float(lines['looseleaf_hostd_user_gpu_held_seconds_total{uid="%d"}' % u.uid])
        busy = float(lines['looseleaf_hostd_user_gpu_busy_seconds_total{uid="%d"}' % u.uid])
        assert held >= busy > 0.9  # each user ran 2 cells of ~1 s
    hits = int(lines["looseleaf_hostd_warm_hits_total"])
    # Every cell is a warm hit or a cold start (how many were warm depends on the host's load: the broker
    # takes warm slots back for the other user).
    assert hits + int(lines["looseleaf_hostd_cold_starts_total"]) >= 8
    assert hostd.http("/other")[0] == 404


def test_user_cannot_touch_another_users_lease(hostd, users):
    a, b = users
    ca = a.client("a1")
    assert reply_ok(ca.run("c1", "x = 1"))  # a's warm worker holds a lease
    st = wait_for(lambda: (lambda s: s if [l["state"] for l in s["lease_list"]] == ["warm"] else None)(
        hostd.stats()), 10, "a's warm lease")
    lease = st["lease_list"][0]
    assert lease["uid"] == a.uid
    # b speaks to the broker itself: not registered, then registered, it names a's slot.
    script = r"""
import json, socket, struct, sys
sys.path.insert(0, %r)
from hdhelp import send_frame, recv_frame
s = socket.socket(socket.AF_UNIX); s.connect(%r)
out = []
send_frame(s, {"type": "release", "slot": %d}); out.append(recv_frame(s))
send_frame(s, {"type": "hello", "nslots": 2, "held": []}); out.append(recv_frame(s))
for t in ("release", "mark"):
    send_frame(s, {"type": t, "slot": %d, "idle": True, "value": 0}); out.append(recv_frame(s))
# One user cannot take every connection of the broker: past 8 at once it is refused.
more, answered = [], 0
for i in range(20):
    c = socket.socket(socket.AF_UNIX); c.connect(%r); more.append(c)
for c in more:
    try:
        send_frame(c, {"type": "stats"}); recv_frame(c); answered += 1
    except OSError:
        pass
out.append(answered)
print(json.dumps(out))
""" % (os.path.dirname(os.path.abspath(__file__)), hostd.socket, lease["slot"], lease["slot"], hostd.socket)
    import json
    out = json.loads(b.as_user([hdhelp.PYTHON, "-c", script]))
    assert out[0]["type"] == "error" and "hello" in out[0]["error"]
    assert out[1]["type"] == "welcome" and out[1]["adopted"] == []
    assert out[2]["type"] == "error" and "no lease" in out[2]["error"]
    assert out[3]["type"] == "error" and "no lease" in out[3]["error"]
    assert out[4] == 7  # 8 connections of b's at most: the one above, and 7 of these
    after = hostd.stats()
    assert [(l["slot"], l["uid"], l["state"]) for l in after["lease_list"]] == \
        [(lease["slot"], a.uid, lease["state"])]
    # b cannot reach a's pool either: its dir is a's alone.
    r = subprocess.run(b.cmd(["ls", a.pool_dir]), capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert reply_ok(ca.run("c2", "print(x)", state_closure=["x"]))


def test_heavy_users_leases_go_first(hostd, users):
    a, b = users
    a1, a2 = a.client("a1"), a.client("a2")
    # a fills both slots with warm workers: alone on the host, it may.
    assert reply_ok(a1.run("w1", "x = 1")) and reply_ok(a2.run("w2", "y = 2"))
    wait_for(lambda: (user_stats(hostd.stats(), a) or {}).get("warm") == 2, 10, "a's two warm leases")
    # b arrives: a is above share (2 of 2 slots, share 1): one of its warm leases is taken back.
    b1 = b.client("b1")
    evb = b1.run("b", "print('b ran')")
    assert reply_ok(evb) and stdout(evb) == "b ran\n"
    st = hostd.stats()
    assert user_stats(st, a)["revokes"] >= 1 and user_stats(st, b)["revokes"] == 0
    assert "hostd takes its slot back" in a.log()
    # Now both of a's sessions run long cells (a queue: each session's next cell waits behind it);
    # b's next cell must start before a's queued ones: a is above share while b waits.
    assert reply_ok(b1.run("b2", "z = 3"))
    a1.submit("long1", "import time; time.sleep(1.5)")
    a2.submit("long2", "import time; time.sleep(1.5)")
    wait_for(lambda: user_stats(hostd.stats(), a)["busy"] + user_stats(hostd.stats(), b)["busy"] >= 1, 10,
             "a's long cells to start")
    a1.submit("next1", "print(x)", state_closure=["x"])
    b1.submit("b3", "print(z)", state_closure=["z"])
    evb3 = b1.collect("b3")
    ev_next = a1.collect("next1")
    assert reply_ok(evb3) and stdout(evb3) == "3\n"
    assert reply_ok(ev_next) and stdout(ev_next) == "1\n"
    a1.collect("long1")
    a2.collect("long2")
    assert started(evb3)["_t"] <= started(ev_next)["_t"]


def test_broker_restart_mid_session(hostd, users):
    a, b = users
    ca, cb = a.client("a1"), b.client("b1")
    assert reply_ok(ca.run("c1", "x = [1, 2, 3]")) and reply_ok(cb.run("c1", "y = 'b'"))
    hostd.kill()
    # Both pools fall back to their own slots (said once) and go on.
    wait_for(lambda: "using the pool's own" in a.log() and "using the pool's own" in b.log(), 10,
             "the pools to fall back")
    ev = ca.run("c2", "x.append(4); print(x)", state_closure=["x"])
    assert reply_ok(ev) and stdout(ev) == "[1, 2, 3, 4]\n"
    ev = cb.run("c2", "print(y * 2)", state_closure=["y"])
    assert reply_ok(ev) and stdout(ev) == "bb\n"
    hostd.start()
    # They register again, claiming the slots their warm workers hold.
    wait_for(lambda: a.log().count("registered") >= 2 and b.log().count("registered") >= 2, 10,
             "the pools to register again")
    st = wait_for(lambda: (lambda s: s if s["leases"] == 2 else None)(hostd.stats()), 10, "adopted leases")
    assert sorted(l["uid"] for l in st["lease_list"]) == sorted([a.uid, b.uid])
    ev = ca.run("c3", "print(sum(x))", state_closure=["x"])
    assert reply_ok(ev) and stdout(ev) == "10\n"
    assert a.log().count("using the pool's own") == 1


# ---- three users, two kernels each, on real notebooks ---------------------------------------------------
# Kernels started by each user through jupyter_client (the user's own Jupyter dirs, kernelspecs and pool dir,
# tests/hostd/nbuser.py run as the user): two LooseLeaf kernels and the reference ipykernel run the same cells
# of a real PyTorch notebook (../shared/notebooks, copied into examples/ with their licences in SOURCES.md
# there, so a clone alone runs it), cell i sent to the three at
# once.  GPU routing is on: cells using torch run on workers of the user's pool, on the broker's slots (CPU
# torch here: a GPU host differs only in the device the slot names).
NOTEBOOKS = os.path.join(hdhelp.REPO, "examples")

# Which code cells (0-based, among the notebook's code cells) each user runs.  A subset, so that tests/hostd,
# which runs alone in `make test`, stays short: every cell costs three kernels of the user, and the six
# LooseLeaf sessions share 2 slots, so most GPU cells wait for one and start on a fresh worker (~1.5 s a
# cell here; the whole notebooks took 130 s).  What each subset keeps is what the notebook exercises
# (SOURCES.md there); what it leaves out and why:
#   a, 00 fundamentals: the seed, creation, random tensors (the RNG carried across cells), the deprecation
#     warning on stderr, printing, reassignment, `%%time` (its times normalised), the deliberate shape
#     error, nn.Linear, a view changed in place through another name, the numpy bridge both ways, seeded
#     RNG.  Left out: the cells that only repeat one of these on other values (ndim/shape reads, more
#     dtypes, more indexing, more arithmetic).
#   b, 01 workflow, first half: data, an nn.Module subclass, inference_mode, a matplotlib figure, a
#     100-epoch training loop, torch.save / load_state_dict into the kernel's own directory, `!ls -l` (its
#     time normalised).  Left out: the other three figures (each renders a PNG in three kernels: seconds on
#     2 cores, for what one figure already shows; images compare by presence only) and the cells that
#     only print what an earlier one made.
#   c, 01 workflow, second half (nn.Linear model, .to(device), a 1000-epoch loop, save and load), then
#     tensors to the device and back to numpy from 00.  Left out: 28 and 36 (figures drawn by a function
#     the first half defines, which c does not run), and the cells that only read a value back.
# No cell of these notebooks downloads anything or reads a file it did not write.
PLAN = {
    "a": [("mrdbourke_00_pytorch_fundamentals", [0, 2, 14, 15, 18, 22, 26, 35, 37, 42, 52, 53, 64, 65, 66, 69])],
    "b": [("mrdbourke_01_pytorch_workflow", [0, 1, 2, 3, 4, 6, 7, 9, 11, 13, 14, 19, 20, 21, 22, 23])],
    "c": [("mrdbourke_01_pytorch_workflow", [24, 25, 26, 27, 29, 31, 32, 33, 35, 37, 38, 39]),
          ("mrdbourke_00_pytorch_fundamentals", [70, 76, 78])],
}


def _plan_cells(letter):
    import nbformat
    out = []
    for name, picks in PLAN[letter]:
        nb = nbformat.read(os.path.join(NOTEBOOKS, name + ".ipynb"), as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        out += [code[i] for i in picks]
    return out


def _kernel_cells(tag, workdir, notebook_cells):
    """The cells one kernel runs: into a directory of its own (the notebook saves files), a GPU cell binding a
    name and a value unique to the kernel (TAG), the notebook's cells, then a GPU and a CPU cell listing the
    markers the kernel sees (its own only: no variable crosses kernels or users)."""
    return (["%%cpu\nimport os\nos.chdir(" + repr(workdir) + ")",
             "%%gpu\nimport os, torch\nowner_{t} = torch.tensor([1, 2])\nwho = '{t}'\nprint(who, os.getuid())"
             .format(t=tag)] + notebook_cells +
            ["%%gpu\nprint(who, sorted(n for n in globals() if n.startswith('owner_')), owner_{t}.tolist())"
             .format(t=tag),
             "%%cpu\nprint(who, sorted(n for n in dir() if n.startswith('owner_')))"])


@pytest.fixture(scope="module")
def mpl_cache():
    """A matplotlib config dir with its font cache built, copied to each user: in a fresh one every kernel
    would build the cache at its first pyplot import, and only some would print that they do."""
    d = tempfile.mkdtemp(prefix="ll-hostd-mpl-")
    subprocess.run([hdhelp.PYTHON, "-c", "import matplotlib.font_manager"], check=True, capture_output=True,
                   env=dict(os.environ, MPLCONFIGDIR=d, MPLBACKEND="Agg"), timeout=300)
    yield d
    shutil.rmtree(d, True)


def _kernel_env(user, bins, mpl_cache=None):
    """USER's Jupyter dirs with kernelspecs: looseleaf (the copied binary, this venv's Python), the same again
    as looseleaf2 (a second kernel of the user, named apart to keep plans plain) and python3 (ipykernel of this
    venv); USER's matplotlib dir, a copy of MPL_CACHE when given."""
    import json
    jp = os.path.join(user.dir, "jupyter")
    mpl = os.path.join(user.dir, "mpl")
    if mpl_cache:
        shutil.copytree(mpl_cache, mpl)
    else:
        os.makedirs(mpl)
    specs = {"looseleaf": {"argv": [bins.looseleaf, "-f", "{connection_file}"], "display_name": "LooseLeaf",
                           "language": "python", "interrupt_mode": "signal",
                           "env": {"LOOSELEAF_PYTHON": hdhelp.PYTHON}},
             "python3": {"argv": [hdhelp.PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                         "display_name": "Python 3", "language": "python"}}
    specs["looseleaf2"] = specs["looseleaf"]
    for name, spec in specs.items():
        kdir = os.path.join(jp, "share", "kernels", name)
        os.makedirs(kdir)
        with open(os.path.join(kdir, "kernel.json"), "w") as f:
            json.dump(spec, f)
    for top in (jp, mpl):
        for root, dirs, files in os.walk(top):
            for n in dirs + files + [""]:
                os.chown(os.path.join(root, n), user.uid, user.gid)
    return dict(user.environ, JUPYTER_PATH=os.path.join(jp, "share"), JUPYTER_DATA_DIR=os.path.join(jp, "data"),
                JUPYTER_RUNTIME_DIR=os.path.join(jp, "runtime"), JUPYTER_CONFIG_DIR=os.path.join(jp, "config"),
                LOOSELEAF_POOL_DIR=user.pool_dir, PYDEVD_DISABLE_FILE_VALIDATION="1", MPLCONFIGDIR=mpl)


def _visible(rec, tag):
    """What a frontend sees of one cell (routehelp.comparable: status, error, outputs, normalised as the
    notebook tests do, timings included), the kernel's TAG written "TAG", without the echo of the cell's code
    (ipykernel's has no %%gpu line) and LooseLeaf's one-line notices on stderr: six kernels on two slots wait,
    and say so (README); ipykernel has nothing to wait for."""
    import json
    msgs = []
    for m in rec["msgs"]:
        if m["msg_type"] == "execute_input":
            continue
        if m["msg_type"] == "stream" and m["content"]["name"] == "stderr":
            text = "".join(line for line in m["content"]["text"].splitlines(True)
                           if not line.startswith("LooseLeaf: "))
            if not text:
                continue
            m = dict(m, content=dict(m["content"], text=text))
        msgs.append(m)
    return json.loads(json.dumps(norm_varying(comparable(rec["reply"], msgs))).replace(tag, "TAG"))


def test_notebooks_of_three_users(hostd, users, bins, mpl_cache):
    """Three users, two LooseLeaf kernels each, on the broker's 2 slots, running mixed CPU/GPU cells of the
    real notebooks (PLAN): every output equal to ipykernel's (run by the same user on the same cells), GPU cells
    on workers of the user's own uid, no variable or output crossing kernels or users, and the broker, sampled
    through the run (its stats: what `looseleaf top --json` prints), never lending more than 2 slots."""
    import json
    users = users + [User(users[0].name[:-1] + "c", bins, hostd.socket)]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nbuser.py")
    kernels = [("looseleaf", "k1"), ("looseleaf", "k2"), ("python3", "r")]
    sampler = None
    procs, specs = [], []
    try:
        sampler = Sampler(hostd)
        for letter, u in zip("abc", users):
            cells = _plan_cells(letter)
            spec = {"kernels": []}
            for name, k in kernels:
                tag = u.name + k
                work = os.path.join(u.dir, "work-" + tag)
                kc = _kernel_cells(tag, work, cells)
                if name == "python3":  # ipykernel has no %%gpu / %%cpu: the same cells without that line
                    kc = [c.split("\n", 1)[1] if c.startswith(("%%gpu\n", "%%cpu\n")) else c for c in kc]
                spec["kernels"].append({"name": name, "cells": kc})
            specs.append(spec)
            env = _kernel_env(u, bins, mpl_cache)
            for name, k in kernels:
                os.mkdir(os.path.join(u.dir, "work-" + u.name + k))
                os.chown(os.path.join(u.dir, "work-" + u.name + k), u.uid, u.gid)
            with open(os.path.join(u.dir, "spec.json"), "w") as f:
                json.dump(spec, f)
            procs.append(subprocess.Popen(u.cmd([hdhelp.PYTHON, script, os.path.join(u.dir, "spec.json"),
                                                 os.path.join(u.dir, "out.json")]),
                                          env=env, cwd=u.dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        for u, p in zip(users, procs):
            try:
                so, _ = p.communicate(timeout=200)
            except subprocess.TimeoutExpired:
                _kill_processes_of(u)
                so = "(timed out)\n" + p.communicate()[0]
            assert p.returncode == 0, so[-3000:]
        sampler.close()
        outs = []
        for u in users:
            with open(os.path.join(u.dir, "out.json")) as f:
                outs.append(json.load(f))
        nb_routes = set()
        for u, out, spec in zip(users, outs, specs):
            ll1, ll2, ref = out
            n = len(ref)
            for (name, k), recs in zip(kernels, out):
                tag = u.name + k
                # What the kernel printed names its own user and kernel, never another's.
                raw = json.dumps(recs)
                assert tag in raw
                assert not [o.name for o in users if o is not u and o.name in raw], (tag, raw[:2000])
                assert not [u.name + j for _, j in kernels if j != k and u.name + j in raw], (tag, raw[:2000])
            ref_seen = [_visible(r, u.name + "r") for r in ref]
            for k, recs in (("k1", ll1), ("k2", ll2)):
                seen = [_visible(r, u.name + k) for r in recs]
                for i in range(n):
                    assert seen[i] == ref_seen[i], ("%s%s cell %d differs from ipykernel" % (u.name, k, i),
                                                    spec["kernels"][2]["cells"][i], seen[i], ref_seen[i])
                mds = [r["reply"]["metadata"]["looseleaf"] for r in recs]
                assert not [md for md in mds if "fallback" in md], mds
                routes = [md["route"] for md in mds]
                # The kernel's own cells went where they asked; most of the notebook's ran on workers.  The last
                # one (%%cpu, reading dir(): every name) runs on the session's home worker instead while one
                # holds a value of the notebook's (a tensor's autograd graph lives only there: README, "homes"),
                # which depends on whether slot pressure evicted that worker first.
                assert routes[:2] == ["cpu", "gpu"] and routes[-2] == "gpu", routes
                assert routes[-1] == "cpu" or mds[-1].get("to_home"), (routes, mds[-1])
                assert routes.count("gpu") >= n // 2, routes
                nb_routes.update(routes[2:-2])
            # The GPU marker cell ran as the user; each kernel sees its own marker only (and ipykernel too).
            assert ref_seen[1]["outputs"] == [["stream", {"name": "stdout", "text": "TAG %d\n" % u.uid}]]
            assert ref_seen[-2]["outputs"] == [["stream", {"name": "stdout",
                                                           "text": "TAG ['owner_TAG'] [1, 2]\n"}]]
            assert ref_seen[-1]["outputs"] == [["stream", {"name": "stdout", "text": "TAG ['owner_TAG']\n"}]]
        assert nb_routes == {"cpu", "gpu"}  # the notebooks' cells were mixed
        assert sampler.samples > 50
        assert sampler.max_busy <= 2 and sampler.max_leases == 2, (sampler.max_leases, sampler.max_busy)
        top = json.loads(users[2].as_user([bins.looseleaf, "top", "--socket", hostd.socket, "--json"]))
        assert top["slots"] == 2 and top["busy_slots"] <= 2
        for u in users:
            us = user_stats(top, u)
            assert us and us["grants"] >= 1 and us["gpu_busy_s"] > 0, top
    finally:
        if sampler:
            sampler.close()
        if any(p.poll() is None for p in procs):  # after a failure: what still runs as the users goes
            for u in users:
                _kill_processes_of(u)
            for p in procs:
                p.wait()
        users[2].close()


def _kill_processes_of(user):
    """SIGKILL every process running as USER (a test user: all of them were started by this test)."""
    import signal
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat("/proc/" + pid).st_uid == user.uid:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


ATTEMPTS_SCRIPT = r"""
import json, os, socket, sys
targets = json.loads(sys.argv[1])
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except PermissionError as e:
        out[name] = "EPERM/EACCES"
    except OSError as e:
        out[name] = "other: %s" % e
def connect(path):
    s = socket.socket(socket.AF_UNIX); s.settimeout(5)
    try:
        s.connect(path)
    finally:
        s.close()
attempt("pool_socket", lambda: connect(targets["pool_sock"]))
attempt("redis_socket", lambda: connect(targets["redis_sock"]))
attempt("pool_dir", lambda: os.listdir(targets["pool_dir"]))
attempt("payload_file", lambda: open(targets["payload"], "rb").close())
for what in ("worker", "zygote", "pool"):
    pid = targets[what]
    attempt(what + "_signal", lambda: os.kill(pid, 0))
    attempt(what + "_mem", lambda: open("/proc/%d/mem" % pid, "rb").close())
    attempt(what + "_environ", lambda: open("/proc/%d/environ" % pid, "rb").close())
print(json.dumps(out))
"""


def test_other_user_reaches_nothing_of_a(hostd, users):
    """User b cannot connect to, signal, read or map anything of a's: a's pool socket and dir, store socket,
    payload pool file, warm worker, zygote and pool (each attempt fails with a permission error)."""
    a, b = users
    ca = a.client("a1")
    assert reply_ok(ca.run("c1", "import numpy as np\nx = np.arange(100000)"))
    st = ca.stats()
    worker = next(w["pid"] for w in st["workers"] if w["state"] == "warm")
    zygote = st["nodes"][0]["pid"]
    payload = None
    with open("/proc/%d/maps" % worker) as f:  # the payload pool the worker maps (root may look)
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if path.startswith("/") and ("shm" in path or path.startswith(a.dir)) and "redis" not in path:
                payload = path
    assert payload, "no payload pool mapped by a's worker"
    targets = {"pool_sock": os.path.join(a.pool_dir, "pool.sock"), "pool_dir": a.pool_dir,
               "redis_sock": a.redis_url[len("unix://"):], "payload": payload,
               "worker": worker, "zygote": zygote, "pool": st["pid"]}
    import json
    out = json.loads(b.as_user([hdhelp.PYTHON, "-c", ATTEMPTS_SCRIPT, json.dumps(targets)]))
    assert out == {k: "EPERM/EACCES" for k in out} and len(out) == 13, out
    assert reply_ok(ca.run("c2", "print(x.sum())", state_closure=["x"]))


def test_faults_of_one_user_touch_no_other(hostd, users):
    """a's worker crashing and a's zygote killed: b's session goes on; a's next cells run; a's lease comes
    back to the broker."""
    a, b = users
    ca, cb = a.client("a1"), b.client("b1")
    assert reply_ok(ca.run("c1", "x = 5")) and reply_ok(cb.run("c1", "y = 7"))
    cb.submit("slow", "import time; time.sleep(1.0); print(y)", state_closure=["y"])
    ev = ca.run("crash", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert ev[-1]["content"]["status"] == "error" and ev[-1]["content"]["ename"] == "WorkerDied"
    evb = cb.collect("slow")
    assert reply_ok(evb) and stdout(evb) == "7\n"
    # a's zygote killed: a's pool starts another; a's next cell (a fresh worker) still sees x.
    zygote = ca.stats()["nodes"][0]["pid"]
    os.kill(zygote, 9)
    wait_for(lambda: any(n["pid"] != zygote and n["ready"] for n in ca.stats()["nodes"]), 60,
             "a's pool to start a new base zygote")
    ev = ca.run("c2", "print(x + 1)", state_closure=["x"])
    assert reply_ok(ev) and stdout(ev) == "6\n", ev
    ev = cb.run("c2", "print(y + 1)", state_closure=["y"])
    assert reply_ok(ev) and stdout(ev) == "8\n"
    st = hostd.stats()
    assert st["leases"] <= 2 and all(l["uid"] in (a.uid, b.uid) for l in st["lease_list"])


def test_silent_broker_is_given_up(bins, tmp_path):
    """Something listens on the broker's socket but never welcomes the pool: after a few seconds the pool
    uses its own slots (said once) and its cells run."""
    import socket
    d = tempfile.mkdtemp(prefix="ll-hostd-silent-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "hostd.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o666)
    srv.listen(8)
    u = None
    try:
        u = User("llhd%05ds" % (os.getpid() % 100000), bins, path)
        c = u.client("s1")
        ev = c.run("c1", "print(6 * 7)")
        assert reply_ok(ev) and stdout(ev) == "42\n"
        assert "did not answer" in u.log() and u.log().count("using the pool's own") == 1
    finally:
        if u:
            u.close()
        srv.close()
        shutil.rmtree(d, True)


# Cells run in turn on named kernels of one user (jupyter_client): [[kernel, code], ...] in, per cell its
# status, error, stdout and LooseLeaf metadata out (JSON).
PLAN_SCRIPT = r"""
import json, sys
from jupyter_client import KernelManager
plan = json.loads(sys.argv[1])
kms, kcs = {}, {}
for name in sorted({k for k, _ in plan}):
    kms[name] = KernelManager(kernel_name=name); kms[name].start_kernel()
    kcs[name] = kms[name].client(); kcs[name].start_channels(); kcs[name].wait_for_ready(timeout=120)
out = []
for name, code in plan:
    got = []
    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            got.append(msg["content"]["text"])  # (stderr has the load's "every GPU slot is in use" notices)
    reply = kcs[name].execute_interactive(code, output_hook=hook, timeout=180)
    c, md = reply["content"], reply["metadata"].get("looseleaf", {})
    out.append({"status": c["status"], "ename": c.get("ename"), "evalue": c.get("evalue"), "out": "".join(got),
                "route": md.get("route"), "worker": md.get("worker_pid"), "home": md.get("home") or {}})
for name in kcs:
    kcs[name].stop_channels(); kms[name].shutdown_kernel(now=False)
print(json.dumps(out))
"""


def test_store_cap_per_user(bins):
    """`looseleaf hostd --store-cap 64M`: a user's kernels together may hold 64 MiB of checkpoint store (each
    kernel has a store of its own).  a's first kernel saves 40 MiB; 40 MiB more in a's second kernel get
    StoreQuotaExceeded naming the user, the cap, the variable and what to do; the variable stays in its
    worker (a later cell reads it there); once a deletes the first, it is saved: the first kernel's history
    kept the deleted value, and that old version gives way to the save (%looseleaf history says so).  b,
    saving 40 MiB at the same time, is unaffected."""
    import json
    h = Hostd(bins, nslots=2, extra=["--store-cap", "64M"])
    made = []
    try:
        tag = "%05d" % (os.getpid() % 100000)
        for letter in "ab":
            made.append(User("llhq%s%s" % (tag, letter), bins, h.socket))
        a, b = made
        mib40 = "import numpy as np\n%s = np.ones(40 << 17)"  # 40 MiB of float64
        plans = {a: [["looseleaf", "%%gpu\n" + mib40 % "x"],
                     ["looseleaf2", "%%gpu\n" + mib40 % "y" + "\nprint('ran')"],
                     ["looseleaf2", "print(y.sum())"],
                     ["looseleaf", "%%gpu\ndel x"],
                     ["looseleaf2", "%%gpu\ny = y * 2\nprint(y[0])"],
                     ["looseleaf", "%looseleaf history x"]],
                 b: [["looseleaf", "%%gpu\n" + mib40 % "z" + "\nprint(z.sum())"]]}
        procs = {u: subprocess.Popen(u.cmd([hdhelp.PYTHON, "-c", PLAN_SCRIPT, json.dumps(plan)]),
                                     env=_kernel_env(u, bins), cwd=u.dir, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for u, plan in plans.items()}
        outs = {}
        for u, p in procs.items():
            so, se = p.communicate(timeout=300)
            assert p.returncode == 0, se[-3000:]
            outs[u] = json.loads(so.strip().splitlines()[-1])
        x, y, ry, dx, y2, hx = outs[a]
        assert x["status"] == "ok" and x["route"] == "gpu", x
        # Over the cap: the cell ran, its results were not saved; the error says who, how much and what to do.
        assert y["out"] == "ran\n" and y["status"] == "error" and y["ename"] == "StoreQuotaExceeded", y
        for part in ("user %s may hold 64 MiB in the checkpoint store (looseleaf hostd --store-cap)" % a.name,
                     "y could not be saved", "a payload of 40 MiB needs 40 MiB more",
                     "delete variables or ask the administrator"):
            assert part in y["evalue"], (part, y["evalue"])
        held = float(y["evalue"].split(" MiB held")[0].rsplit(" ", 1)[1])
        assert 40 <= held < 64, y["evalue"]
        # The variable is not lost: its worker stays its home, and a later cell reading it runs there.
        assert y["home"]["y"]["what"] == "not saved: StoreQuotaExceeded", y
        assert ry["status"] == "ok" and ry["out"] == "%r\n" % float(5 << 20) and ry["worker"] == y["worker"], ry
        # Room made (x deleted): y is saved, its worker no home for it any more.
        assert dx["status"] == "ok" and y2["status"] == "ok" and y2["out"] == "2.0\n", (dx, y2)
        assert "y" not in y2["home"], y2
        # The history (on by default) kept x's deleted value; it gave way to y's save, and says so.
        assert hx["status"] == "ok" and "dropped to make room for a save at your store cap: x@" in hx["out"], hx
        (z,) = outs[b]
        assert z["status"] == "ok" and z["out"] == "%r\n" % float(5 << 20), z
        assert h.stats()["store_cap"] == 64 << 20
        assert "store cap 64 MiB" in a.log()
    finally:
        for u in made:
            u.close()
        h.close()


def test_several_slots_per_gpu(bins):
    """The broker counts its slots as a pool does: two (fake) GPUs with --gpu-slots 2 are four slots, on
    devices 0, 1, 0, 1, each capped at 0.475 of its device.  `looseleaf top --json` shows that map, and
    the pools follow it: their own plan (one fake GPU, 2 slots, both on device 0) is not what places their
    workers; a worker on broker slot k sees k's device.  Two users with pools of 2 slots each hold up to 4
    leases, any of the broker's slots, never more than 4 nor more than 2 each."""
    lib = hdhelp.fake_cuda(bins)
    h = Hostd(bins, args=["--gpu-slots", "2"], env={"LL_CUDA_DRIVER": lib, "LL_FAKE_CUDA": "2"})
    made = []
    try:
        st = h.stats()
        assert st["slots"] == 4 and st["cuda"], st
        assert [(m["slot"], m["device"], m["cuda_visible"]) for m in st["slot_map"]] == \
            [(0, 0, "0"), (1, 1, "1"), (2, 0, "0"), (3, 1, "1")], st["slot_map"]
        assert all(abs(m["mem_fraction"] - 0.475) < 1e-9 for m in st["slot_map"])
        assert [(d["name"], d["slots"]) for d in st["devices"]] == [("Fake GPU 0", 2), ("Fake GPU 1", 2)]
        tag = "%05d" % (os.getpid() % 100000)
        for letter in "ab":
            u = User("llhd%s%s" % (tag, letter), bins, h.socket)
            u.environ.update(LL_CUDA_DRIVER=lib, LL_FAKE_CUDA="1")  # each pool's own plan: device 0 alone
            made.append(u)
        a, b = made
        import json
        top = json.loads(a.as_user([bins.looseleaf, "top", "--socket", h.socket, "--json"]))
        assert top["slot_map"] == st["slot_map"]
        assert "slot:GPU 0:0(cap 0.475) 1:1(cap 0.475) 2:0(cap 0.475) 3:1(cap 0.475)" in \
            a.as_user([bins.looseleaf, "top", "--socket", h.socket])
        clients = [a.client("a1"), a.client("a2"), b.client("b1"), b.client("b2")]
        assert clients[0].stats()["gpus"]["slot_device"] == [0, 0]  # unregistered slots: the pool's own plan
        sampler = Sampler(h)
        seen = {}  # cell id -> the broker slot its worker held, as its pool's stats said
        leases_ok = True
        try:
            for i, c in enumerate(clients):
                c.submit("g%d" % i, "import os, time\ntime.sleep(2.0)\nprint(os.environ['CUDA_VISIBLE_DEVICES'])")
            deadline = time.monotonic() + 60
            while len(seen) < 4 and time.monotonic() < deadline:
                for c in (clients[0], clients[2]):
                    g = c.stats()
                    for s, run in enumerate(g["slots"]):
                        bs = g["gpus"]["hostd_slot"][s]
                        if run and bs is not None and run.startswith("g"):
                            seen[run] = (bs, g["gpus"]["slot_device"][s], g["gpus"]["mem_fraction"][s])
                hs = h.stats()
                per = {}
                for lease in hs["lease_list"]:
                    per[lease["uid"]] = per.get(lease["uid"], 0) + 1
                    leases_ok = leases_ok and lease["device"] == st["slot_map"][lease["slot"]]["device"]
                leases_ok = leases_ok and all(n <= 2 for n in per.values())
                time.sleep(0.05)
            outs = {"g%d" % i: c.collect("g%d" % i) for i, c in enumerate(clients)}
        finally:
            sampler.close()
        assert leases_ok
        assert sampler.max_leases <= 4 and sampler.max_busy <= 4, (sampler.max_leases, sampler.max_busy)
        assert seen, "no running cell seen in the pools' stats"
        for cid, (bs, dev, frac) in seen.items():
            assert dev == st["slot_map"][bs]["device"] and abs(frac - 0.475) < 1e-9, (cid, bs, dev, frac)
            assert reply_ok(outs[cid]) and stdout(outs[cid]) == st["slot_map"][bs]["cuda_visible"] + "\n", \
                (cid, bs, outs[cid])
        printed = sorted(stdout(ev).strip() for ev in outs.values())
        assert "1" in printed, printed  # the pools' own plan has device 0 alone
    finally:
        for u in made:
            u.close()
        h.close()


def _prefetch(client, pid, **request):
    """CLIENT's prefetch PID (a worker prepared for its session's coming cell); the pool's answer."""
    client.send(op="prefetch", id=pid, session=client.session, store_dir=client.user.store_dir,
                redis_url=client.user.redis_url, **request)
    deadline = time.monotonic() + 120
    while True:
        ev = client.next(max(0.1, deadline - time.monotonic()))
        assert ev["type"] not in ("eof", "pool_gone"), ev
        if ev["type"] == "prefetched" and ev.get("id") == pid:
            return ev
        client.stray.append(ev)


def test_prefetch_takes_a_free_slot_and_gives_it_back_first(hostd, users):
    """A prefetch asks the broker for a slot at the lowest priority: user a, whose pool holds a warm
    worker's lease (its share of 2 slots), prefetches for another session and is lent the free slot (no
    cell waits); when user b's cell waits, that prefetch's lease is the one taken back, at once, although
    a is not above its share (its prefetch counts in none), and a's warm worker keeps its slot."""
    a, b = users
    a1, a2 = a.client("a1"), a.client("a2")
    assert reply_ok(a1.run("w", "x = 1"))
    wait_for(lambda: [l["state"] for l in hostd.stats()["lease_list"]] == ["warm"], 10, "a's warm lease")
    p = _prefetch(a2, "p1", state_closure=[])
    assert p["ok"], p
    st = wait_for(lambda: (lambda s: s if len(s["lease_list"]) == 2 and
                           any(l["prefetch"] and l["state"] == "warm" for l in s["lease_list"]) else None)(
        hostd.stats()), 10, "a's prefetch on a slot lent for it")
    assert all(l["uid"] == a.uid for l in st["lease_list"]) and user_stats(st, a)["grants"] == 2
    assert "for a prefetch" in a.log() and "for a prefetch" in hostd.log()
    keep = next(l["slot"] for l in st["lease_list"] if not l["prefetch"])
    gone = next(l["slot"] for l in st["lease_list"] if l["prefetch"])
    # b's cell waits: the prefetch's slot is taken back (a at share keeps its warm worker's) and lent to b.
    b1 = b.client("b1")
    evb = b1.run("c", "print('b ran')")
    assert reply_ok(evb) and stdout(evb) == "b ran\n"
    st = hostd.stats()
    assert user_stats(st, a)["revokes"] == 1 and user_stats(st, b)["revokes"] == 0
    assert "slot %d taken back from uid %d for uid %d" % (gone, a.uid, b.uid) in hostd.log()
    assert [(l["slot"], l["prefetch"]) for l in st["lease_list"] if l["uid"] == a.uid] == [(keep, False)]
    # a's warm worker still holds its slot: its session's next cell is a warm hit.
    ev = a1.run("w2", "print(x)", state_closure=["x"])
    assert reply_ok(ev) and stdout(ev) == "1\n" and started(ev)["warm_hit"], ev

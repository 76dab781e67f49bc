"""Processes a cell starts in a session of its own (a daemon's children must never outlive it): `Popen(start_new_session=True)`,
`setsid -f`, a double fork.  They are out of the worker's process group, which is what eviction kills, so they
outlived the worker's exit, its eviction, its client's end and the pool.  A worker is its descendants'
subreaper (an orphan of a double fork stays under it), and the pool kills what a worker left behind once it is
gone: after any of these ends, nothing the cell started runs on."""
import os
import random

import pytest

from zyghelp import Env, pid_alive, stop_pool, wait_for

WARM = ["--warm-idle", "60"]


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path))
    yield e
    e.close()


def _start(tag):
    """A cell that starts `sleep` twice out of its process group: a Popen in a new session, and a `setsid -f`
    (fork, setsid, exec: its parent exits at once, so the sleep is an orphan while the worker lives).  Neither
    is bound to a name (a Popen object would make the worker the session's home, which stays).  The cell ends
    once it sees both running and prints how many it saw: a worker that exits after its cell may have them
    killed before the test could look."""
    return ("import subprocess, os, time\n"
            "subprocess.Popen(['sleep', '1000.%s1'], start_new_session=True)\n"
            "subprocess.run(['setsid', '-f', 'sleep', '1000.%s2'], check=True)\n"
            "_t = time.time()\n"
            "while time.time() - _t < 20:\n"
            "    _n = 0\n"
            "    for _p in filter(str.isdigit, os.listdir('/proc')):\n"
            "        try:\n"
            "            _a = open('/proc/%%s/cmdline' %% _p, 'rb').read().split(b'\\0')\n"
            "        except OSError:\n"
            "            continue\n"
            "        _n += _a[0] == b'sleep' and _a[1].startswith(b'1000.%s')\n"
            "    if _n == 2:\n"
            "        break\n"
            "    time.sleep(0.05)\n"
            "print('sleeps running:', _n)\n" % (tag, tag, tag))


def _sleeps(tag):
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"sleep" and argv[1].startswith(("1000." + tag).encode()) and pid_alive(int(p)):
            out.append(int(p))
    return out


def _started(c, tag, **kw):
    r = c.run("s-" + tag, _start(tag), **kw)
    assert r.ok, r.events
    assert r.stdout == "sleeps running: 2\n", r.stdout
    return r


def test_what_a_cell_started_in_its_own_session_ends_with_its_worker(env):
    c = env.client()  # no warm workers: the worker exits after its cell
    tag = str(random.randint(10 ** 7, 10 ** 8 - 1))
    _started(c, tag)
    wait_for(lambda: not _sleeps(tag), 30, "the sleeps to end with their worker")


def test_an_evicted_warm_worker_takes_its_session_children_along(env):
    a = env.client(slots=1, extra=WARM)
    b = env.client(slots=1, extra=WARM)
    tag = str(random.randint(10 ** 7, 10 ** 8 - 1))
    r = _started(a, tag)
    assert pid_alive(r.ll["worker_pid"])
    # Another client's cell needs the one slot: the warm worker is evicted, and what it started goes too.
    assert b.run("b", "print(1)").stdout == "1\n"
    wait_for(lambda: not pid_alive(r.ll["worker_pid"]), 30, "the eviction")
    wait_for(lambda: not _sleeps(tag), 30, "the sleeps to end with the evicted worker")


def test_a_client_leaving_and_the_pool_stopping_take_them_along(env):
    a = env.client(extra=WARM)
    tag = str(random.randint(10 ** 7, 10 ** 8 - 1))
    _started(a, tag)
    a.close()  # the kernel shuts down: its warm worker leaves
    wait_for(lambda: not _sleeps(tag), 30, "the sleeps to end with their client")
    b = env.client(extra=WARM)
    tag = str(random.randint(10 ** 7, 10 ** 8 - 1))
    _started(b, tag)
    stop_pool(env.pool_dir)  # the pool ends with a warm worker holding them
    wait_for(lambda: not _sleeps(tag), 30, "the sleeps to end with the pool")

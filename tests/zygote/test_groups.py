"""Workers lead their own process group, killed and reaped whole before the slot is used again (issue 15,
item 12): a cell's children (DataLoader workers, a multiprocessing pool, a subprocess) keep /dev/nvidia* open,
so a slot handed on while they live would meet their device memory.  Checked with cells that start children
and a one-slot pool: the next cell, which can only start once the slot is free, sees the children gone."""
import os
import signal

from zyghelp import pid_alive, wait_for

# A subprocess and a forked child (as DataLoader's workers are), both sleeping; their pids printed.
CHILDREN = ("import os, subprocess, time\n"
            "p = subprocess.Popen(['sleep', '300'])\n"
            "k = os.fork()\n"
            "if k == 0:\n"
            "    time.sleep(300)\n"
            "    os._exit(0)\n"
            "print(p.pid, k)\n"
            "del p  # (a Popen cannot be saved: the worker would not stay warm)\n")


def _pids(cell):
    return [int(x) for x in cell.stdout.split()]


def _gone(pid):
    return not os.path.exists("/proc/%d" % pid)


def _check_gone(pids):
    return "import os\nprint([os.path.exists('/proc/%%d' %% p) for p in %r])" % (pids,)


def test_a_worker_leaving_after_its_cell_takes_its_children_before_the_slot_is_reused(env):
    c = env.client(slots=1)
    a = c.run("a", CHILDREN)
    assert a.ok, a.events
    kids = _pids(a)
    assert len(kids) == 2 and all(k > 0 for k in kids)
    # The next cell gets the only slot once the worker and its whole group are gone.
    b = c.run("b", _check_gone(kids))
    assert b.stdout.strip() == "[False, False]", b.events
    assert all(_gone(k) for k in kids)


def test_eviction_kills_the_warm_workers_group_before_the_next_session_runs(env):
    c1 = env.client(slots=1, extra=["--warm-idle", "60"])
    a = c1.run("a", CHILDREN)
    kids = _pids(a)
    # Warm: the worker and its children live on, holding the slot.
    assert all(pid_alive(k) for k in kids)
    assert [w["state"] for w in c1.stats()["workers"]] == ["warm"]
    c2 = env.client(slots=1, extra=["--warm-idle", "60"])
    c2.submit("b", _check_gone(kids), session=env.other_session("other"))
    ev = c2.collect("b")
    reply = ev[-1]
    assert reply["type"] == "reply" and reply["content"]["status"] == "ok", ev
    out = "".join(e["text"] for e in ev if e["type"] == "stream" and e["name"] == "stdout")
    assert out.strip() == "[False, False]", ev
    assert "slot pressure" in env.log()


def test_a_worker_killed_mid_cell_takes_its_children(env):
    c = env.client(slots=1)
    c.submit("k", CHILDREN + "time.sleep(300)\n")
    started = None
    out = ""
    while True:
        ev = c.next(120)
        if ev["type"] == "started":
            started = ev
        if ev["type"] == "stream":
            out += ev["text"]
        if started and len(out.split()) == 2:
            break
    kids = [int(x) for x in out.split()]
    os.kill(started["pid"], signal.SIGKILL)
    reply = c.collect("k")[-1]
    assert reply["content"]["ename"] == "WorkerDied", reply
    wait_for(lambda: all(_gone(k) for k in kids), 30, "the dead worker's children to be killed and reaped")
    # And the slot serves again.
    assert c.run("after", "print(5)").stdout == "5\n"

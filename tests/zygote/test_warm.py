"""Warm workers (issue 6, pool side): after its cell committed its save a worker stays warm for its client's
session and the session's next cell runs on it (same pid, no fork), restoring only what moved; what a CPU-side
commit changed is seen (nothing stale); under slot pressure idle warm workers are evicted smallest L first
(GreedyDual, policy/ll_greedydual.c), never one that runs or saves; killing a warm worker loses nothing; interrupts
reach a warm worker's cell; prefetch prepares a worker; stats list warm workers and each session's GPU-seconds,
and the pool logs one line per session end.  Pools here run with --warm-idle (warm workers are off by
default until tests/routing expects them)."""
import os
import signal

from zyghelp import pid_alive, wait_for

WARM = ["--warm-idle", "60"]


def _workers(c):
    return {w["pid"]: w for w in c.stats()["workers"]}


def _kernel_commit(env, **values):
    """What the kernel does after a CPU cell: commit VALUES (None = delete) from another process."""
    import _llstore
    from looseleaf_store import Checkpointer
    st = _llstore.Store(env.store_dir, env.session, redis_url=env.redis_url)
    try:
        ns = {k: v for k, v in values.items() if v is not None}
        rep = Checkpointer(st, ns).save(sorted(values))
        assert not rep.error and not rep.failed, rep
    finally:
        st.close()


def _prefetch(env, c, pid, **request):
    """Client C asks the pool to prepare the session's worker for REQUEST (state_closure, ...); returns the
    pool's `prefetched` answer."""
    c.send(op="prefetch", id=pid, session=env.session, store_dir=env.store_dir, redis_url=env.redis_url, **request)
    return _next_of(c, pid, ("prefetched",))


def _cancel_prefetch(c, answer, what):
    """Client C cancels the prefetch ANSWER came for; its worker (it never ran a cell) leaves."""
    c.send(op="cancel", id=answer["id"])
    wait_for(lambda: not pid_alive(answer["worker_pid"]), 10, what)


def _next_of(c, cid, types):
    while True:
        ev = c.next()
        if ev.get("id") == cid and ev["type"] in types:
            return ev
        assert not (ev.get("id") == cid and ev["type"] in ("reply", "error")), ev


def test_second_cell_is_a_warm_hit(env):
    c = env.client(extra=WARM)
    a = c.run("a", "import os\nx = [1, 2]\nprint(os.getpid())", defines=["x"])
    assert a.ok and a.ll["warm_hit"] is False and a.ll["prepared_by_prefetch"] is False, a.events
    pid = int(a.stdout)
    assert a.ll["worker_pid"] == pid and a.ll["stays_warm"] is True
    w = wait_for(lambda: _workers(c).get(pid, {}).get("state") == "warm" and _workers(c)[pid], 10, "warm worker")
    assert w["session"] == env.session and w["cells"] == 1 and w["bytes"] >= 0 and w["L"] is not None
    b = c.run("b", "import os\nx.append(3)\nprint(x, os.getpid())", state_closure=["x"], import_stmts=["import os"])
    assert b.ok, b.events
    assert b.stdout == "[1, 2, 3] %d\n" % pid
    assert b.types()[0] == "started" and b.events[0]["warm_hit"] is True and b.events[0]["pid"] == pid
    assert b.ll["warm_hit"] is True and b.ll["worker_pid"] == pid
    assert b.ll["fork_ms"] == 0 and b.ll["prep_ms"]["fork"] == 0, b.ll
    assert b.ll["restored"] == [], b.ll            # x is held at its committed version: nothing to restore
    assert b.ll["bytes_restored"] == 0, b.ll       # nor the process state: the worker's own save is the newest
    assert b.ll["saved"] == ["x"]                  # in-place mutation still saved
    # The worker's own output cache is not carried into the next cell (a cold worker has none either).
    assert c.run("b2", "x", state_closure=["x"]).result() == "[1, 2, 3]"
    b3 = c.run("b3", "print(repr(_), len(Out))")
    assert b3.ll["warm_hit"] and b3.stdout == "'' 0\n", b3.events
    # The store is the truth: a cold worker elsewhere sees the same x.
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: pid not in _workers(c), 10, "the killed warm worker to be dropped")
    d = c.run("d", "print(x)", state_closure=["x"])
    assert d.stdout == "[1, 2, 3]\n" and d.ll["warm_hit"] is False and d.ll["worker_pid"] != pid


def test_cpu_side_commits_between_cells_are_seen(env):
    c = env.client(extra=WARM)
    a = c.run("a", "x = 1\ny = 'old'\nz = [x]", defines=["x", "y", "z"])
    assert a.ok, a.events
    pid = a.ll["worker_pid"]
    # A CPU cell in the kernel rebinds x and deletes y; z is untouched.
    _kernel_commit(env, x=5, y=None)
    b = c.run("b", "print(x, 'y' in dir(), z)", state_closure=["x", "z"])
    assert b.ok and b.ll["worker_pid"] == pid and b.ll["warm_hit"], b.events
    assert b.stdout == "5 False [1]\n"
    assert b.ll["restored"] == ["x"], b.ll          # only what moved
    assert "x" in b.ll["dropped_stale"] and "y" in b.ll["dropped_stale"] and "z" not in b.ll["dropped_stale"]
    # A name the analysis did not list is not read stale either: dropped, as a cold worker would lack it.
    _kernel_commit(env, z=[7])
    r = c.run("c", "print('z' in dir())")
    assert r.stdout == "False\n" and r.ll["warm_hit"], r.events


def test_sigkill_of_a_warm_worker_loses_nothing(env):
    c = env.client(extra=WARM)
    a = c.run("a", "import numpy as np\nv = np.arange(6) * 7", defines=["v"])
    pid = a.ll["worker_pid"]
    wait_for(lambda: _workers(c).get(pid, {}).get("state") == "warm", 10, "warm")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: pid not in _workers(c), 10, "dropped")
    assert all(s is None for s in c.stats()["slots"])  # its slot came back
    b = c.run("b", "print(v.sum())", state_closure=["v"], import_stmts=["import numpy as np"])
    assert b.stdout == "105\n" and not b.ll["warm_hit"], b.events
    assert "WorkerDied" not in str(b.events)


def test_interrupt_reaches_a_warm_workers_cell(env):
    c = env.client(extra=WARM)
    assert c.run("a", "y = 1", defines=["y"]).ok
    c.submit("i", "y = 2\nprint('looping', flush=True)\nimport time\nwhile True: time.sleep(0.01)",
             defines=["y"], state_closure=["y"])
    st = _next_of(c, "i", ("started",))
    assert st["warm_hit"] is True
    _next_of(c, "i", ("stream",))
    c.send(op="interrupt", id="i")
    r = c.collect("i")[-1]
    assert r["content"]["ename"] == "KeyboardInterrupt", r
    assert r["metadata"]["looseleaf"]["warm_hit"] is True
    # What the cell did before the interrupt is kept, and no stale interrupt hits the next cell.
    b = c.run("b", "import time\ntime.sleep(0.2)\nprint(y)", state_closure=["y"])
    assert b.ok and b.stdout == "2\n" and b.ll["warm_hit"], b.events


def test_interrupt_sent_at_once_to_a_warm_hit_is_not_lost(env):
    c = env.client(extra=WARM)
    assert c.run("a", "q = 1", defines=["q"]).ok
    c.submit("i", "import time\nwhile True: time.sleep(0.01)")
    c.send(op="interrupt", id="i")
    r = c.collect("i")[-1]
    assert r["content"]["ename"] == "KeyboardInterrupt", r


def test_eviction_under_pressure_follows_greedydual(env):
    # Two slots, three sessions (one per client).  The two idle warm workers differ in the bytes they hold:
    # the small one goes first, and the clock advances to its L.
    big = env.client(slots=2, extra=WARM)
    small = env.client(slots=2, extra=WARM)
    third = env.client(slots=2, extra=WARM)
    rb = big.run("b", "import numpy as np\nbig = np.ones(4 << 20, dtype=np.uint8)", defines=["big"])
    rs = small.run("s", "small = b'x' * 1000", defines=["small"])
    assert rb.ok and rs.ok, (rb.events, rs.events)
    pb, ps = rb.ll["worker_pid"], rs.ll["worker_pid"]
    ws = _workers(big)
    assert ws[pb]["bytes"] >= 4 << 20 and ws[ps]["bytes"] < ws[pb]["bytes"], ws
    ls = ws[ps]["L"]
    assert big.stats()["clock"] == 0
    rt = third.run("t", "t = 3\nprint(t)", defines=["t"])
    assert rt.ok and rt.stdout == "3\n", rt.events
    wait_for(lambda: not pid_alive(ps), 10, "the small worker to be evicted")
    assert pid_alive(pb)
    st = big.stats()
    assert st["clock"] == ls, (st["clock"], ls)
    assert "slot pressure" in env.log()
    # The evicted session loses nothing: the pool prepared it again without a slot (staged, restoring what its
    # last cell read and defined); its next cell takes a slot (evicting the next smallest L) and sees its state.
    staged = wait_for(lambda: [w for w in _workers(small).values() if w["state"] == "staged"], 30, "the restage")
    r = small.run("s2", "print(len(small))", state_closure=["small"])
    assert r.stdout == "1000\n" and r.ll["staged"] and r.ll["worker_pid"] == staged[0]["pid"], r.events
    assert r.ll["restored"] == [] and r.ll["fork_ms"] == 0, r.ll


def test_one_slot_sessions_take_turns(env):
    a = env.client(slots=1, extra=WARM)
    b = env.client(slots=1, extra=WARM)
    r1 = a.run("a1", "n = 1", defines=["n"])
    r2 = b.run("b1", "m = 2", defines=["m"])        # evicts a's warm worker (its only slot)
    assert r1.ok and r2.ok and not r2.ll["warm_hit"]
    wait_for(lambda: not pid_alive(r1.ll["worker_pid"]), 10, "a's worker evicted")
    r3 = a.run("a2", "print(n)", state_closure=["n"])  # on a's worker prepared again, staged; b's is evicted
    assert r3.stdout == "1\n" and r3.ll["worker_pid"] != r1.ll["worker_pid"]
    r4 = a.run("a3", "print(n + 1)", state_closure=["n"])
    assert r4.stdout == "2\n" and r4.ll["warm_hit"] and r4.ll["worker_pid"] == r3.ll["worker_pid"]


def test_a_worker_is_never_evicted_before_its_save_committed(env):
    a = env.client(slots=1, extra=WARM)
    b = env.client(slots=1, extra=WARM)
    go = os.path.join(env.tmp, "go")
    # Pickling `s` blocks until the test says so: the save is slow, and the pool must wait for it.
    a.submit("slow", "class Slow:\n    def __reduce__(self):\n        import os, time\n"
                     "        while not os.path.exists(%r): time.sleep(0.01)\n        return (int, (7,))\n"
                     "s = Slow()" % go, defines=["s", "Slow"])
    pid = _next_of(a, "slow", ("started",))["pid"]
    wait_for(lambda: _workers(b).get(pid, {}).get("state") == "saving", 30, "the save to start")
    b.submit("other", "print('other')")
    ev = _next_of(b, "other", ("wait",))
    assert ev["slots"] == 1
    assert _workers(b)[pid]["state"] == "saving" and pid_alive(pid)
    open(go, "w").close()
    ra = a.collect("slow")[-1]
    assert ra["content"]["status"] == "ok" and "s" in ra["metadata"]["looseleaf"]["saved"], ra
    rb = b.collect("other")
    assert rb[-1]["content"]["status"] == "ok" and "other" in "".join(e.get("text", "") for e in rb)
    wait_for(lambda: not pid_alive(pid), 10, "the saved worker to be evicted")
    assert a.run("check", "print(s)", state_closure=["s"]).stdout == "7\n"


def test_prefetch_prepares_the_next_cell(env):
    c = env.client(slots=3, extra=WARM)
    assert c.run("a", "w = 41", defines=["w"]).ok
    # Another session (client) prefetches: a fresh worker restores the closure, runs nothing.
    d = env.client(extra=WARM)
    p = _prefetch(env, d, "p1", state_closure=["w"], import_closure=["numpy"], import_stmts=["import numpy as np"])
    assert p["ok"] and not p["warm_hit"] and p["restored"] == ["w"], p
    w = _workers(d)[p["worker_pid"]]
    assert w["state"] == "speculative" and w["cells"] == 0, w
    r = d.run("r", "print(w + 1, np.__name__)", state_closure=["w"], import_stmts=["import numpy as np"])
    assert r.stdout == "42 numpy\n", r.events
    assert r.ll["warm_hit"] and r.ll["prepared_by_prefetch"] and r.ll["worker_pid"] == p["worker_pid"]
    assert r.ll["restored"] == [] and r.ll["fork_ms"] == 0, r.ll
    # A prefetch for a session whose worker is warm re-checks versions only.
    p2 = _prefetch(env, d, "p2", state_closure=["w"])
    assert p2["ok"] and p2["warm_hit"] and p2["restored"] == [] and p2["worker_pid"] == p["worker_pid"], p2
    # Cancelling a prefetch whose worker never ran a cell lets that worker go.
    e = env.client(extra=WARM)
    p3 = _prefetch(env, e, "p3", state_closure=["w"])
    assert p3["ok"], p3
    _cancel_prefetch(e, p3, "the speculative worker to go")


def test_a_prefetch_takes_a_slot_only_on_credit_a_cell_earned(env):
    # One slot.  A session's first prefetch may evict a completed idle worker (its user is about to run what it
    # prefetches); after that, only once a cell of the session ran.  A prepared worker is never taken by a
    # prefetch.  (No staged workers here: a prefetch refused a slot would prepare one without.)
    env.environ["LL_POOL_MAX_STAGED"] = "0"
    c = env.client(slots=1, extra=WARM)
    rc = c.run("a", "k = 1", defines=["k"])
    assert rc.ok, rc.events
    d = env.client(slots=1, extra=WARM)

    def prefetch(client, pid):
        return _prefetch(env, client, pid, state_closure=["k"])

    p1 = prefetch(d, "p1")
    assert p1["ok"] and p1["restored"] == ["k"], p1
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 10, "C's worker evicted by D's first prefetch")
    pc = prefetch(c, "pc")  # C has credit (it ran a cell), but D's worker is prepared for D's coming cell
    assert not pc["ok"] and pc["skipped"] == "no free GPU slot" and pid_alive(p1["worker_pid"]), pc
    _cancel_prefetch(d, p1, "D's speculative worker to go")
    rc2 = c.run("b", "k += 1", state_closure=["k"], defines=["k"])
    assert rc2.ok, rc2.events
    p2 = prefetch(d, "p2")  # D spent its credit and ran no cell since
    assert not p2["ok"] and p2["skipped"] == "no free GPU slot" and pid_alive(rc2.ll["worker_pid"]), p2
    rd = d.run("d", "print(k)", state_closure=["k"])  # a cell takes the slot (cells always may)
    assert rd.stdout == "2\n", rd.events
    rc3 = c.run("c", "k += 1", state_closure=["k"], defines=["k"])
    assert rc3.ok and not rc3.ll["warm_hit"], rc3.ll
    p3 = prefetch(d, "p3")  # D's cell ran: its next prefetch may take the slot again
    assert p3["ok"] and p3["restored"] == ["k"], p3
    wait_for(lambda: not pid_alive(rc3.ll["worker_pid"]), 10, "C's worker evicted by D's earned prefetch")


def test_prefetch_refused_by_a_pool_without_warm_workers(env):
    c = env.client()
    c.send(op="prefetch", id="p", session=env.session, store_dir=env.store_dir)
    ev = _next_of(c, "p", ("error",))
    assert "warm workers are off" in ev["error"]
    r = c.run("a", "1")
    assert r.ok and r.ll["stays_warm"] is False
    wait_for(lambda: not pid_alive(r.ll["worker_pid"]), 10, "the worker to exit after its cell")


def test_idle_timeout_and_client_exit_end_warm_workers_and_log_gpu_seconds(env):
    c = env.client(extra=["--warm-idle", "1"])
    r = c.run("a", "1")
    wait_for(lambda: not pid_alive(r.ll["worker_pid"]), 15, "the idle warm worker to leave")
    assert "idle timeout" in env.log()
    d = env.client(extra=WARM)
    r = d.run("b", "import time\ntime.sleep(0.3)")
    pid = r.ll["worker_pid"]
    sess = [s for s in d.stats()["sessions"] if s["session"] == env.session]
    mine = max(sess, key=lambda s: s["gpu_held_s"])
    assert 0.3 <= mine["gpu_held_s"] <= mine["connected_s"] and 0 < mine["held_share"] <= 1, sess
    d.close()
    wait_for(lambda: not pid_alive(pid), 10, "the warm worker of a client that left")
    wait_for(lambda: "session %s: GPU held" % env.session in env.log(), 10, "the session line")
    line = [l for l in env.log().splitlines() if "session %s: GPU held" % env.session in l][-1]
    assert "s connected (" in line and "%)" in line, line


def test_a_worker_holding_what_no_store_holds_stays_as_its_home(env):
    # A generator cannot be saved: its worker keeps it (a HomeRef stands for it in the store) and stays, the
    # session's home for it; its next cell finds it there (a pool without warm workers keeps a home too:
    # tests/routing/test_route_fidelity.py).
    c = env.client(extra=WARM)
    r = c.run("g", "gen = (i for i in range(3))\nok = 1\nprint(next(gen))", defines=["gen", "ok"])
    assert r.ll["stays_warm"] is True and "save_failed" not in r.ll, r.ll
    assert r.ll["home"]["gen"]["kind"] == "held" and r.ll["home"]["gen"]["pid"] == r.ll["worker_pid"]
    r2 = c.run("h", "print(ok, next(gen))", state_closure=["ok", "gen"])
    assert r2.stdout == "1 1\n" and r2.ll["warm_hit"], r2.events
    w = [x for x in c.stats()["workers"] if x["pid"] == r.ll["worker_pid"]]
    assert w and w[0]["home"] == 1, w
    # Bound again to what a store holds: no home any more.
    r3 = c.run("i", "gen = 5", defines=["gen"])
    assert r3.ll["home"] == {} and r3.ll["stays_warm"] is True, r3.ll


def test_repeated_prefetches_cannot_keep_a_worker_against_an_honest_session(env):
    # Two slots.  B's worker (8 MiB, completed) is evicted before G's fresh speculative one (4 MiB): the clock
    # advances past G's L.  G then keeps prefetching the same closure: nothing changes, so neither its H nor
    # its speculation window is renewed, and once the window passed the honest session's newer state wins.
    _kernel_commit(env, big4=__import__("numpy").ones(4 << 20, dtype="uint8"))
    b = env.client(slots=2, extra=WARM + ["--spec-window", "4"])
    g = env.client(slots=2, extra=WARM)
    a = env.client(slots=2, extra=WARM)
    t = env.client(slots=2, extra=WARM)
    rb = b.run("b", "import numpy as np\nbig8 = np.ones(8 << 20, dtype=np.uint8)", defines=["big8"])
    assert rb.ok, rb.events
    pg = _prefetch(env, g, "g0", state_closure=["big4"])
    assert pg["ok"] and pg["held_bytes"] >= 4 << 20, pg
    ws = _workers(a)
    assert ws[pg["worker_pid"]]["state"] == "speculative" and ws[pg["worker_pid"]]["L"] < ws[rb.ll["worker_pid"]]["L"]
    ra = a.run("a1", "n = 1", defines=["n"])    # evicts B (completed before speculative), clock -> B's L
    assert ra.ok
    wait_for(lambda: not pid_alive(rb.ll["worker_pid"]), 10, "B's worker evicted")
    assert pid_alive(pg["worker_pid"])
    clock = a.stats()["clock"]
    assert clock >= 8 << 20
    wait_for(lambda: _workers(a)[pg["worker_pid"]]["state"] == "warm", 15, "G's speculation window to pass")
    for k in range(5):
        p = _prefetch(env, g, "g%d" % (k + 1), state_closure=["big4"])
        assert p["ok"] and p["warm_hit"] and p["restored"] == [] and p["dropped_stale"] == [], p
    ra = a.run("a2", "n += 1", state_closure=["n"], defines=["n"])
    assert ra.ll["warm_hit"]
    ws = _workers(a)
    assert ws[pg["worker_pid"]]["L"] < clock <= ws[ra.ll["worker_pid"]]["L"], ws
    rt = t.run("t", "print('third')")             # evicts G, not the honest session
    assert rt.stdout == "third\n"
    wait_for(lambda: not pid_alive(pg["worker_pid"]), 10, "G's worker evicted")
    assert pid_alive(ra.ll["worker_pid"])


def test_a_client_leaving_while_its_worker_saves_lets_the_save_commit(env):
    a = env.client(extra=WARM)
    b = env.client(extra=WARM)
    go = os.path.join(env.tmp, "go")
    a.submit("slow", "class Slow:\n    def __reduce__(self):\n        import os, time\n"
                     "        while not os.path.exists(%r): time.sleep(0.01)\n        return (int, (8,))\n"
                     "s = Slow()" % go, defines=["s", "Slow"])
    pid = _next_of(a, "slow", ("started",))["pid"]
    wait_for(lambda: _workers(b).get(pid, {}).get("state") == "saving", 30, "the save to start")
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: a.proc.pid and _workers(b).get(pid, {}).get("client") == -1, 10, "the pool to see a leave")
    assert pid_alive(pid)
    open(go, "w").close()
    wait_for(lambda: not pid_alive(pid), 10, "the worker to leave after its save")
    assert b.run("check", "print(s)", state_closure=["s"]).stdout == "8\n"


def test_a_prefetch_evicts_only_state_older_than_what_it_brings(env):
    env.environ["LL_POOL_MAX_STAGED"] = "0"  # a prefetch refused a slot would prepare a worker without one
    a = env.client(slots=1, extra=WARM)
    b = env.client(slots=1, extra=WARM)
    ra = a.run("a", "import numpy as np\nav = np.ones(1 << 20, dtype=np.uint8)", defines=["av"])
    assert ra.ok, ra.events
    # B spends the credit a session starts with (test_a_prefetch_takes_a_slot_only_on_credit_a_cell_earned)
    # and runs no cell: what remains is the rule for state older than what a prefetch brings.
    p0 = _prefetch(env, b, "p0", state_closure=["av"])
    assert p0["ok"], p0
    _cancel_prefetch(b, p0, "B's speculative worker to go")
    ra = a.run("a2", "av[0] = 2", state_closure=["av"], defines=["av"])
    assert ra.ok, ra.events
    pa = ra.ll["worker_pid"]
    la, clock = _workers(a)[pa]["L"], a.stats()["clock"]
    assert la >= clock + (1 << 20)
    # Without a size hint the prefetched worker would get L = clock < A's L: no eviction.
    p = _prefetch(env, b, "p1", state_closure=["av"])
    assert not p["ok"] and p["skipped"] == "no free GPU slot" and pid_alive(pa), p
    # With the closure's bytes (more than A holds), A's unused state is older than what the prefetch brings.
    p = _prefetch(env, b, "p2", state_closure=["av"], closure_bytes=la - clock + 1)
    assert p["ok"] and p["restored"] == ["av"], p
    wait_for(lambda: not pid_alive(pa), 10, "A's worker evicted by the prefetch")
    assert b.stats()["clock"] == la


def test_gpu_seconds_count_a_warm_worker_holding_its_slot(env):
    c = env.client(extra=WARM)
    r = c.run("a", "1 + 1")
    assert r.ll["stays_warm"]

    def held():
        return max(s["gpu_held_s"] for s in c.stats()["sessions"] if s["session"] == env.session)
    h0 = held()
    wait_for(lambda: held() >= h0 + 0.3, 10, "the held time to grow while the worker idles warm")


def test_an_unsaveable_result_is_only_history(env):
    c = env.client(extra=WARM)
    r = c.run("a", "(i for i in range(3))", execution_count=1)
    assert r.ok and r.result().startswith("<generator"), r.events
    assert "save_failed" not in r.ll and r.stderr == "" and r.ll["stays_warm"], r.ll


def test_a_cell_sent_right_after_its_warm_worker_died_runs_on_a_fresh_one(env):
    # Whether the pool sees the death before or after it hands the cell over, the cell runs (nothing ran on
    # the dead worker: it says ready before anything runs).
    c = env.client(extra=WARM)
    for k in range(3):
        a = c.run("a%d" % k, "v = %d" % k, defines=["v"])
        os.kill(a.ll["worker_pid"], signal.SIGKILL)
        r = c.run("b%d" % k, "print(v)", state_closure=["v"])
        assert r.ok and r.stdout == "%d\n" % k, r.events
        assert r.ll["worker_pid"] != a.ll["worker_pid"] and not r.ll["warm_hit"]


def _staged_setup(env):
    """One slot held by C's worker, prepared for C's coming cell (a prefetch after its cell): D's prefetch may
    not evict it, so it prepares a worker without a slot (staged)."""
    c = env.client(slots=1, extra=WARM)
    rc = c.run("a", "k = 41", defines=["k"])
    assert rc.ok, rc.events
    assert _prefetch(env, c, "pc", state_closure=["k"])["ok"]
    d = env.client(slots=1, extra=WARM)
    pd = _prefetch(env, d, "pd", state_closure=["k"])
    assert pd["ok"] and pd["staged"] and pid_alive(rc.ll["worker_pid"]), pd
    w = _workers(d)[pd["worker_pid"]]
    assert w["state"] == "staged" and w["slot"] == -1, w
    assert _workers(d)[rc.ll["worker_pid"]]["slot"] == 0
    return c, d, rc, pd


def test_a_prefetch_without_a_free_slot_stages_a_worker_that_takes_one_at_run(env):
    c, d, rc, pd = _staged_setup(env)
    assert pd["restored"] == ["k"], pd
    r = d.run("d", "print(k + 1)", state_closure=["k"])  # takes the slot: C's worker is evicted (a cell may)
    assert r.stdout == "42\n", r.events
    assert r.ll["warm_hit"] and r.ll["prepared_by_prefetch"] and r.ll["worker_pid"] == pd["worker_pid"], r.ll
    assert r.ll["fork_ms"] == 0 and r.ll["restored"] == [], r.ll
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 10, "C's worker evicted for D's cell")
    w = _workers(d)[pd["worker_pid"]]
    assert w["state"] == "warm" and w["slot"] == 0, w
    # Cancelling a staged prefetch lets its worker go, like a speculative one.
    rc2 = c.run("c2", "k += 1", state_closure=["k"], defines=["k"])  # evicts D's worker now (C's cell)
    assert rc2.ok, rc2.events
    e = env.client(slots=1, extra=WARM)
    assert _prefetch(env, c, "pc2", state_closure=["k"])["ok"]
    pe = _prefetch(env, e, "pe", state_closure=["k"])
    assert pe["ok"] and pe["staged"], pe
    _cancel_prefetch(e, pe, "the staged worker to go")
    assert pid_alive(rc2.ll["worker_pid"])


def test_a_staged_worker_on_a_gpu_host_restores_at_run(env):
    # As on a CUDA host (variables may hold device tensors): the staged worker imports only; the run restores.
    env.environ["LL_POOL_STAGED_DEFER"] = "1"
    c, d, rc, pd = _staged_setup(env)
    assert pd["restore_deferred"] and pd["restored"] == [], pd
    r = d.run("d", "print(k + 1, np.__name__)", state_closure=["k"], import_stmts=["import numpy as np"])
    assert r.stdout == "42 numpy\n", r.events
    assert r.ll["warm_hit"] and r.ll["prepared_by_prefetch"] and r.ll["restored"] == ["k"], r.ll


def test_a_worker_prepared_for_a_coming_cell_and_evicted_by_a_cell_is_prepared_again_staged(env):
    # One slot.  C's worker was prepared by a prefetch for C's coming cell; D's cell needs the slot and evicts
    # it (cells may); the pool prepares C again without a slot, so C's cell still starts on a prepared worker.
    c = env.client(slots=1, extra=WARM)
    rc = c.run("a", "k = 41", defines=["k"])
    assert rc.ok, rc.events
    pc = _prefetch(env, c, "pc", state_closure=["k"])
    assert pc["ok"] and pc["worker_pid"] == rc.ll["worker_pid"], pc
    d = env.client(slots=1, extra=WARM)
    rd = d.run("d", "print('d')")
    assert rd.stdout == "d\n", rd.events
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 10, "C's prepared worker evicted for D's cell")
    staged = wait_for(lambda: [w for w in _workers(c).values() if w["state"] == "staged"], 30,
                      "C's session prepared again, staged")
    assert len(staged) == 1 and staged[0]["slot"] == -1, staged
    r = c.run("b", "print(k + 1)", state_closure=["k"])
    assert r.stdout == "42\n", r.events
    assert r.ll["warm_hit"] and r.ll["prepared_by_prefetch"] and r.ll["staged"], r.ll
    assert r.ll["worker_pid"] == staged[0]["pid"] and r.ll["fork_ms"] == 0 and r.ll["restored"] == [], r.ll
    # The pool's own prefetch answered nobody: C saw one "prefetched" for pc.
    assert not [ev for ev in env.stray if ev.get("id") == "pc"], env.stray


def test_a_staged_worker_gets_a_slot_at_its_sessions_next_hint(env):
    # D's staged worker; C's cell ran, so C's worker is a completed one now.  D's next prefetch (its user edits
    # on) spends D's credit on C's worker and hands the slot to the staged worker before Run.
    c, d, rc, pd = _staged_setup(env)
    rc2 = c.run("c2", "k += 1", state_closure=["k"], defines=["k"])
    assert rc2.ok and rc2.ll["worker_pid"] == rc.ll["worker_pid"], rc2.ll
    p2 = _prefetch(env, d, "pd2", state_closure=["k"])
    assert p2["ok"] and p2["worker_pid"] == pd["worker_pid"] and not p2["staged"], p2
    assert p2["restored"] == ["k"], p2  # C's cell moved k since D's worker restored it
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 10, "C's worker evicted by D's credit")
    w = _workers(d)[pd["worker_pid"]]
    assert w["slot"] == 0 and w["state"] == "speculative", w
    r = d.run("d", "print(k)", state_closure=["k"])
    assert r.stdout == "42\n" and r.ll["warm_hit"] and not r.ll["staged"] and r.ll["wait_ms"] < 1000, r.ll

"""Staged workers on CUDA hosts (issue 15, item 13), as LL_POOL_STAGED_DEFER=1 makes any pool treat them: a
worker prepared without a slot only imports (it has no device for the state's tensors); once a slot is free
and nothing waits for one, the pool itself hands it the slot, in the edit window, and it restores (and, on a
GPU, initialises CUDA and warms cuBLAS) before the session's Run."""
from test_warm import WARM, _staged_setup, _workers  # noqa: F401 (the same set-up as the staged tests there)
from zyghelp import pid_alive, wait_for


def test_a_staged_worker_is_prepared_on_a_slot_as_soon_as_one_is_free(env):
    env.environ["LL_POOL_STAGED_DEFER"] = "1"
    c, d, rc, pd = _staged_setup(env)
    assert pd["restore_deferred"] and pd["restored"] == [], pd
    # C's client leaves: its warm worker goes, the slot is free, and nobody asked for anything.
    c.close()
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 30, "C's worker to leave with its client")
    w = wait_for(lambda: [w for w in _workers(d).values() if w["pid"] == pd["worker_pid"] and w["slot"] == 0
                          and w["state"] in ("warm", "speculative")], 30,
                 "D's staged worker prepared on the free slot")
    assert w, _workers(d)
    assert "staged worker %d is prepared on a free slot" % pd["worker_pid"] in env.log()
    # The pool's own prefetch answered nobody (D saw one "prefetched", for pd).
    assert not [ev for ev in env.stray if ev.get("type") == "prefetched"], env.stray
    # D's Run finds the state restored already: nothing restored at Run, no fork, no wait.
    r = d.run("d", "print(k + 1)", state_closure=["k"])
    assert r.stdout == "42\n", r.events
    assert r.ll["warm_hit"] and r.ll["prepared_by_prefetch"] and not r.ll["staged"], r.ll
    assert r.ll["restored"] == [] and r.ll["worker_pid"] == pd["worker_pid"], r.ll


def test_without_deferred_restores_staged_workers_wait_for_their_run(env):
    # Where no device is involved a staged worker restored already; the pool does not move it.
    c, d, rc, pd = _staged_setup(env)
    c.close()
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 30, "C's worker to leave with its client")
    assert [w["state"] for w in _workers(d).values() if w["pid"] == pd["worker_pid"]] == ["staged"]

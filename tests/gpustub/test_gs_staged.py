"""Staged workers on a CUDA host (issue 22, item 2): a worker prepared without a slot imports the cell's import
closure with no device visible (CUDA_VISIBLE_DEVICES=""); an import that initialises the driver then leaves the
process a device count of 0 for good (cuInit reads CUDA_VISIBLE_DEVICES once).  Such a worker leaves, and the
cell's Run gets a fresh worker that sees its slot's device."""
from stubhelp import ASK_DRIVER
from test_warm import WARM, _prefetch, _workers
from zyghelp import pid_alive, wait_for

# A package that probes CUDA at import, as GPU libraries do (driver API through ctypes).
PROBING = ("import ctypes\n"
           "_cu = ctypes.CDLL('libcuda.so.1')\n"
           "INIT_RC = _cu.cuInit(0)\n"
           "_n = ctypes.c_int(-1)\n"
           "_cu.cuDeviceGetCount(ctypes.byref(_n))\n"
           "COUNT = _n.value\n")


def _one_slot_held(env):
    """One slot, held by C's warm worker (prepared for C's coming cell): D's prefetch stages a worker."""
    c = env.client(slots=1, extra=WARM)
    rc = c.run("a", "k = 41", defines=["k"])
    assert rc.ok, rc.events
    assert _prefetch(env, c, "pc", state_closure=["k"])["ok"]
    d = env.client(slots=1, extra=WARM)
    return c, d, rc


def test_a_staged_worker_whose_import_initialised_cuda_leaves_and_the_run_sees_the_device(env):
    env.write_module("llgs_probing", PROBING)
    c, d, rc = _one_slot_held(env)
    pd = _prefetch(env, d, "pd", state_closure=["k"], import_closure=["llgs_probing"])
    assert pd["ok"] and pd["staged"], pd
    assert env.called(pd["worker_pid"], "cuInit")  # with no device visible
    # D's Run takes the slot (C's warm worker is evicted); the cell's process sees the slot's device, through
    # the probing package's import as through the driver.
    r = d.run("d", "print(k + 1, llgs_probing.INIT_RC, llgs_probing.COUNT)\n" + ASK_DRIVER,
              state_closure=["k"], import_closure=["llgs_probing"], import_stmts=["import llgs_probing"])
    assert r.ok, r.events
    assert r.stdout.splitlines() == ["42 0 1", "driver 0 1 LooseLeaf Stub GPU 0"], r.events
    # Because the staged worker said why it could not take a slot and left: the cell ran on a fresh one.
    assert "an import initialised CUDA while this worker had no device" in pd.get("cuda_refork", ""), pd
    assert r.ll["worker_pid"] != pd["worker_pid"] and not r.ll["warm_hit"], r.ll
    assert not pid_alive(pd["worker_pid"]) and pd["worker_pid"] not in _workers(d)
    wait_for(lambda: not pid_alive(rc.ll["worker_pid"]), 30, "C's worker evicted for D's cell")


def test_a_staged_worker_whose_imports_left_cuda_alone_stays_and_takes_its_slot_at_run(env):
    env.write_module("llgs_plain", "VALUE = 1\n")
    c, d, rc = _one_slot_held(env)
    pd = _prefetch(env, d, "pd", state_closure=["k"], import_closure=["llgs_plain"])
    assert pd["ok"] and pd["staged"] and "cuda_refork" not in pd, pd
    assert pd["restore_deferred"] and pd["restored"] == [], pd
    assert not env.called(pd["worker_pid"], "cuInit")
    r = d.run("d", "print(k + llgs_plain.VALUE)\n" + ASK_DRIVER, state_closure=["k"],
              import_closure=["llgs_plain"], import_stmts=["import llgs_plain"])
    assert r.ok and r.stdout.splitlines() == ["42", "driver 0 1 LooseLeaf Stub GPU 0"], r.events
    assert r.ll["worker_pid"] == pd["worker_pid"] and r.ll["warm_hit"], r.ll

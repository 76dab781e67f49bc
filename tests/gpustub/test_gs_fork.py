"""Zygote fork safety with the CUDA build of torch (issue 22, item 1): `import torch` maps the driver (cuBLASLt
and cuSPARSELt dlopen libcuda.so.1 when they load) without initialising it, so a zygote holding torch forks;
a zygote or a probed package that initialised the driver (cuInit) does not get into the cache."""
from stubhelp import ASK_DRIVER, TORCH_HEAD
from zyghelp import wait_for

CUINIT = ("import ctypes\n"
          "RC = ctypes.CDLL('libcuda.so.1').cuInit(0)\n")


def test_a_zygote_holding_torch_forks_and_its_worker_gets_its_device(env):
    c = env.client(head=TORCH_HEAD, slots=2)
    r = c.run("a", "import torch\nprint(torch.version.cuda)\n" + ASK_DRIVER, import_stmts=["import torch"])
    assert r.ok, r.events  # before: ZygoteRefused ... the zygote has the CUDA driver mapped
    assert r.stdout.splitlines() == ["13.0", "driver 0 1 LooseLeaf Stub GPU 0"], r.events
    zygotes = env.zygote_pids(c)
    # Every zygote mapped the driver (torch's libraries did) and none initialised it; the worker did, after
    # the fork (torch.cuda.init: the runtime, which the stub cannot serve, so the worker reports why).
    assert zygotes and all(env.called(z, "load") for z in zygotes), env.calls()
    # (cuDeviceGetCount is the pre-fork check asking the driver: CUDA_ERROR_NOT_INITIALIZED, nothing done.)
    assert not [call for z in zygotes for _, call in env.calls(z) if call not in ("load", "cuDeviceGetCount")], \
        env.calls()
    w = r.ll["worker_pid"]
    assert env.called(w, "cuInit"), env.calls(w)
    assert "operation not supported" in r.ll.get("cuda_error", ""), r.ll
    # The zygote forks again: a second session's cell.
    r2 = c.run("b", "print(2)")
    assert r2.ok and r2.stdout == "2\n", r2.events


def test_a_zygote_that_initialised_the_driver_refuses_to_fork(env):
    env.write_module("llgs_cuinit", CUINIT)
    c = env.client(head="torch,IPython,looseleaf_kernel,looseleaf_store,llgs_cuinit")
    r = c.run("a", "print(1)")
    assert r.content["ename"] == "ZygoteRefused", r.events
    assert "initialised the CUDA driver" in r.content["evalue"], r.content
    assert "refusing to fork" in env.log()


def _node_with(c, module):
    return [n for n in c.stats()["nodes"] if n["ready"] and module in n["modules"]]


def test_the_probe_takes_torch_for_safe_and_cuinit_for_unsafe(env):
    env.write_module("llgs_torchy", "import torch\nVALUE = torch.tensor([1, 2]).sum().item()\n")
    env.write_module("llgs_cuinit", CUINIT)
    c = env.client()  # the light head: torch comes with the tail package
    r = c.run("a", "print(llgs_torchy.VALUE)", import_closure=["llgs_torchy"], import_stmts=["import llgs_torchy"])
    assert r.ok and r.stdout == "3\n", r.events
    wait_for(lambda: "llgs_torchy" in c.stats()["safety"], 60, "the probe's verdict on llgs_torchy")
    assert c.stats()["safety"]["llgs_torchy"] is True, env.log()  # before: "maps .../libcuda.so.1"
    wait_for(lambda: _node_with(c, "llgs_torchy"), 60, "a node grown with llgs_torchy")
    r = c.run("b", "print(llgs_cuinit.RC)", import_closure=["llgs_cuinit"], import_stmts=["import llgs_cuinit"])
    assert r.ok and r.stdout == "0\n", r.events  # the worker sees its slot's device: cuInit succeeds
    wait_for(lambda: "llgs_cuinit" in c.stats()["safety"], 60, "the probe's verdict on llgs_cuinit")
    assert c.stats()["safety"]["llgs_cuinit"] is False
    assert "initialised (cuInit called" in env.log(), env.log()
    assert not _node_with(c, "llgs_cuinit")

"""Faults at named points of a GPU cell (issue 16, "beyond the probe"), through the real kernel: the worker
does something bad at a stage of its job (zyg.py's fault hook, "ACTION@STAGE": prepare = before the store
is opened, restore = after the restore, save = before the save) and the session must stay consistent: the
cell either ran and committed (ok) or failed with a clear error and committed nothing, the kernel lives, and
the next cell runs from the last committed versions.  Also: a worker killed while it restores gets one fresh
worker before the cell fails; a worker the OOM killer ends is reported as such; the kernel killed mid-cell
or shut down during a save leaves nothing behind."""
import os
import signal
import subprocess
import time

import pytest

from faulthelp import (FaultKernel, execute, gpu_kernel, ll_md, new_pool_dir, owner_of, pool_holders,
                       redis_pid, redis_processes, run_route, send_execute, store_of, stream_text, wait_for)

CELL = "fp_t.add_(1)\nfp_n += 1\nprint('ran', flush=True)"


@pytest.fixture(scope="module")
def pk():
    with gpu_kernel("import torch\nfp_t = torch.zeros(3)\nfp_n = 0", new_pool_dir(),
                    env={"LL_STORE_TIMEOUT_S": "4"}) as k:
        k.store = store_of(k.pid)
        k.n = 0  # fp_n as committed (fp_t.sum() is 3 * fp_n)
        yield k


def _committed(k):
    """(fp_t.sum(), fp_n) as a fresh GPU cell sees them."""
    _, msgs = run_route(k, "print(fp_t.sum().item(), fp_n)", "gpu")
    s, n = stream_text(msgs).split()
    return float(s), int(n)


# fault -> the errors the cell may end with (None: it must succeed)
CASES = {
    "kill@prepare": ("WorkerDied",),                          # retried once, dies again
    "kill_once@restore": None,                                 # retried once on a fresh worker: runs
    "interrupt@restore": ("KeyboardInterrupt",),
    "kill_redis@restore": ("StoreUnavailable",),              # or rides over the restart
    "kill_redis@save": ("StoreUnavailable",),
    "stop_redis@save": ("StoreUnavailable",),                  # the guard kills and restarts it
    "kill_zygote@restore": ("WorkerDied",),
    "kill_pool@restore": ("PoolGone", "WorkerDied"),
}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_fault_point(pk, fault):
    allowed = CASES[fault]
    pid = redis_pid(pk.store)
    try:
        reply, msgs = execute(pk, CELL, metadata={"looseleaf_fault": fault})
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    c = reply["content"]
    assert pk.km.is_alive()
    if c["status"] == "ok":
        assert allowed is None or "StoreUnavailable" in allowed or "WorkerDied" in allowed, (fault, c)
        assert stream_text(msgs) == "ran\n"
        pk.n += 1
    else:
        assert allowed is not None and c["ename"] in allowed, (fault, c)
    if fault == "kill_once@restore":
        assert ll_md(reply).get("worker_retries") == 1, ll_md(reply)
    if fault == "kill@prepare":
        assert "twice" in c["evalue"], c
    # All of the cell or nothing of it, and the session goes on.
    assert _committed(pk) == (3.0 * pk.n, pk.n), (fault, c)


def _memory_cgroup_of(pid):
    """The directory of PID's memory cgroup (v1 or v2), or None."""
    with open("/proc/%d/cgroup" % pid) as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            d = "/sys/fs/cgroup/memory" + path
            return d if os.path.isdir(d) else None
    for hid, controllers, path in lines:
        if hid == "0" and not controllers:
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                if os.path.exists(root + path + "/memory.max"):
                    return root + path
    return None


def test_a_worker_the_oom_killer_ends_is_reported_so(pk):
    """The session's warm worker moved into a memory cgroup of 256 MiB, then a cell that allocates 1 GiB:
    the kernel's OOM killer ends it, and the cell's error says out of memory."""
    reply, _ = run_route(pk, "%%gpu\nprint(fp_n)", "gpu")
    reply, _ = run_route(pk, "%%gpu\nprint(fp_n)", "gpu")
    md = ll_md(reply)
    if not md.get("warm_hit"):
        pytest.skip("no warm worker to move")
    worker = md["worker_pid"]
    parent = _memory_cgroup_of(worker)
    if parent is None:
        pytest.skip("no memory cgroup here")
    box = os.path.join(parent, "ll-oom-test-%d" % os.getpid())
    try:
        os.mkdir(box)
        limit = "memory.max" if os.path.exists(os.path.join(box, "memory.max")) else "memory.limit_in_bytes"
        with open(os.path.join(box, limit), "w") as f:
            f.write(str(256 << 20))
        with open(os.path.join(box, "cgroup.procs"), "w") as f:
            f.write(str(worker))
    except OSError as e:
        if os.path.isdir(box):
            os.rmdir(box)
        pytest.skip("cannot make a memory cgroup here: %s" % e)
    try:
        reply, _ = execute(pk, "%%gpu\nfp_big = bytearray(1 << 30)\nfp_big[::4096] = b'x' * (len(fp_big) // 4096)")
        c = reply["content"]
        assert c["status"] == "error" and c["ename"] == "WorkerDied", c
        assert "SIGKILL" in c["evalue"] and "out of memory" in c["evalue"], c
    finally:
        wait_for(lambda: not open(os.path.join(box, "cgroup.procs")).read().strip(), 30,
                 "the memory cgroup to empty")
        os.rmdir(box)
    assert _committed(pk) == (3.0 * pk.n, pk.n)


@pytest.mark.parametrize("stage", ["restore", "save"])
def test_kernel_killed_mid_cell_leaves_nothing(stage):
    k = FaultKernel()
    try:
        run_route(k, "import torch\nkm_t = torch.ones(300, 1000)", "gpu")
        d = store_of(k.pid)
        session = owner_of(d)[1]
        send_execute(k, "km_t += 1", {"looseleaf_fault": "kill_kernel@" + stage})
        wait_for(lambda: not k.km.is_alive(), 30, "the kernel to be killed")
        wait_for(lambda: not redis_processes(d) and not pool_holders(session), 10,
                 "the killed kernel's redis-server, workers and pool to go")
    finally:
        k.stop()


def test_shutdown_during_a_stalled_save_leaves_nothing():
    k = FaultKernel(env={"LL_STORE_TIMEOUT_S": "30"})
    try:
        run_route(k, "import torch\nss_t = torch.ones(300, 1000)", "gpu")
        d = store_of(k.pid)
        session = owner_of(d)[1]
        msg_id = send_execute(k, "ss_t += 1\nprint('saving', flush=True)", {"looseleaf_fault": "stop_redis@save"})
        k.iopub_next(msg_id, lambda m: m["msg_type"] == "stream" and "saving" in m["content"]["text"],
                     timeout=60)
        t0 = time.monotonic()
        k.km.shutdown_kernel(now=False)
        assert time.monotonic() - t0 < 20
        wait_for(lambda: not redis_processes(d) and not pool_holders(session) and not os.path.exists(d), 15,
                 "the store to go with the kernel")
    finally:
        k.stop()

"""The checkpoint store under faults, through the real kernel (issue 16, items 1-3 and the store's partial
results): the store's redis-server killed or stopped mid-session, the payload pool full, an interrupt while
the store is silent, and what a kernel leaves behind at shutdown or when it is killed.

The session must go on with every committed variable; at most one cell may fail, with a clear
StoreUnavailable; no cell may hang; a cell whose results cannot all be saved ends in an error naming them,
with nothing of it committed; nothing stays in /dev/shm, no redis-server outlives its kernel by more than a
few seconds, and no dead one stays <defunct>."""
import os
import signal
import tempfile
import time

import pytest

from faulthelp import (FaultKernel, execute, gpu_kernel, ll_md, new_pool_dir, owner_of, pool_files,
                       pool_holders, redis_pid, redis_processes, run_route, send_execute, store_of,
                       stream_text, wait_for, zombies_of)

TIMEOUT_S = 4  # LL_STORE_TIMEOUT_S of these kernels (and of their pools' workers)


@pytest.fixture(scope="module")
def fk():
    with gpu_kernel("import torch\nfs_t = torch.arange(4.)\nfs_n = 7", new_pool_dir(),
                    env={"LL_STORE_TIMEOUT_S": str(TIMEOUT_S)}) as k:
        k.store = store_of(k.pid)
        yield k


# The interrupt tests' kernel: a longer timeout, so that "the interrupt ended the wait, not the guard" (which
# kills a silent server after half the timeout) holds by a wide margin on a loaded machine, where the interrupt's
# way from the client through the kernel and the pool to the worker can itself take a second or two.
INTERRUPT_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def fk_slow_guard():
    with gpu_kernel("import torch\nfs_t = torch.arange(4.)\nfs_n = 7", new_pool_dir(),
                    env={"LL_STORE_TIMEOUT_S": str(INTERRUPT_TIMEOUT_S)}) as k:
        k.store = store_of(k.pid)
        yield k


def _resume(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except (ProcessLookupError, TypeError):
        pass


def _ok_or_unavailable(k, code):
    """Run CODE (a GPU cell); it may fail once with StoreUnavailable, then it must run.  Returns
    (the replies' statuses, the successful run's messages)."""
    seen = []
    for _ in range(2):
        reply, msgs = execute(k, code)
        c = reply["content"]
        seen.append(c["status"] if c["status"] == "ok" else c["ename"])
        if c["status"] == "ok":
            return seen, msgs
        assert c["ename"] == "StoreUnavailable", c
        assert "did not answer" in c["evalue"] or "Redis" in c["evalue"], c
    raise AssertionError("the cell failed twice: %s" % seen)


def test_redis_killed_the_session_goes_on(fk):
    old = redis_pid(fk.store)
    os.kill(old, signal.SIGKILL)
    # A variable only GPU cells made is still there, for a GPU cell and for a CPU cell.
    seen, msgs = _ok_or_unavailable(fk, "print(fs_t.sum().item(), fs_n)")
    assert stream_text(msgs) == "6.0 7\n", seen
    _, msgs = run_route(fk, "%%cpu\nprint(fs_t.tolist())", "cpu")
    assert stream_text(msgs) == "[0.0, 1.0, 2.0, 3.0]\n"
    # The kernel noticed, started a new server on the same data and reaped the dead one.
    assert redis_pid(fk.store) not in (None, old)
    wait_for(lambda: not zombies_of(fk.pid), 10, "no <defunct> child of the kernel")


def test_redis_stopped_a_cell_answers(fk):
    pid = redis_pid(fk.store)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        reply, msgs = execute(fk, "fs_t.add_(1)\nprint(fs_t.sum().item())")
        took = time.monotonic() - t0
        c = reply["content"]
        # Within the store's timeout (plus the cell's own work): answered, or a clear error.
        assert took < 3 * TIMEOUT_S + 10, took
        assert c["status"] == "ok" or c["ename"] == "StoreUnavailable", c
        want = "10.0\n" if c["status"] == "ok" else "6.0\n"
    finally:
        _resume(pid)
    # The stopped server was killed and started again: the session goes on.
    _, msgs = run_route(fk, "print(fs_t.sum().item())", "gpu")
    assert stream_text(msgs) == want
    assert redis_pid(fk.store) != pid


def test_redis_back_without_its_data_one_clear_error():
    """The store's redis-server killed with its append-only file gone: it comes back empty.  The next GPU
    cell fails once with StoreUnavailable naming what lived only in the store; the kernel's own variables
    are committed again, and the session goes on with them."""
    import shutil
    k = FaultKernel(env={"LL_STORE_TIMEOUT_S": str(TIMEOUT_S)})
    try:
        run_route(k, "import torch\nwe_gpu = torch.ones(2)", "gpu")  # only in the store (a worker made it)
        run_route(k, "%%cpu\nwe_cpu = 41", "cpu")                     # the kernel holds it
        run_route(k, "%%gpu\nprint(we_cpu)", "gpu")                   # and commits it
        store = store_of(k.pid)
        pid = redis_pid(store)
        os.kill(pid, signal.SIGSTOP)
        shutil.rmtree(os.path.join(store, "redis-aof"))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: redis_pid(store) not in (None, pid), 10, "the server to come back")
        reply, msgs = execute(k, "%%gpu\nprint(we_cpu + 1)")
        c = reply["content"]
        assert c["status"] == "error" and c["ename"] == "StoreUnavailable", c
        assert "without its data" in c["evalue"] and "we_gpu" in c["evalue"], c
        assert "we_cpu" not in c["evalue"], c
        _, msgs = run_route(k, "%%gpu\nprint(we_cpu + 1)", "gpu")
        assert stream_text(msgs) == "42\n"
        reply, _ = execute(k, "print(we_gpu)")
        assert reply["content"]["ename"] == "NameError", reply["content"]
    finally:
        k.stop()


@pytest.mark.parametrize("route", ["gpu", "cpu"])
def test_redis_back_without_what_only_workers_committed(route):
    """The same when only workers committed since the kernel's last commit (issue 23, part 3, item 5): GPU
    cells made eg_g and eg_h; the store comes back empty; the next cell reading eg_h, GPU or CPU, fails with
    StoreUnavailable naming both (it gave a bare NameError: the check compared the store's newest commit with
    the kernel's own last one, which workers' commits never moved).  Then the session goes on."""
    import shutil
    k = FaultKernel(env={"LL_STORE_TIMEOUT_S": str(TIMEOUT_S)})
    try:
        run_route(k, "import torch\neg_g = torch.ones(2)", "gpu")
        run_route(k, "eg_h = eg_g * 3", "gpu")
        run_route(k, "eg_g.add_(1)\nprint(eg_h.sum().item())", "gpu")
        store = store_of(k.pid)
        pid = redis_pid(store)
        os.kill(pid, signal.SIGSTOP)
        shutil.rmtree(os.path.join(store, "redis-aof"))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: redis_pid(store) not in (None, pid), 10, "the server to come back")
        reply, msgs = execute(k, "%%%%%s\nprint(eg_h)" % route)
        c = reply["content"]
        assert c["status"] == "error" and c["ename"] == "StoreUnavailable", c
        assert "without its data" in c["evalue"] and "eg_g" in c["evalue"] and "eg_h" in c["evalue"], c
        # Once told, the session goes on: the lost names are gone, new ones work on both sides.
        reply, _ = execute(k, "%%%%%s\nprint(eg_h)" % route)
        assert reply["content"]["ename"] == "NameError", reply["content"]
        run_route(k, "eg_h = torch.zeros(1)", "gpu")
        _, msgs = run_route(k, "%%cpu\nprint(eg_h)", "cpu")
        assert stream_text(msgs) == "tensor([0.])\n"
    finally:
        k.stop()


@pytest.mark.parametrize("where", ["kernel", "prepare", "save"])
def test_interrupt_ends_a_wait_for_a_silent_store(fk_slow_guard, where):
    """Redis stopped while the kernel commits before a GPU cell, while its worker restores (fault
    stop_redis@prepare) or while it saves (stop_redis@save): an interrupt ends the wait at once (the guard
    would kill the server only after half the timeout) and nothing of the cell is committed."""
    fk = fk_slow_guard
    run_route(fk, "fs_i = fs_t * 0 + 1", "gpu")
    md = None
    if where == "kernel":
        # A value the kernel commits at the GPU cell's Run (not quick to save: no idle commit of it).
        run_route(fk, "fs_cpu = {'v': [5]}", "cpu")
        pid = redis_pid(fk.store)
        os.kill(pid, signal.SIGSTOP)
        code = "print(fs_cpu['v'][0] + fs_i.sum().item())"
    else:
        pid = redis_pid(fk.store)
        md = {"looseleaf_fault": "stop_redis@" + where}
        code = "fs_i.add_(1)\nprint('added', flush=True)"
    try:
        msg_id = send_execute(fk, code, md)
        if where == "save":  # the cell's code ran: what stalls now is its save
            fk.iopub_next(msg_id, lambda m: m["msg_type"] == "stream" and "added" in m["content"]["text"],
                          timeout=60)
        time.sleep(0.5)
        t0 = time.monotonic()
        fk.km.interrupt_kernel()
        reply = fk.reply(msg_id, timeout=60)
        took = time.monotonic() - t0
        fk.iopub_until_idle(msg_id, 60)
    finally:
        _resume(pid)
    c = reply["content"]
    assert c["status"] == "error" and c["ename"] == "KeyboardInterrupt", c
    assert took < INTERRUPT_TIMEOUT_S / 2, took
    # Interrupted in its save, the cell had run: nothing of it is committed, but its worker keeps what it
    # made and changed as their home (as in ipykernel, where an interrupt after the code ran changes
    # nothing).  Interrupted before it ran, the cell changed nothing.
    _, msgs = run_route(fk, "print(fs_i.sum().item())", "gpu")
    assert stream_text(msgs) == ("8.0\n" if where == "save" else "4.0\n")
    run_route(fk, "fs_i = fs_t * 0 + 1", "gpu")  # the module's next test starts from the committed state


@pytest.fixture(scope="module")
def small_pool():
    """A kernel whose payload pool holds 32 regions of 2 MiB (64 MiB)."""
    with gpu_kernel("import torch\npf_small = torch.ones(4)", env={"LL_STORE_POOL_BYTES": str(64 << 20)}) as k:
        yield k


def test_pool_full_a_cell_is_saved_whole_or_not_at_all(small_pool):
    k = small_pool
    # 8 MiB fits, 56 MiB does not fit next to it: the save fails after the first took its regions.
    reply, msgs = execute(k, "pf_a = torch.ones(2 << 20)\npf_big = torch.ones(14 << 20)\nprint('ran')")
    c = reply["content"]
    assert ll_md(reply)["route"] == "gpu"
    assert stream_text(msgs) == "ran\n"  # the cell's code ran...
    assert c["status"] == "error" and c["ename"] == "PoolFullError", c  # ...but its results are not saved
    assert "pf_big" in c["evalue"] and "pf_a" in c["evalue"] and "nothing of this cell" in c["evalue"], c
    errors = [m["content"] for m in msgs if m["msg_type"] == "error"]
    assert [e["ename"] for e in errors] == ["PoolFullError"], errors
    # All or nothing in the store: pf_a was not committed either, the older variables are intact.  The worker
    # holds the only copy of both, so it stays as their home (README "Failure model"): a
    # later cell reading them runs there, whatever its label, and sees them.
    md = ll_md(reply)
    assert md["home"]["pf_a"]["what"] == "not saved: PoolFullError" and "pf_big" in md["home"], md
    home = md["worker_pid"]
    reply, msgs = execute(k, "print(int(pf_a.sum()), int(pf_big.sum()))")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stream_text(msgs) == "%d %d\n" % (2 << 20, 14 << 20)
    assert ll_md(reply)["worker_pid"] == home, ll_md(reply)
    _, msgs = run_route(k, "print(pf_small.sum().item())", "gpu")
    assert stream_text(msgs) == "4.0\n"
    # Bound again to what fits, they are saved and the worker is no home for them any more.
    reply, _ = run_route(k, "pf_a = torch.ones(4)\ndel pf_big", "gpu")
    assert "pf_a" not in ll_md(reply).get("home", {}) and "pf_big" not in ll_md(reply).get("home", {})
    # What the failed save took came back: a value that fits only then is saved.
    run_route(k, "pf_c = torch.ones(10 << 20)", "gpu")
    _, msgs = run_route(k, "print(pf_c.sum().item())", "gpu")
    assert stream_text(msgs) == "10485760.0\n"


def test_shutdown_leaves_nothing_behind():
    """Even after its redis-server was killed, a kernel that shuts down leaves no pool in /dev/shm, no
    store directory and no redis-server."""
    k = FaultKernel()
    try:
        run_route(k, "import torch\nsd_t = torch.ones(300, 1000)", "gpu")
        d = store_of(k.pid)
        session = owner_of(d)[1]
        os.kill(redis_pid(d), signal.SIGKILL)
        run_route(k, "sd_t += 1", "gpu")
        assert not pool_files(session), pool_files(session)
    finally:
        k.stop()
    wait_for(lambda: not os.path.exists(d), 30, "the store dir to go")
    assert not redis_processes(d) and not pool_files(session) and not pool_holders(session)


def test_a_killed_kernel_leaves_no_redis_and_no_pool():
    k = FaultKernel()
    try:
        run_route(k, "import torch\nkk_t = torch.ones(300, 1000)", "gpu")
        d = store_of(k.pid)
        session = owner_of(d)[1]
        os.kill(k.pid, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: not redis_processes(d) and not pool_holders(session), 10,
                 "the killed kernel's redis-server and pool to go")
        assert time.monotonic() - t0 < 5
        assert not pool_files(session)
    finally:
        k.stop()


def test_sweep_is_not_fooled_by_a_recycled_pid(fk):
    """A store dir whose owner file names a live pid that is another process (another start time) is the
    store of a dead kernel: the next kernel to open a store removes it."""
    base = next(d for d in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm", tempfile.gettempdir())
                if d and os.path.isdir(d) and os.access(d, os.W_OK))
    fake = tempfile.mkdtemp(prefix="looseleaf-store-", dir=base)
    with open(os.path.join(fake, "owner"), "w") as f:
        f.write("%d %s %d\n" % (os.getpid(), "recycledpid0000", 1))  # our pid, never our start time
    k = FaultKernel()
    try:
        run_route(k, "import torch\nrp_t = torch.ones(2)", "gpu")  # opens its store: sweeps
        wait_for(lambda: not os.path.exists(fake), 30, "the dead kernel's store to be swept")
    finally:
        k.stop()

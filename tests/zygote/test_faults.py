"""Faults: a worker SIGKILLed while it executes, restores or saves (the last committed versions stay, the error
names the signal); the base zygote killed (respawned); a client that dies (others undisturbed); slots
exhausted (the wait is reported); interrupt of a running worker cell; input() through the client; several
clients sharing one pool; a multi-threaded zygote refuses to fork; the pool exits when idle."""
import os
import signal
import subprocess

from zyghelp import pid_alive, wait_for


def _started(c, cid):
    while True:
        ev = c.next()
        if ev.get("id") == cid and ev["type"] == "started":
            return ev
        assert ev["type"] not in ("reply", "error"), ev


def _executing(c, cid):
    """Wait until cell CID's code runs (its execute_input): a worker killed before that was only preparing
    it, and the pool gives the cell a fresh worker once (issue 16)."""
    while True:
        ev = c.next()
        if ev.get("id") == cid and ev["type"] == "iopub" and ev.get("msg_type") == "execute_input":
            return ev
        assert ev["type"] not in ("reply", "error"), ev


def _setup_x(c):
    r = c.run("x0", "x = 1", defines=["x"])
    assert r.ok, r.events


def test_sigkill_during_execution(env):
    c = env.client()
    _setup_x(c)
    c.submit("k", "x = 2\nimport time\nwhile True: time.sleep(0.01)", defines=["x"], state_closure=["x"])
    pid = _started(c, "k")["pid"]
    _executing(c, "k")
    os.kill(pid, signal.SIGKILL)
    r = c.collect("k")[-1]
    assert r["content"]["status"] == "error"
    assert "SIGKILL" in r["content"]["evalue"] and str(pid) in r["content"]["evalue"]
    r2 = c.run("after", "print(x)", state_closure=["x"])
    assert r2.stdout == "1\n"


def test_sigkill_during_restore_and_save(env):
    c = env.client()
    _setup_x(c)
    r = c.run("r", "x = 5", state_closure=["x"], defines=["x"], fault="restore")
    assert r.content["status"] == "error" and "SIGKILL" in r.content["evalue"], r.events
    r = c.run("s", "x = 6\nprint('ran')", state_closure=["x"], defines=["x"], fault="save")
    assert r.stdout == "ran\n"
    assert r.content["status"] == "error" and "SIGKILL" in r.content["evalue"], r.events
    # Neither commit landed: the session goes on from x = 1, and saving works again.
    r = c.run("t", "x += 10\nprint(x)", state_closure=["x"], defines=["x"])
    assert r.stdout == "11\n" and r.ok
    assert c.run("u", "print(x)", state_closure=["x"]).stdout == "11\n"


def test_base_zygote_killed_is_respawned(env):
    c = env.client()
    _setup_x(c)
    base = [n for n in c.stats()["nodes"] if n["parent"] == -1][0]
    os.kill(base["pid"], signal.SIGKILL)
    wait_for(lambda: c.stats()["base_respawns"] == 1, 30, "respawn")
    r = c.run("after", "print(x)", state_closure=["x"])
    assert r.stdout == "1\n", r.events
    nodes = c.stats()["nodes"]
    assert [n for n in nodes if n["parent"] == -1][0]["pid"] != base["pid"]


def test_slots_exhausted_wait_is_reported(env):
    c = env.client(slots=1)
    go = os.path.join(env.tmp, "go")
    c.submit("long", "import os, time\nwhile not os.path.exists(%r): time.sleep(0.01)" % go)
    _started(c, "long")
    c.submit("next", "print('second')")
    ev = c.next()
    assert ev["type"] == "wait" and ev["id"] == "next" and ev["slots"] == 1, ev
    open(go, "w").close()
    assert c.collect("long")[-1]["content"]["status"] == "ok"
    r = c.collect("next")
    assert r[-1]["content"]["status"] == "ok"
    assert r[-1]["metadata"]["looseleaf"]["wait_ms"] > 0


def test_interrupt_keeps_state_before_it(env):
    c = env.client()
    c.submit("i", "y = 7\nprint('looping', flush=True)\nimport time\nwhile True: time.sleep(0.01)",
             defines=["y"])
    while c.next().get("type") != "stream":
        pass
    c.send(op="interrupt", id="i")
    r = c.collect("i")[-1]
    assert r["content"]["status"] == "error" and r["content"]["ename"] == "KeyboardInterrupt", r
    assert c.run("j", "print(y)", state_closure=["y"]).stdout == "7\n"


def test_interrupt_before_the_cell_starts_is_not_lost(env):
    c = env.client()
    c.submit("i0", "import time\nwhile True: time.sleep(0.01)")
    _started(c, "i0")  # the worker may still be restoring: the interrupt waits for the cell
    c.send(op="interrupt", id="i0")
    r = c.collect("i0")[-1]
    assert r["content"]["ename"] == "KeyboardInterrupt", r


def test_input_through_the_client(env):
    c = env.client()
    c.submit("in", "name = input('who? ')\nprint('hi', name)", allow_stdin=True, defines=["name"])
    while True:
        ev = c.next()
        if ev["type"] == "input_request":
            break
        assert ev["type"] not in ("reply", "error"), ev
    assert ev["prompt"] == "who? "
    c.send(op="input", id="in", value="ada")
    cell = c.collect("in")
    assert "".join(e.get("text", "") for e in cell if e["type"] == "stream") == "hi ada\n"


def test_clients_share_one_pool_and_a_dying_client_disturbs_no_other(env):
    a = env.client()
    b = env.client()
    assert a.stats()["pid"] == b.stats()["pid"]
    a.submit("la", "import time\nwhile True: time.sleep(0.01)")
    pid = _started(a, "la")["pid"]
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: not pid_alive(pid), 30, "the dead client's worker to be killed")
    r = b.run("b1", "z = 3\nprint(z)", defines=["z"])
    assert r.stdout == "3\n"


def test_multithreaded_zygote_refuses_to_fork(env):
    mods = os.path.join(env.tmp, "mods")
    os.makedirs(mods)
    with open(os.path.join(mods, "llz_threads.py"), "w") as f:
        f.write("import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    env.environ["PYTHONPATH"] = mods
    c = env.client(head="IPython,looseleaf_kernel,looseleaf_store,llz_threads")
    r = c.run("t", "print(1)")
    assert r.content["status"] == "error" and r.content["ename"] == "ZygoteRefused"
    assert "not single-threaded (2 threads)" in r.content["evalue"]
    assert "refusing to fork" in env.log()


def test_pool_exits_when_idle(env):
    c = env.client(idle_exit=1)
    assert c.run("a", "1").ok
    pid = env.pool_pid
    c.close()
    wait_for(lambda: not pid_alive(pid), 30, "idle pool exit")
    assert not os.path.exists(os.path.join(env.pool_dir, "pool.sock"))


def test_worker_outlives_its_dead_zygote_and_its_fate_is_still_reported(env):
    c = env.client()
    go = os.path.join(env.tmp, "go")
    base = [n for n in c.stats()["nodes"] if n["parent"] == -1][0]
    c.submit("w1", "import os, time\nv = 1\nwhile not os.path.exists(%r): time.sleep(0.01)\nprint('done')" % go,
             defines=["v"])
    _started(c, "w1")
    c.submit("w2", "import time\nwhile True: time.sleep(0.01)")
    pid2 = _started(c, "w2")["pid"]
    os.kill(base["pid"], signal.SIGKILL)
    wait_for(lambda: c.stats()["base_respawns"] == 1, 30, "respawn")
    # The pool reaps the orphaned workers (child subreaper): a finished cell replies, a killed one is named.
    open(go, "w").close()
    r1 = c.collect("w1")[-1]
    assert r1["content"]["status"] == "ok", r1
    os.kill(pid2, signal.SIGKILL)
    r2 = c.collect("w2")[-1]
    assert "SIGKILL" in r2["content"]["evalue"], r2
    assert c.run("w3", "print(v)", state_closure=["v"]).stdout == "1\n"


def test_a_base_zygote_that_cannot_start_is_retried_with_back_off(env):
    # It fails three times in a row, then the pool answers cells at once (marked "unavailable": nothing ran,
    # so their kernels run them themselves) and tries again after 2 s, 4 s, ...; once what broke it mends,
    # the base comes back and cells run on workers again.  The pool never stays broken until it exits.
    mods = os.path.join(env.tmp, "mods")
    os.makedirs(mods)
    mended = os.path.join(env.tmp, "mended")
    with open(os.path.join(mods, "llz_exit.py"), "w") as f:
        f.write("import os\nif not os.path.exists(%r):\n    os._exit(3)\n" % mended)
    env.environ["PYTHONPATH"] = mods
    c = env.client(head="IPython,llz_exit")
    r = c.run("x", "print(1)")
    assert r.content["ename"] == "ZygoteUnavailable", r.content
    assert r.ll.get("unavailable") is True, r.ll
    st = c.stats()
    assert st["base_broken"] and st["base_respawns"] >= 2
    r = c.run("y", "print(1)")
    assert r.content["ename"] == "ZygoteUnavailable" and r.ll.get("unavailable") is True
    wait_for(lambda: "trying the base zygote again" in env.log(), 30, "a retry after back-off")
    open(mended, "w").close()
    wait_for(lambda: not c.stats()["base_broken"], 90, "the base zygote back")
    assert "the base zygote is back" in env.log()
    assert c.run("z", "print(2)").stdout == "2\n"


def _head_module(env, name, code):
    mods = os.path.join(env.tmp, "mods")
    os.makedirs(mods, exist_ok=True)
    with open(os.path.join(mods, name + ".py"), "w") as f:
        f.write(code)
    env.environ["PYTHONPATH"] = mods
    return mods


def _stub_driver(env, mods):
    """The stub CUDA driver (tests/cudastub/cudastub.c) built as MODS/libcuda.so.1, recording its calls."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cudastub", "cudastub.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-std=c11", "-D_GNU_SOURCE", "-Wl,-soname,libcuda.so.1", "-o",
                    os.path.join(mods, "libcuda.so.1"), src, "-lpthread"], check=True)
    env.environ["LL_CUDA_STUB_LOG"] = os.path.join(env.tmp, "cuda-calls.log")


def test_zygote_with_the_cuda_driver_mapped_but_not_initialised_forks(env):
    # What a CUDA build of torch does at import (cuBLASLt, cuSPARSELt): the driver mapped, never called.
    mods = _head_module(env, "llz_fakecuda", "import ctypes, os\n"
                        "LIB = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libcuda.so.1'))\n")
    _stub_driver(env, mods)
    c = env.client(head="IPython,looseleaf_kernel,looseleaf_store,llz_fakecuda")
    r = c.run("t", "print(1)")
    assert r.ok and r.stdout == "1\n", r.events
    with open(env.environ["LL_CUDA_STUB_LOG"]) as f:
        assert "cuInit" not in f.read()


def test_zygote_that_initialised_the_cuda_driver_refuses_to_fork(env):
    mods = _head_module(env, "llz_fakecuda", "import ctypes, os\n"
                        "LIB = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libcuda.so.1'))\n"
                        "LIB.cuInit(0)\n")
    _stub_driver(env, mods)
    c = env.client(head="IPython,looseleaf_kernel,looseleaf_store,llz_fakecuda")
    r = c.run("t", "print(1)")
    assert r.content["ename"] == "ZygoteRefused", r.events
    assert "initialised the CUDA driver" in r.content["evalue"], r.content


def test_zygote_holding_a_foreign_descriptor_refuses_to_fork(env):
    _head_module(env, "llz_pipe", "import os\nR, W = os.pipe()\n")
    c = env.client(head="IPython,looseleaf_kernel,looseleaf_store,llz_pipe")
    r = c.run("t", "print(1)")
    assert r.content["ename"] == "ZygoteRefused"
    assert "unexpected descriptor" in r.content["evalue"] and "pipe:" in r.content["evalue"], r.content


def test_pool_killed_clients_are_told_and_a_new_pool_starts(env):
    c = env.client()
    c.submit("p", "import time\nwhile True: time.sleep(0.01)")
    worker = _started(c, "p")["pid"]
    zygotes = [n["pid"] for n in c.stats()["nodes"]]
    old = env.pool_pid
    os.kill(old, signal.SIGKILL)
    ev = c.next()
    while ev["type"] not in ("pool_gone", "eof"):
        ev = c.next()
    assert ev["type"] == "pool_gone"
    # Nothing of the dead pool lives on: its zygotes and its worker end.
    for pid in zygotes + [worker]:
        wait_for(lambda: not pid_alive(pid), 30, "process %d of the dead pool to end" % pid)
    env.pool_pid = None
    c2 = env.client()
    assert env.pool_pid != old
    assert c2.run("q", "print(3)").stdout == "3\n"


def test_interrupt_and_cancel_sent_right_after_submit_are_not_lost(env):
    c = env.client()
    c.submit("i1", "import time\nwhile True: time.sleep(0.01)")
    c.send(op="interrupt", id="i1")
    r = c.collect("i1")[-1]
    assert r["content"]["ename"] == "KeyboardInterrupt", r
    c.submit("c1", "import time\nwhile True: time.sleep(0.01)")
    c.send(op="cancel", id="c1")
    r = c.collect("c1")[-1]
    assert r["content"]["ename"] == "Cancelled", r
    assert c.run("after", "print(4)").stdout == "4\n"


def test_the_pool_survives_its_binary_removed_on_disk(env):
    # A rebuild replaces or removes the binary a pool (and the kernel that started it) runs from: the pool
    # still respawns its base zygote, from the inode that runs (/proc/self/exe).
    import shutil
    copy = os.path.join(env.tmp, "looseleaf-copy")
    shutil.copy2(env.environ["LL_POOL_EXE"], copy)
    env.environ["LL_POOL_EXE"] = copy
    c = env.client()
    _setup_x(c)
    os.unlink(copy)
    base = [n for n in c.stats()["nodes"] if n["parent"] == -1][0]
    os.kill(base["pid"], signal.SIGKILL)
    wait_for(lambda: c.stats()["base_respawns"] == 1, 30, "respawn")
    r = c.run("after", "print(x)", state_closure=["x"])
    assert r.stdout == "1\n", r.events
    assert not c.stats()["base_broken"]

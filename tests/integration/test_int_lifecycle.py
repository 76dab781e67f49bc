"""shutdown_request (with and without restart) on the control channel, and
jupyter_client's restart: the process goes, the state with it, and the new
kernel answers."""
import time

from itest_util import Kernel, of_type


def _wait_exit(k, timeout=20):
    proc = k.km.provisioner.process
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "%s: process still alive %ss after shutdown" % (k.name, timeout)
        time.sleep(0.05)  # polling the process for the exit condition
    return proc.returncode


def test_shutdown(fresh_kernel):
    k = fresh_kernel
    msg_id = k.send("shutdown_request", {"restart": False}, channel="control")
    reply = k.reply(msg_id, channel="control")
    assert reply["msg_type"] == "shutdown_reply"
    assert reply["content"]["restart"] is False
    assert reply["content"].get("status", "ok") == "ok"
    if k.name == "looseleaf":
        assert reply["content"]["status"] == "ok"
    assert _wait_exit(k) == 0


def test_shutdown_with_restart_flag(fresh_kernel):
    """A shutdown_request with restart=True is answered with restart=True and
    the process exits (the manager starts the new one)."""
    k = fresh_kernel
    msg_id = k.send("shutdown_request", {"restart": True}, channel="control")
    reply = k.reply(msg_id, channel="control")
    assert reply["content"]["restart"] is True
    assert _wait_exit(k) == 0


def test_restart_kernel(fresh_kernel):
    k = fresh_kernel
    k.run_ok("survivor = 42")
    assert k.eval_text("survivor") == "42"
    old_pid = k.pid
    k.km.restart_kernel(now=False)
    k.connect()
    assert k.pid != old_pid
    reply, msgs = k.execute("survivor")
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "NameError"
    reply, msgs = k.execute("1 + 1")
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["execution_count"] == 2
    assert of_type(msgs, "execute_result")[0]["content"]["data"]["text/plain"] == "2"


def test_shutdown_while_busy_by_manager(fresh_kernel):
    """jupyter_client's shutdown of a kernel stuck in a long cell still ends it."""
    k = fresh_kernel
    k.send("execute_request", {"code": "import time\ntime.sleep(60)", "silent": False,
                               "store_history": True, "user_expressions": {}, "allow_stdin": False})
    k.km.shutdown_kernel(now=False)
    assert not k.km.is_alive()


def test_crash_then_restart(fresh_kernel):
    """A cell that kills the kernel process (a C extension crashing, here a
    deliberate segfault) ends it; the manager's restart brings up a working
    kernel, as with ipykernel."""
    k = fresh_kernel
    k.run_ok("before_crash = 1")
    k.send("execute_request", {"code": "import ctypes\nctypes.string_at(0)", "silent": False,
                               "store_history": True, "user_expressions": {}, "allow_stdin": False})
    code = _wait_exit(k)
    assert code != 0
    assert not k.km.is_alive()
    k.km.restart_kernel(now=True)
    k.connect()
    assert k.eval_text("'back'") == "'back'"
    reply, _ = k.execute("before_crash")
    assert reply["content"]["ename"] == "NameError"


def test_os_exit_in_cell(fresh_kernel):
    k = fresh_kernel
    k.send("execute_request", {"code": "import os\nos._exit(7)", "silent": False, "store_history": True,
                               "user_expressions": {}, "allow_stdin": False})
    assert _wait_exit(k) == 7


def _group_members(pgid):
    """Pids of live (non-zombie) processes in process group PGID."""
    import os
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[2] the process group.
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


def test_shutdown_leaves_no_processes(fresh_kernel):
    """jupyter_client starts the kernel in a session of its own; after a
    shutdown nothing of that process group is left running (children the
    kernel or the cells started included)."""
    k = fresh_kernel
    pgid = k.pid
    k.run_ok("import subprocess\n_child = subprocess.Popen(['sleep', '300'])")
    assert len(_group_members(pgid)) >= 2
    k.km.shutdown_kernel(now=False)
    deadline = time.monotonic() + 30
    while _group_members(pgid):
        assert time.monotonic() < deadline, "left running: %s" % _group_members(pgid)
        time.sleep(0.05)  # polling /proc

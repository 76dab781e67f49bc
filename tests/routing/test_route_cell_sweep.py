"""A starting kernel removes the cell directories (<tmp>/looseleaf_<pid>, where the kernel and its workers
write cell sources for tracebacks) of kernels that died without shutting down: CellCompiler.sweep in
kernel/py/looseleaf_kernel/shell.py.  A kernel killed but not yet reaped by its parent is a zombie: its pid
is still in /proc, yet it is dead and its directory must go, as coherence.pid_alive has it for the stores.

Runs in the pytest process; the kernel gets a private TMPDIR, so the directories it sees are the test's.
"""
import os
import shutil
import subprocess
import tempfile

from routehelp import Kernel, execute, wait_for
from llpool_util import alive  # noqa: E402  (routehelp put tests/ on sys.path)


def _cell_dir(tmp, pid, mode=0o700):
    path = os.path.join(tmp, "looseleaf_%d" % pid)
    os.mkdir(path, mode)
    os.chmod(path, mode)  # whatever the umask
    with open(os.path.join(path, "cells.tsv"), "w") as f:
        f.write("1\t%s\n" % os.path.join(path, "1.py"))
    return path


def test_starting_kernel_sweeps_cell_dirs_of_dead_and_zombie_pids(jupyter_env):
    tmp = tempfile.mkdtemp(prefix="ll-sweep-")
    zombie = subprocess.Popen(["/bin/true"])   # exits at once; not waited for until the end: a zombie
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()                                  # reaped: its pid is gone from /proc
    living = subprocess.Popen(["/bin/sleep", "300"])
    k = None
    try:
        wait_for(lambda: os.path.exists("/proc/%d" % zombie.pid) and not alive(zombie.pid), 30,
                 "pid %d to be a zombie" % zombie.pid)
        assert not os.path.exists("/proc/%d" % dead.pid)
        swept = {"zombie": _cell_dir(tmp, zombie.pid), "dead": _cell_dir(tmp, dead.pid)}
        kept = {"living": _cell_dir(tmp, living.pid),
                # a dead pid's directory that others can write is not one of ours: left alone
                "not private": _cell_dir(tmp, _unused_pid(), 0o755)}

        k = Kernel("looseleaf", env={"TMPDIR": tmp})
        # The sweep runs as the kernel starts, before it serves a request; one reply proves it is done.
        reply, _ = execute(k, "1")
        assert reply["content"]["status"] == "ok", reply["content"]
        left = {what for what, path in swept.items() if os.path.exists(path)}
        assert not left, "cell directories of %s pids not swept" % sorted(left)
        gone = {what for what, path in kept.items() if not os.path.exists(path)}
        assert not gone, "cell directories of %s removed" % sorted(gone)
    finally:
        if k is not None:
            k.stop()
        living.kill()
        living.wait()
        zombie.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _unused_pid():
    """A pid with no process (reaped at once)."""
    p = subprocess.Popen(["/bin/true"])
    p.wait()
    return p.pid

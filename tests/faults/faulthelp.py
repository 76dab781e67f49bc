"""Helpers of the fault-injection suite (tests/faults/, issue 16): a looseleaf kernel on a host pool of its
own (so the pool's and the workers' environment is the kernel's: a short store timeout, a small pool), the
processes and files a kernel's checkpoint store consists of (its store directory, redis-server, pool), and
zombies.  Builds on tests/routing/routehelp.py.  Runs in the pytest process; every wait polls a condition
with a deadline.
"""
import contextlib
import glob
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "routing")]

from routehelp import (GPU_TIMEOUT, Kernel, alive, execute, ll_md, owner_of, redis_processes,  # noqa: E402,F401
                       run_route, send_execute, stop_pool, store_dirs_of, stream_text, wait_for)


class FaultKernel(Kernel):
    """A looseleaf kernel with the fault hook on (LOOSELEAF_TEST_FAULTS=1), ENV added to its environment.
    With POOL_DIR, on a host pool of its own there (stopped with the kernel), which sees ENV too (a store
    timeout for its workers, a fault that kills the pool); without, on the run's shared pool."""

    def __init__(self, pool_dir=None, env=None, name="looseleaf"):
        self.pool_dir = pool_dir
        base = {"LOOSELEAF_TEST_FAULTS": "1"}
        if pool_dir:
            base.update(LOOSELEAF_POOL_DIR=pool_dir, LL_POOL_WARM_IDLE_S="300")
        super().__init__(name, env=dict(base, **(env or {})))
        self.store = None  # the store dir, once known (store_of)

    def stop(self):
        try:
            super().stop()
        finally:
            if self.pool_dir:
                stop_pool(self.pool_dir)
                shutil.rmtree(os.path.dirname(self.pool_dir), ignore_errors=True)  # (new_pool_dir's)


@contextlib.contextmanager
def gpu_kernel(first_cell, pool_dir=None, env=None):
    """A FaultKernel (POOL_DIR, ENV: as there) that has run FIRST_CELL on a worker, so its store and worker are
    up; stopped when the block ends (the body of a module's kernel fixture)."""
    k = FaultKernel(pool_dir, env)
    try:
        run_route(k, first_cell, "gpu")
        yield k
    finally:
        k.stop()


def new_pool_dir():
    return os.path.join(tempfile.mkdtemp(prefix="llf-"), "pool")


def store_of(pid):
    """The store dir of the kernel PID (asserted: exactly one)."""
    dirs = store_dirs_of(pid)
    assert len(dirs) == 1, "store dirs of kernel %d: %s" % (pid, dirs)
    return dirs[0]


def redis_pid(d):
    """The pid of the redis-server serving store dir D (from its pid file), or None."""
    try:
        with open(os.path.join(d, "redis.pid")) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def zombies_of(pid):
    """Children of PID that exited and were not reaped (<defunct>)."""
    out = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % child) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            out.append(int(child))
    return out


def pool_files(session):
    """Files in /dev/shm of the payload pool of SESSION (a pool with a name: there should be none)."""
    return glob.glob("/dev/shm/looseleaf-%d-*-%s.pool" % (os.getuid(), session))


def pool_holders(session):
    """pids of live processes that map the payload pool of SESSION (named or not): while there are none, its
    memory is free."""
    name = "-%s.pool" % session
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/maps" % pid) as f:
                if any(name in line for line in f):
                    out.append(int(pid))
        except OSError:
            continue
    return out

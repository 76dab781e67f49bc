"""The host pool is a daemon (issue 23, part 2): it keeps nothing of the kernel that happened to start it.

A kernel whose working directory is a temporary one (a notebook opened and closed, `nbconvert --execute` or
papermill in a temporary directory) starts the pool, shuts down, and the directory goes.  The pool must not
have kept it as its working directory (its base zygote could not start again, and every GPU cell of every
later kernel of the user failed with ZygoteUnavailable); nor the starting kernel's environment, standard
streams or umask.  Each session's own cwd and environment still reach its cells on workers."""
import contextlib
import os
import shutil
import signal
import tempfile

from faulthelp import FaultKernel, new_pool_dir, run_route, stop_pool, stream_text, wait_for
from llpool_util import pool_pids

# A GPU-labelled cell (it imports torch) that says where it runs and what it sees.
PROBE = ("%%gpu\nimport os\n"
         "print(os.getcwd(), os.environ.get('LL_DAEMON_PROBE'), os.environ.get('DAEMON_SESSION_VAR'),"
         " oct(os.umask(0o022)))")


@contextlib.contextmanager
def kernel_in(cwd, pool_dir, env=None):
    """A FaultKernel started with CWD as its working directory, on POOL_DIR's pool (not stopped with it)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        k = FaultKernel(env=dict(LOOSELEAF_POOL_DIR=pool_dir, **(env or {})))
    finally:
        os.chdir(old)
    try:
        yield k
    finally:
        k.stop()


def _status_field(pid, name):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split()[1]
    return None


def _environ(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)


def test_a_pool_outlives_the_directory_of_the_kernel_that_started_it():
    pool_dir = new_pool_dir()
    first = tempfile.mkdtemp(prefix="ll-daemon-cwd-")
    second = tempfile.mkdtemp(prefix="ll-daemon-cwd2-")
    old_umask = os.umask(0o027)  # the starting kernel's umask, which the pool must not keep
    try:
        with kernel_in(first, pool_dir, env={"DAEMON_SESSION_VAR": "first", "LL_DAEMON_PROBE": "x"}) as k:
            os.umask(old_umask)
            _, msgs = run_route(k, PROBE, "gpu")
            # The session's cwd, environment and umask reach its cell on the worker.
            assert stream_text(msgs).split() == [os.path.realpath(first), "x", "first", "0o27"], msgs
            [pool] = pool_pids(pool_dir)
            # The daemon itself keeps none of it.
            assert os.readlink("/proc/%d/cwd" % pool) == "/"
            env = _environ(pool)
            assert b"DAEMON_SESSION_VAR" not in env and b"PWD" not in env, sorted(env)
            assert b"LL_DAEMON_PROBE" in env  # (what configures LooseLeaf does reach it)
            assert _status_field(pool, "Umask") == "0022"
            for fd in (1, 2):
                assert os.readlink("/proc/%d/fd/%d" % (pool, fd)) == os.path.join(pool_dir, "pool.log")
        shutil.rmtree(first)
        # The base zygote goes (a crash, an OOM kill): the pool starts it again although the first kernel's
        # directory is gone, and the next kernel's GPU cells run on workers.
        bases = [p for p in _children(pool) if "zygote" in _cmd(p)]
        for p in bases:
            os.kill(p, signal.SIGKILL)
        with kernel_in(second, pool_dir, env={"DAEMON_SESSION_VAR": "second"}) as k2:
            reply, msgs = run_route(k2, PROBE, "gpu")
            assert stream_text(msgs).split()[:3] == [os.path.realpath(second), "None", "second"], msgs
            reply, msgs = run_route(k2, "import torch\nprint(torch.ones(2).sum().item())", "gpu")
            assert stream_text(msgs).strip() == "2.0"
    finally:
        os.umask(old_umask)
        stop_pool(pool_dir)
        shutil.rmtree(os.path.dirname(pool_dir), ignore_errors=True)
        shutil.rmtree(first, ignore_errors=True)
        shutil.rmtree(second, ignore_errors=True)


def _children(pid):
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % p) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _cmd(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_a_gpu_cell_runs_in_the_kernel_while_the_base_zygote_cannot_start():
    # The pool's base zygote cannot start (here: a head module that exits until a file exists).  A GPU cell
    # then runs in the kernel with one line saying why, never fails for the pool's state; once the cause
    # mends the pool's retry brings the base back, and GPU cells run on workers again.
    pool_dir = new_pool_dir()
    tmp = os.path.dirname(pool_dir)
    mods = os.path.join(tmp, "mods")
    os.makedirs(mods)
    mended = os.path.join(tmp, "mended")
    with open(os.path.join(mods, "llf_exit.py"), "w") as f:
        f.write("import os\nif not os.path.exists(%r):\n    os._exit(3)\n" % mended)
    env = {"PYTHONPATH": mods, "LL_POOL_HEAD": "numpy,torch,IPython,looseleaf_kernel,looseleaf_store,llf_exit"}
    try:
        with kernel_in(tmp, pool_dir, env=env) as k:
            reply, msgs = run_route(k, "%%gpu\nx = 41\nprint(x + 1)", "cpu")
            err = stream_text(msgs, "stderr")
            notice = [line for line in err.splitlines() if line.startswith("LooseLeaf:")]
            assert len(notice) == 1 and "base zygote" in notice[0] and "runs in the kernel" in notice[0], err
            assert stream_text(msgs) == "42\n"
            md = reply["metadata"]["looseleaf"]
            assert "base zygote" in md.get("fallback", ""), md
            log = os.path.join(pool_dir, "pool.log")
            wait_for(lambda: "trying the base zygote again" in open(log).read(), 60, "a retry: %s" % open(log).read()[-3000:])
            open(mended, "w").close()
            wait_for(lambda: "the base zygote is back" in open(log).read(), 120, "the base back")
            _, msgs = run_route(k, "%%gpu\nprint(x + 2)", "gpu")
            assert stream_text(msgs).strip() == "43"
    finally:
        stop_pool(pool_dir)
        shutil.rmtree(tmp, ignore_errors=True)


def test_what_a_gpu_cell_started_in_its_own_session_ends_with_the_kernel():
    # Out of its worker's process group, such a process outlived the worker's
    # eviction, the kernel's shutdown and the pool.  Now it goes with the worker.
    import random
    pool_dir = new_pool_dir()
    tag = "1000.%d" % random.randint(10 ** 7, 10 ** 8 - 1)
    try:
        with kernel_in(os.path.dirname(pool_dir), pool_dir) as k:
            code = "import subprocess\nprint(subprocess.Popen(['sleep', %r], start_new_session=True).pid)" % tag
            _, msgs = run_route(k, "%%gpu\n" + code, "gpu")
            pid = int(stream_text(msgs))
            assert _cmd(pid).split("\0")[:2] == ["sleep", tag]
        wait_for(lambda: _cmd(pid).split("\0")[:2] != ["sleep", tag], 60, "the sleep to end with the kernel")
        assert pool_pids(pool_dir)  # (the pool itself serves on)
    finally:
        stop_pool(pool_dir)
        shutil.rmtree(os.path.dirname(pool_dir), ignore_errors=True)


def test_a_kernel_refuses_a_pool_of_another_build_and_says_so():
    # A dir both builds name (LOOSELEAF_POOL_DIR) holds a pool of another build (here: a copy of the binary with
    # other bytes): the kernel does not use it; its GPU cells run in the kernel, with one line naming both.
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(repo, "tests"))
    from llpool_util import PoolClient
    pool_dir = new_pool_dir()
    tmp = os.path.dirname(pool_dir)
    other = os.path.join(tmp, "looseleaf")
    shutil.copy2(os.path.join(repo, "build", "looseleaf"), other)
    with open(other, "ab") as f:
        f.write(b"\0")
    driver = os.path.join(repo, "build", "zygote", "ll_zdriver")
    c = PoolClient(driver, pool_dir, ["--slots", "1", "--head", "IPython"], env=dict(os.environ, LL_POOL_EXE=other))
    try:
        c.stats()
        with kernel_in(tmp, pool_dir) as k:
            reply, msgs = run_route(k, "%%gpu\nprint(6 * 7)", "cpu")
            assert stream_text(msgs) == "42\n"
            notice = [line for line in stream_text(msgs, "stderr").splitlines() if line.startswith("LooseLeaf:")]
            assert len(notice) == 1 and "another build of LooseLeaf" in notice[0], notice
    finally:
        c.close()
        stop_pool(pool_dir)
        shutil.rmtree(tmp, ignore_errors=True)

"""Process and host-pool helpers shared by the test helpers (tests/conftest.py, routing/routehelp.py,
prefetch/pfhelp.py, zygote/zyghelp.py) and bench/bench_route.py: polling with a deadline, whether a pid is
alive, finding and stopping the `looseleaf pool` serving a pool dir, and a client of a pool through the C
client API (build/zygote/ll_zdriver client: JSON lines in and out).

Runs in the pytest (or bench) process.  The name is unique under tests/ on purpose: several test directories
have a conftest.py and none has an __init__.py, so a shared module must not be called conftest.  Callers put
tests/ on sys.path.  Nothing sleeps for a fixed time: every wait polls a condition with a deadline.
"""
import json
import os
import queue
import signal
import subprocess
import threading
import time


def wait_for(cond, timeout=30.0, what="condition"):
    """Poll COND until it returns something true, and return that; fail naming WHAT after TIMEOUT s."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.02)


# ---- processes, read from /proc ---------------------------------------------------------------------------
def _stat(pid):
    """(state, ppid, start time) of PID from /proc/PID/stat, or None when there is no such process.  The
    command name may hold ')' or spaces: the fields are what follows its last ')'."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid):
    """Whether PID exists and is not a zombie (a process that exited and whose parent has not reaped it yet:
    its pid is still in /proc, but it is gone as far as any test cares).  The rule of coherence._alive."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def ppid(pid):
    """The parent of PID, or None."""
    st = _stat(pid)
    return st and st[1]


def cmdline(pid):
    """PID's argv as str (undecodable bytes replaced), or None.  A zombie's is empty."""
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return None


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pool_pids(pool_dir):
    """Pids of the `looseleaf pool` processes serving POOL_DIR: argv[1] is "pool" and POOL_DIR is one of
    its arguments, exactly (its --runtime-dir).  A zombie has no argv, so it never matches."""
    out = []
    for pid in _pids():
        argv = cmdline(pid)
        if argv and argv[1:2] == ["pool"] and pool_dir in argv[2:]:
            out.append(pid)
    return out


def _tree(roots):
    """{pid: start time} of ROOTS and every process under them (the pool is its descendants' subreaper, so
    an orphaned worker is still its child).  The start time tells a pid reused later from the process."""
    stats = {pid: _stat(pid) for pid in _pids()}
    stats = {pid: st for pid, st in stats.items() if st}
    out = {pid: stats[pid][2] for pid in roots if pid in stats}
    grew = True
    while grew:
        grew = False
        for pid, st in stats.items():
            if pid not in out and st[1] in out:
                out[pid] = st[2]
                grew = True
    return out


def _same_alive(pid, start):
    st = _stat(pid)
    return st is not None and st[0] != "Z" and st[2] == start


def stop_pool(pool_dir, timeout=30):
    """SIGTERM every `looseleaf pool` serving POOL_DIR and wait until it and every process it had under it
    (zygotes, warm workers, probes) is gone or a zombie.  After TIMEOUT s whatever is left is SIGKILLed and
    the call fails naming it: a pool that outlives SIGTERM is a bug to see, not to leave running."""
    roots = pool_pids(pool_dir)
    procs = _tree(roots)
    for pid in roots:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # exited between the scan and the signal

    def left():
        return [pid for pid, start in procs.items() if _same_alive(pid, start)] + \
            [pid for pid in pool_pids(pool_dir) if pid not in procs]

    try:
        wait_for(lambda: not left(), timeout, "the pool of %s and its processes to exit" % pool_dir)
    except AssertionError:
        stuck = left()
        for pid in stuck:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise AssertionError("the pool of %s left processes %s running %ss after SIGTERM (now SIGKILLed)"
                             % (pool_dir, stuck, timeout)) from None


# ---- a client of a pool ------------------------------------------------------------------------------------
class PoolClient:
    """One client of the pool serving POOL_DIR (a kernel, as far as the pool can tell): DRIVER client POOL_DIR
    ARGS, started with ENV; the pool is started if none serves POOL_DIR, from ENV's LL_POOL_EXE (build/looseleaf,
    which the driver requires: it is no pool itself).  Events are read on a thread into a
    queue; events that arrive while stats() waits for its answer go to STRAY (a list; a private one if None)."""

    def __init__(self, driver, pool_dir, args=(), env=None, stray=None):
        self.proc = subprocess.Popen([driver, "client", pool_dir] + list(args), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.stray = [] if stray is None else stray
        self.events = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        first = self.next(60)
        assert first["type"] == "connected", first

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"type": "eof"})

    def next(self, timeout=60):
        """The next event; fails after TIMEOUT s without one."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no event from the pool within %s s" % timeout) from None

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def stats(self, timeout=60):
        """The pool's stats event; fails if the connection ends first."""
        self.send(op="stats")
        while True:
            ev = self.next(timeout)
            if ev["type"] == "stats":
                return ev
            assert ev["type"] not in ("eof", "pool_gone"), "the pool connection closed (%s)" % ev["type"]
            self.stray.append(ev)

    def close(self):
        """Say quit and wait for the driver to exit (kill it after 10 s).  The pool goes on serving."""
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

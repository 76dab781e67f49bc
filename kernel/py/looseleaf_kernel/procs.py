"""Processes of other kernels: whether the kernel that left a store or a cell directory behind still runs.

Used by the sweeps that remove what a killed kernel left (coherence._sweep, shell.CellCompiler.sweep).  Below
both in the package's imports.
"""


def _stat(pid):
    """The fields of /proc/PID/stat after the command name, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid):
    """Whether process PID exists and is not a zombie (a killed kernel its parent has not reaped yet)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def start_time(pid):
    """When process PID started (clock ticks since boot), None when it does not exist: with the pid, what
    names a process for good (a recycled pid has another start time)."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def same_process(pid, started):
    """Whether process PID runs and is the one that started at STARTED (None: not known, the pid decides)."""
    if not pid_alive(pid):
        return False
    return started is None or start_time(pid) == started

"""Processes of other kernels: whether the kernel that left a store or a cell directory behind still runs.

Used by the sweeps that remove what a killed kernel left (coherence._sweep, shell.CellCompiler.sweep).  Below
both in the package's imports.
"""


def pid_alive(pid):
    """Whether process PID exists and is not a zombie (a killed kernel its parent has not reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False

"""Process state that must follow a notebook session from process to process.

Captured after every cell (in a worker, and by the kernel after CPU cells once it routes) and stored with
the session's variables as the store entry NAME, in the same commit as the cell's variables; applied before
the next cell runs, wherever that is.  Covers what notebooks rely on besides their variables: working
directory, environment variables, sys.path, the random generators of random / numpy / torch, torch's
default dtype and grad mode.  Runs in whatever process runs cells; not thread-safe.
"""
import os
import random
import sys

NAME = "__looseleaf_procstate__"

# Variables that belong to the process, not to the session (set by LooseLeaf or the OS for this process).
_ENV_LOCAL = {"CUDA_VISIBLE_DEVICES", "LOOSELEAF_ROLE", "_", "PWD", "OLDPWD", "SHLVL"}


def capture():
    """A picklable dict of this process's state."""
    st = {
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k not in _ENV_LOCAL},
        "sys_path": list(sys.path),
        "random": random.getstate(),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        st["numpy_random"] = np.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        st["torch_rng"] = torch.get_rng_state()
        st["torch_dtype"] = str(torch.get_default_dtype()).replace("torch.", "")
        st["torch_grad"] = torch.is_grad_enabled()
    return st


def apply(st):
    """Make this process's state ST (from capture()); returns a list of what could not be applied."""
    problems = []
    if not isinstance(st, dict):
        return ["process state is not a dict"]
    try:
        if "cwd" in st:
            os.chdir(st["cwd"])
    except OSError as e:
        problems.append("cwd %s: %s" % (st.get("cwd"), e))
    env = st.get("env")
    if isinstance(env, dict):
        for k in [k for k in os.environ if k not in env and k not in _ENV_LOCAL]:
            del os.environ[k]
        for k, v in env.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
    if isinstance(st.get("sys_path"), list):
        sys.path[:] = st["sys_path"]
    if "random" in st:
        random.setstate(st["random"])
    if "numpy_random" in st:
        import numpy as np
        np.random.set_state(st["numpy_random"])
    if "torch_rng" in st:
        import torch
        torch.set_rng_state(st["torch_rng"])
        torch.set_default_dtype(getattr(torch, st.get("torch_dtype", "float32")))
        torch.set_grad_enabled(bool(st.get("torch_grad", True)))
    return problems


# {id(Checkpointer): the stored version this process's live state is}: set when restore() applied a version
# or save_with() committed (or found unchanged) the state it captured, dropped when save_with() starts (a
# cell ran since).  A warm worker's next job then needs no read or apply of a state it already has.
_live = {}


def restore(cp, versions=None):
    """Bring the session's process state into the process of Checkpointer CP when its stored version moved
    (a worker before its cell): nothing to read or apply when the stored version is the one this process's
    state already is (a warm worker whose own save is the newest, or a second preparation for one cell).
    VERSIONS: the store's versions, when the caller just read them.  Returns the RestoreReport and the
    problems of apply()."""
    mine = _live.get(id(cp))
    if versions is None and mine is not None:
        versions = cp.versions()
    if mine is not None and mine == cp.version(NAME) and versions.get(NAME) == mine:
        from .checkpoint import RestoreReport
        rep = RestoreReport()
        rep.skipped = [NAME]
        return rep, []
    _live.pop(id(cp), None)
    rep = cp.restore([NAME])
    st = cp.namespace.pop(NAME, None)
    problems = apply(st) if st is not None else []
    if NAME not in rep.failed and st is not None and not problems:
        _live[id(cp)] = cp.version(NAME)
    return rep, problems


def save_with(cp, names, **kwargs):
    """CP.save(NAMES) with this process's state as the entry NAME in the same commit (a worker after its
    cell)."""
    _live.pop(id(cp), None)
    ns = cp.namespace
    ns[NAME] = capture()
    try:
        rep = cp.save(list(names) + [NAME], **kwargs)
    finally:
        ns.pop(NAME, None)
    if NAME in rep.saved or NAME in rep.unchanged:
        _live[id(cp)] = cp.version(NAME)
    return rep

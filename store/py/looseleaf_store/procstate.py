"""Process state that must follow a notebook session from process to process.

Captured after every cell (in a worker, and by the kernel after CPU cells once it routes) and stored with
the session's variables as the store entry NAME, in the same commit as the cell's variables; applied before
the next cell runs, wherever that is.  Covers what notebooks rely on besides their variables: working
directory, umask, environment variables, sys.path, the random generators of random / numpy / torch (CPU and
CUDA), torch's default dtype and grad mode.  numpy's and torch's parts are applied only where (or once) the
framework is imported: a process that never imports torch never pays for it.  Runs in whatever process runs cells; not thread-safe.
"""
import importlib.abc
import importlib.machinery
import logging
import os
import random
import sys

NAME = "__looseleaf_procstate__"

# The CUDA generators' states travel too, though most processes of a session never initialise CUDA (the
# kernel never does).  A process without CUDA carries what it last applied and hands it on unchanged:
# (the CPU generator's seed when those states were taken, the states or None).  A seed set here since
# (torch.manual_seed in a CPU cell, which in one process would reseed the CUDA generators too) replaces
# them: the next process with CUDA seeds its generators with it.
_cuda_carry = (None, None)

# Variables that belong to the process, not to the session (set by LooseLeaf or the OS for this process).
_ENV_LOCAL = {"CUDA_VISIBLE_DEVICES", "LOOSELEAF_ROLE", "_", "PWD", "OLDPWD", "SHLVL"}


def capture():
    """A picklable dict of this process's state."""
    st = {
        "cwd": os.getcwd(),
        "umask": _umask(),
        "env": {k: v for k, v in os.environ.items() if k not in _ENV_LOCAL},
        "sys_path": list(sys.path),
        "random": random.getstate(),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        st["numpy_random"] = _plain_numpy_state(np.random.get_state())
    torch = sys.modules.get("torch")
    if torch is not None:
        st["torch_rng"] = torch.get_rng_state().numpy().tobytes()
        st["torch_dtype"] = str(torch.get_default_dtype()).replace("torch.", "")
        st["torch_grad"] = torch.is_grad_enabled()
        st["torch_cuda_rng"] = _cuda_rng(torch)
    # The state of a framework this process never imported is handed on as it came.
    for name, (state, _) in list(_pending.items()):
        if name not in sys.modules:
            st.update(state)
    return st


def _umask():
    """This process's umask: from /proc (reading it through os.umask sets it for a moment, under any thread
    creating a file meanwhile), else through os.umask.  A worker takes its session's, so files a cell writes
    there get the modes they would get in the kernel (the pool's own umask is its own, 022)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    m = os.umask(0o022)
    os.umask(m)
    return m


def _cuda_rng(torch):
    """(seed, states) of the CUDA generators for capture(): this process's own when it initialised CUDA,
    else what it carries (_cuda_carry), with the states dropped when a seed was set here since."""
    seed = torch.initial_seed()
    if torch.cuda.is_initialized():
        return seed, [s.cpu().numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    carried_seed, states = _cuda_carry
    return (seed, states if carried_seed == seed else None)


def _apply_cuda_rng(torch, rng):
    """Make the CUDA generators what RNG ((seed, states) from capture()) says: its states where this process
    has CUDA (and the same number of devices), else a seed from it; carried along where it has no CUDA."""
    global _cuda_carry
    seed, states = rng
    if not torch.cuda.is_initialized():
        _cuda_carry = (seed, states)
        if states is None and seed is not None:
            torch.cuda.manual_seed_all(seed)  # queued by torch until CUDA starts here, if ever
        return
    if states is not None and len(states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_as_tensor(torch, s) for s in states])
    elif seed is not None:
        torch.cuda.manual_seed_all(seed)


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
    if isinstance(st.get("umask"), int) and 0 <= st["umask"] <= 0o777:
        os.umask(st["umask"])
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
        problems += _framework("numpy", {"numpy_random": st["numpy_random"]}, _apply_numpy)
    if "torch_rng" in st:
        keys = ("torch_rng", "torch_dtype", "torch_grad", "torch_cuda_rng")
        problems += _framework("torch", {k: st[k] for k in keys if k in st}, _apply_torch)
    return problems


# The generator states are stored as plain values (bytes, tuples of numbers): unpickling the process state must
# not import numpy or torch, which is what it would take to rebuild an array or a tensor.
def _plain_numpy_state(st):
    name, keys, pos, has_gauss, cached = st
    return (name, keys.tobytes(), int(pos), int(has_gauss), float(cached))


def _as_tensor(torch, value):
    """A ByteTensor from BYTES (or a tensor, from an older save)."""
    if isinstance(value, (bytes, bytearray)):
        return torch.frombuffer(bytearray(value), dtype=torch.uint8)
    return value


def _apply_numpy(np, state):
    st = state["numpy_random"]
    if isinstance(st[1], (bytes, bytearray)):
        st = (st[0], np.frombuffer(st[1], dtype=np.uint32).copy(), st[2], st[3], st[4])
    np.random.set_state(st)
    return []


def _apply_torch(torch, state):
    problems = []
    torch.set_rng_state(_as_tensor(torch, state["torch_rng"]))
    torch.set_default_dtype(getattr(torch, state.get("torch_dtype", "float32")))
    torch.set_grad_enabled(bool(state.get("torch_grad", True)))
    if isinstance(state.get("torch_cuda_rng"), tuple):
        try:
            _apply_cuda_rng(torch, state["torch_cuda_rng"])
        except Exception as e:  # noqa: BLE001 - reported; the cell runs with the generators it has
            problems.append("CUDA generators: %s: %s" % (type(e).__name__, e))
    return problems


# ---- a framework's state where, and once, the framework is imported ------------------------------------
#
# Applying torch's generator state in a process that has not imported torch would import it: 0.5 s and more
# of a CPU cell that never touches torch (the kernel, after a GPU cell).  So a framework's state is applied
# at once only where the framework is imported already; elsewhere it waits, is handed on unchanged by
# capture(), and is applied the moment anything imports the framework (an import hook), before any of the
# importer's code can draw from a generator.  {module name: (its keys of the state, the function applying
# them)}.
_pending = {}
log = logging.getLogger("looseleaf_store")


def _framework(name, state, fn):
    module = sys.modules.get(name)
    if module is not None:
        _pending.pop(name, None)
        return fn(module, state)
    _pending[name] = (state, fn)
    if not any(isinstance(f, _ApplyOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ApplyOnImport())
    return []


def pending():
    """Names of the frameworks whose state waits for their import here."""
    return sorted(_pending)


class _ApplyOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a framework whose state waits, it wraps the real loader so that the state is
    applied right after the framework's module ran."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Then(spec.loader, fullname)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, loader, name):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        state, fn = _pending.pop(self._name, (None, None))
        if fn is not None:
            try:
                problems = fn(module, state)
            except Exception as e:  # noqa: BLE001 - the import itself must not fail for it
                problems = ["%s: %s" % (type(e).__name__, e)]
            if problems:
                log.warning("%s state not fully applied: %s", self._name, problems)

    def __getattr__(self, attr):  # the real loader's resources, file name, ...
        return getattr(self._loader, attr)


def cuda_started():
    """CUDA was just initialised in this process (a worker, after its preparation applied the session's
    process state): the CUDA generator states it carries become its generators' own.  (A seed without
    states was queued by torch and applied as CUDA started.)"""
    torch = sys.modules.get("torch")
    seed, states = _cuda_carry
    if torch is None or states is None or not torch.cuda.is_initialized():
        return
    if len(states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_as_tensor(torch, s) for s in states])


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

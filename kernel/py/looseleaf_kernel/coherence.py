"""Coherence between the kernel's namespace and the checkpoint store, for GPU routing.

When the gateway routes GPU-labelled cells to forked workers, a variable lives in two places: the kernel's
namespace (CPU cells run there) and the store (workers restore from it and save into it).  Variables flow
only through the store, lazily, and this object keeps the two sides coherent:

* After a CPU cell, every name the cell may have changed is *dirty*: the kernel's copy is newer than the
  store's.  That is the analysis' writes, deletes and state closure (a method call can change an object in
  place without the analysis seeing it) plus whatever the namespace shows rebound or deleted.
* Before a GPU cell the dirty names reach the store in one commit (all of them, so that the store knows
  what they share with the cell's closure), with the process state (cwd, env, sys.path, RNGs, torch dtype /
  grad mode; looseleaf_store.procstate) and the globals of the user's own modules (looseleaf_store.usermods).
  A closure name that cannot be saved (made here, it lives here) makes the gateway run the cell here
  instead, with a one-line notice.
* Homes (nothing a cell made is ever lost).  A value a worker made that cannot be saved stays in that worker, which
  is the session's home for it (and for values whose autograd graph it holds, and what they share objects with):
  `home` maps those names to the worker, and the gateway sends every cell reading one there.  When the worker goes,
  its held names are `lost` (reading one raises LostVariable naming why), a graph name comes back without its
  graph (a notice says so when a cell next reads it).
* After a GPU cell the names its worker deleted leave the namespace; the ones it saved are no longer
  dirty (the store's copy is now the newer one) and the cell enters IPython's history and counter.
* Before a CPU cell, closure names whose store version moved (a worker changed them) are restored (payloads
  mapped copy-on-write, so this costs no copy), and so is the process state.  Dirty names are never
  overwritten: the kernel's copy of those is the newer.

The store (a private redis-server and a payload pool, `_llstore`) opens at the first GPU cell, so a session
that never uses one pays nothing but the bookkeeping, and is deleted when the kernel shuts down.

Runs on the interpreter thread, inside request handling; not thread-safe.
"""
import ast
import contextlib
import logging
import os
import pickle
import re
import sys
import tempfile
import time
import types
import uuid


log = logging.getLogger("looseleaf_kernel")

# Names a draft mentions (completion, inspection): the first part of dotted names.
_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_]\w*")

# A cell that reads the output history (Out[3], _, __, ___, _7, _oh), to be brought up to date first.
_OUTPUT_NAMES = re.compile(r"(?<![\w.])(?:_{1,3}|_\d+|Out|_oh)(?!\w)")

# A value a GPU cell saved whose payloads are larger than this is completed from its worker's account of it
# (Coherence.complete_view) rather than restored into the kernel first.
_COMPLETE_RESTORE_BYTES = 64 << 20

_NOT_BOUND = object()


def _completion_stand_in(type_name, attrs):
    """An object that completes as a value of TYPE_NAME whose dir() is ATTRS would: `t.resha<Tab>` on it gives
    what the real tensor gives, without importing torch into the kernel or restoring the tensor."""
    qual = type_name.rpartition(".")[2] or "value"
    names = list(attrs)
    # Its module is this one, which is imported: jedi imports the module a class names, and the real
    # one's (torch) is what the stand-in is there to spare.
    cls = type(qual, (), {
        "__dir__": lambda self: names, "__module__": __name__, "__slots__": (),
        "__doc__": "The %s a GPU cell made (completion from its worker's account; not restored yet)." % type_name,
    })
    return cls()


# IPython's own names: never variables of the session.
_HIDDEN = {"_", "__", "___", "_i", "_ii", "_iii", "In", "Out", "_oh", "_ih", "_dh", "exit", "quit",
           "get_ipython"}


_QUICK_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_QUICK_ITEMS = 10000        # elements of a list, tuple, set or dict (each a scalar)
_QUICK_BYTES = 16 << 20     # an array's or tensor's own bytes
_QUICK_NAMES = 200          # dirty names in one idle commit
_COMMIT_BATCH = 2048        # names in one commit of the kernel's (Coherence._save_batched)


def _quick_to_save(value):
    """Whether VALUE saves in well under a millisecond or two: a scalar or string, a flat container of up to
    _QUICK_ITEMS of them, or a numpy array / CPU tensor of up to _QUICK_BYTES.  Anything else (a model, a
    DataFrame, nested structures) may take long and is left to the GPU cell's commit."""
    if isinstance(value, _QUICK_SCALARS):
        return not isinstance(value, (str, bytes)) or len(value) <= _QUICK_BYTES
    if isinstance(value, (list, tuple, set, frozenset)):
        return len(value) <= _QUICK_ITEMS and all(isinstance(v, _QUICK_SCALARS) for v in value)
    if isinstance(value, dict):
        return len(value) <= _QUICK_ITEMS and all(isinstance(k, _QUICK_SCALARS) and isinstance(v, _QUICK_SCALARS)
                                                  for k, v in value.items())
    mod = type(value).__module__
    if mod == "numpy" and type(value).__name__ == "ndarray":
        return value.dtype != object and value.nbytes <= _QUICK_BYTES
    if mod == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        return value.device.type == "cpu" and value.element_size() * value.nelement() <= _QUICK_BYTES
    return False


def slow_commit_idle_s():
    """LOOSELEAF_SLOW_COMMIT_IDLE_S (5; 0: never): how long the kernel stays idle after user code ran before
    what is slow to save is committed in the background (the gateway reads the same setting: ll_exec.c)."""
    try:
        v = float(os.environ.get("LOOSELEAF_SLOW_COMMIT_IDLE_S", "5"))
    except ValueError:
        return 5.0
    return v if v >= 0 else 5.0


class _GaveWay(BaseException):
    """A request came during the background commit (Coherence.commit_slow): abandon it.  A BaseException,
    as KeyboardInterrupt, so that the Checkpointer gives back what it wrote and commits nothing."""


def _request_waiting():
    """Whether a request waits on shell (the gateway's hook; False outside the kernel)."""
    try:
        import _looseleaf_kernel
        return _looseleaf_kernel.request_waiting()
    except (ImportError, AttributeError):
        return False


def _give_way(coh):
    """Coherence.commit_slow's check: raise _GaveWay when a request waits on shell, or a subshell's code for
    the coherence lock (COH.subshells_waiting).  LOOSELEAF_TEST_COMMIT_HOLD (a test hook: a file path) makes
    the commit slow where it is most delicate, between the pieces of a large payload (Checkpointer.
    _put_in_pieces): while that file exists, such a check writes PATH.held and waits, asking every 10 ms."""
    hold = os.environ.get("LOOSELEAF_TEST_COMMIT_HOLD")
    if hold and os.path.exists(hold) and sys._getframe(2).f_code.co_name == "_put_in_pieces":
        with open(hold + ".held", "w"):
            pass
        while os.path.exists(hold) and not coh.subshells_waiting and not _request_waiting():
            time.sleep(0.01)
    if coh.subshells_waiting or _request_waiting():
        raise _GaveWay()


def visible(shell, modules=False):
    """{name: id(value)} of the session's variables in SHELL's namespace, in the kernel and in workers:
    IPython's own names, dunder names (the process state entry among them) and the input/output history
    (_iN, _N) left out, and modules too unless MODULES."""
    hidden = set(getattr(shell, "user_ns_hidden", {})) | _HIDDEN
    out = {}
    for k, v in shell.user_ns.items():
        if k in hidden or k.startswith("__") or (k.startswith("_i") and k[2:].isdigit()) or \
                (k.startswith("_") and k[1:].isdigit()) or (not modules and isinstance(v, types.ModuleType)):
            continue
        out[k] = id(v)
    return out


# ---- names bound beyond the analysis ---------------------------------------------------------------------
# exec, %run, globals()[k] = v, setattr(sys.modules['__main__'], ...) bind names the static analysis never sees.
# The process that ran a cell diffs its namespace and tells the gateway's analysis session what the cell bound
# and deleted beyond what the analysis knew (namespace_diff), so later closures name those variables and they
# move between the kernel and workers like any other.

# Names whose use in a function's code defeats the analysis of what it reads.
_OPAQUE_CALLS = frozenset(("exec", "eval", "globals", "locals", "vars", "get_ipython", "__import__"))
_DEPS_MAX = 512  # names a function's code may name, at most, before it counts as opaque


def _code_names(code, out, seen):
    """Global (and attribute) names CODE and the code nested in it name: what calling it may look up."""
    if id(code) in seen or len(out) > _DEPS_MAX:
        return
    seen.add(id(code))
    out.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_names(c, out, seen)


def _code_of(v):
    """The code objects whose globals using V may look up: a function's, a class's methods' (and
    properties'), an instance's class's methods' when that class was made in the session."""
    if isinstance(v, types.MethodType):
        v = v.__func__
    if isinstance(v, types.FunctionType):
        return [v.__code__]
    cls = v if isinstance(v, type) else type(v)
    if getattr(cls, "__module__", None) != "__main__":
        return []
    out = []
    for k, m in list(vars(cls).items()):
        for f in (m, getattr(m, "__func__", None), getattr(m, "fget", None), getattr(m, "fset", None)):
            if isinstance(f, types.FunctionType):
                out.append(f.__code__)
    return out


def _top_module(v):
    """The package V's type (V itself when a class) comes from, None for builtins and the session's own."""
    cls = v if isinstance(v, type) else type(v)
    mod = getattr(cls, "__module__", None)
    if not isinstance(mod, str) or mod in ("builtins", "__main__"):
        return None
    return mod.partition(".")[0]


def _dyn_entry(name, v):
    """[path, stmt, deps, opaque] of NAME bound to V, for the analysis session (ll_analysis_session_bind):
    a module with the import statement that binds it again; otherwise the package V comes from, the names its
    code may look up, and whether that code defeats the analysis."""
    if isinstance(v, types.ModuleType):
        from .keep import import_statement
        stmt = import_statement(name, v)
        return [v.__name__, stmt, [], False] if stmt else [None, None, [], True]
    names, seen = set(), set()
    try:
        for code in _code_of(v):
            _code_names(code, names, seen)
    except Exception:  # noqa: BLE001 - an odd class: whatever uses it gets everything
        return [_top_module(v), None, [], True]
    opaque = len(names) > _DEPS_MAX or bool(names & _OPAQUE_CALLS)
    return [_top_module(v), None, [] if opaque else sorted(names), opaque]


def split_visible(shell):
    """(visible(shell), {name: id} of the session's names bound to modules): one pass."""
    values, modules = {}, {}
    hidden = set(getattr(shell, "user_ns_hidden", {})) | _HIDDEN
    for k, v in shell.user_ns.items():
        if k in hidden or k.startswith("__") or (k.startswith("_i") and k[2:].isdigit()) or \
                (k.startswith("_") and k[1:].isdigit()):
            continue
        (modules if isinstance(v, types.ModuleType) else values)[k] = id(v)
    return values, modules


def namespace_diff(ns, before, after, known):
    """What a cell bound and deleted beyond what the analysis KNOWS it binds, from {name: id} snapshots of the
    namespace NS (modules included) BEFORE and AFTER it: {"bound": {name: _dyn_entry}, "unbound": [names]},
    or None when there is nothing to tell."""
    known = set(known or ())
    bound = {k: _dyn_entry(k, ns[k]) for k, ident in after.items()
             if before.get(k) != ident and k not in known and k in ns}
    unbound = sorted(k for k in before if k not in after)
    if not bound and not unbound:
        return None
    return {"bound": bound, "unbound": unbound}


def _reason(e):
    return "%s: %s" % (type(e).__name__, e)


# What the store's failures mean for a cell: the store is gone or silent, or an interrupt ended
# the wait.  The cell then fails with that error instead of running somewhere its variables are not.
_CELL_ERRORS = ("StoreUnavailable", "KeyboardInterrupt")


def _cell_error(kind, why):
    """The answer that makes the gateway end the cell with error KIND (a name of _CELL_ERRORS) saying WHY."""
    return {"error": {"ename": kind, "evalue": why}}


def _interrupt_fd():
    """The kernel's interrupt eventfd (the hooks' interrupt_fd), -1 outside the kernel."""
    try:
        import _looseleaf_kernel
        return _looseleaf_kernel.interrupt_fd()
    except (ImportError, AttributeError):
        return -1


def node_module(node):
    return ast.Module(body=[node], type_ignores=[])


def _state_blob(st):
    """A comparable form of a procstate.capture() (None if it cannot be pickled): its values are plain (the
    generator states as bytes), so equal states pickle equally."""
    try:
        return pickle.dumps(st, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - then it is simply saved every time
        return None


def _usermods():
    from looseleaf_store import usermods
    return usermods


def _sweep(base):
    """Remove the stores of kernels that died without shutting down (keep.sweep: a notebook's keyed store
    stays for its time, the others go)."""
    from . import keep
    keep.sweep(base)


class Coherence:
    """The kernel's side of the store protocol above, for the namespace of SHELL."""

    def __init__(self, shell):
        self.shell = shell
        self.dirty = set()   # names whose newest copy is the kernel's, not yet in the store
        self.store = None
        self.cp = None
        self.dir = None      # the store's runtime dir (redis socket, append-only file)
        self.session = None
        self._before = None  # {name: id(value)} when the running CPU cell started
        self._before_mods = {}  # ... and {name: id(module)} of its names bound to modules
        self._ps = None      # the process state this process last applied or saved (procstate.capture())
        self._ps_blob = None  # pickle of a capture() taken right then: unchanged state is not saved again
        # What workers may have committed since this process last looked.  Only this session's workers write
        # its store, and only during GPU cells, so between them a CPU cell needs no round trip to Redis:
        # _moved is the set of names a worker reported saving or deleting (None: unknown, e.g. a worker died
        # mid-commit; then the versions are compared once), _ps_moved whether a GPU cell ran since the
        # process state was last pulled.
        self._moved = set()
        # GPU cells' results not yet in the output history: [(execution count, "_N")], oldest first.
        self._pending_out = []
        self._ps_moved = False
        # Homes (values no store can hold): {name: {pid, kind: held | graph | tied, what}} of names whose live value
        # is in a worker; {name: message} of held names whose worker is gone; {name: message} of graph
        # names whose worker is gone, told once to the next cell that reads them.
        self.home = {}
        self.lost = {}
        self.graph_lost = {}
        # {name: (type, dir list, payload bytes, top-level modules)} of values GPU cells saved: what completion
        # answers from while restoring them would be slow (complete_view).
        self._shapes = {}
        self._values = {}  # name -> (type, explorer value or None): a worker's account of what it saved
        self._mods_dirty = False  # a CPU cell ran since the user modules' globals were last committed
        # What the store should hold (_lost_data): the newest commit this process saw in the store, its own
        # or a worker's (after_gpu), and the names committed there as far as this process knows.
        self._seen_version = 0
        self._stored = set()
        self._lost = None  # what _lost_data found, until a GPU cell's Run says so
        self._history_budget = 0  # bytes of superseded versions kept (_history_on)
        # Names bound outside any cell (a restore, keep.py): the next cell reports them as if it bound them,
        # so the gateway's analysis learns them and they are committed.
        self._fresh = set()
        self.imports = {}  # the top-level import statements of the cells run so far, in order (keep.py)
        self.subshells_waiting = []  # one item per subshell's code waiting for the coherence lock (kernel.py)

    # ---- the namespace -------------------------------------------------------------------------------
    def _procstate(self):
        from looseleaf_store import procstate
        return procstate

    def _visible(self):
        return visible(self.shell)

    def _saveable(self, names):
        """NAMES without modules (import statements bring those back; a user's own module bound by an
        assignment, `m = importlib.reload(m)`, is saved: by reference) and IPython's own names."""
        ns = self.shell.user_ns
        hidden = set(getattr(self.shell, "user_ns_hidden", {})) | _HIDDEN
        usermods = _usermods()
        return sorted(n for n in names if isinstance(n, str) and n not in hidden and
                      (not isinstance(ns.get(n), types.ModuleType) or usermods.is_user_module(ns[n])))

    # ---- the store -----------------------------------------------------------------------------------
    @staticmethod
    def store_base():
        """Where stores live.  On tmpfs: the private redis-server fsyncs its append-only file at every commit."""
        for d in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm", tempfile.gettempdir()):
            if d and os.path.isdir(d) and os.access(d, os.W_OK):
                return d
        return None

    def _open(self, adopt=None):
        """Open the session's store: a new one, or ADOPT (dir, session) that an earlier kernel of this
        notebook left (keep.restore).  A kernel run for a notebook keys its store so that it outlives the
        kernel (keep.py)."""
        if self.cp is not None:
            return
        import _llstore
        from looseleaf_store import Checkpointer
        from . import keep
        base = self.store_base()
        _sweep(base)
        key = keep.notebook_key()
        if adopt is not None:
            self.dir, self.session = adopt
        else:
            # 0700.  A kept store's name is not looseleaf-store-*: a kernel of an older build sweeps those
            # as soon as their owner is gone.
            self.dir = tempfile.mkdtemp(prefix="looseleaf-keep-" if key else "looseleaf-store-", dir=base)
            self.session = uuid.uuid4().hex[:16]
        try:
            keep.claim(self.dir, self.session)
            pool = None
            if key is not None:
                # A named pool (a memfd would die with this kernel), removed with the store.
                pool = keep._read(self.dir, keep.POOL) or keep.pool_path(self.session)
                keep._write(self.dir, keep.POOL, pool + "\n")
                keep._write(self.dir, keep.NOTEBOOK, key + "\n")
            self.store = _llstore.Store(self.dir, self.session, pool_path=pool,
                                        pool_bytes=keep.pool_bytes() if pool and not os.path.exists(pool) else None)
            fd = _interrupt_fd()
            if fd >= 0:
                # An interrupt ends a wait for a silent Redis (the kernel's interrupt eventfd: one from
                # before the call is not for it).
                self.store.set_interrupt_fd(fd, drain=True)
            self.cp = Checkpointer(self.store, self.shell.user_ns)
            try:
                import _looseleaf_kernel
                _looseleaf_kernel.store_opened()  # idle commits from now on, pool or not (ll_exec.c)
            except (ImportError, AttributeError):
                pass
            self.cp.cpu_only = True  # a CUDA tensor refreshed here comes back on the CPU: no context here
            self._history_on()
            if key is not None:
                keep.spawn_reaper(self.dir)
        except BaseException:
            self.close(keep_store=adopt is not None)  # a kept store we failed to adopt stays kept
            raise

    def _history_on(self):
        """Keep superseded versions (time travel: %looseleaf history/checkout) within LL_HISTORY_BYTES (a quarter of the pool,
        at most 4 GiB; "0": off).  Before any worker commits: each Store reads the setting at its first
        commit."""
        from looseleaf_store import history
        try:
            self._history_budget = history.budget_bytes(self.store)
        except ValueError as e:
            log.warning("LL_HISTORY_BYTES: %s; the history stays off", e)
            self._history_budget = 0
        if self._history_budget > 0:
            history.enable(self.store)

    def _keep_history(self):
        """Drop the oldest superseded versions beyond the budget (after a worker's commit, and when idle)."""
        if self.cp is None or not self._history_budget:
            return
        from looseleaf_store import history
        try:
            dropped = history.prune(self.store, self._history_budget)
        except Exception:  # noqa: BLE001 - the next idle time tries again
            log.info("history prune failed", exc_info=True)
            return
        if dropped:
            log.info("history: dropped %d old versions to stay within %d bytes", len(dropped),
                     self._history_budget)

    def close(self, keep_store=False):
        """Stop the session's redis-server and remove its store: the directory holds every key (the
        append-only file), and the pool has no name (it goes with the last process that maps it) or is the
        named file the directory names, so no round trip to Redis is needed, and a silent Redis cannot hold
        up a shutdown.  KEEP_STORE (a restart): a keyed store stays for the next kernel (keep.py)."""
        from . import keep
        store, self.store, self.cp = self.store, None, None
        if store is not None:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - shutting down: log and go on
                log.warning("closing the checkpoint store", exc_info=True)
        if self.dir:
            if keep_store and keep._read(self.dir, keep.NOTEBOOK):
                keep._write(self.dir, keep.DEAD, "%f restart\n" % time.time())
                keep._write(self.dir, keep.OWNER, "0 %s\n" % self.session)
            else:
                keep.remove(self.dir)
            self.dir = None

    def _lost_data(self):
        """Whether the store came back without its data (its redis-server restarted on an empty directory):
        its newest commit is older than one this process saw.  Then what this process holds becomes dirty
        again (forgotten by the Checkpointer: saved whole at the next commit) and the answer is (names that
        lived only in the store, names whose newest version did); else None."""
        version, _ = self.store.last_commit()
        if version >= self._seen_version:
            self._seen_version = version
            return None
        ns = self.shell.user_ns
        procstate = self._procstate()
        usermods = _usermods()
        gone = sorted(n for n in set(self.cp.known()) | self._stored
                      if n not in ns and n != procstate.NAME and not usermods.is_entry(n)
                      and not (n.startswith("_") and n[1:].isdigit()))
        stale = sorted(n for n in (self._moved or ()) if n in ns)
        log.warning("the checkpoint store lost its data (commit %d, had seen %d): %s only lived there",
                    version, self._seen_version, gone)
        self.cp.forget()
        self.dirty.update(self._saveable(self._visible()))
        self._ps = self._ps_blob = None
        self._ps_moved = False
        self._moved = set()
        self._seen_version = version
        self._stored = set()
        return gone, stale

    def _lost_error(self):
        """The error ({error: {ename, evalue}}) of the one cell that says the store came back without its
        data (self._lost, which it clears): what lived only there is gone, naming it."""
        (gone, stale), self._lost = self._lost, None
        why = "the checkpoint store came back without its data (its redis-server restarted empty)"
        if gone:
            why += "; %s lived only there and %s gone" % (", ".join(gone), "is" if len(gone) == 1 else "are")
        if stale:
            why += "; the newest versions of %s are gone, the kernel's older ones stay" % ", ".join(stale)
        return _cell_error("StoreUnavailable", why + "; the kernel's variables were saved again: run the "
                           "cells that made the others again")

    # ---- process state ------------------------------------------------------------------------------
    def _pull_procstate(self):
        """Apply the stored process state if a worker committed a newer one than this process last
        applied or saved.  (procstate.restore would apply it every time, undoing what CPU cells changed.)"""
        if not self._ps_moved and self._ps is not None:
            return
        self._ps_moved = False
        procstate = self._procstate()
        ns = self.shell.user_ns
        if self._ps is not None:
            ns[procstate.NAME] = self._ps  # held: restore skips it unless its version moved
        try:
            self.cp.restore([procstate.NAME])
        finally:
            st = ns.pop(procstate.NAME, None)
        if st is not None and st is not self._ps:
            self._ps = st
            problems = procstate.apply(st)
            if problems:
                log.warning("process state not fully applied: %s", problems)
            self._ps_blob = _state_blob(procstate.capture())

    def _push(self, names, modules=True, give_way=None):
        """Save NAMES with this process's state in one commit (procstate.save_with, remembering what was
        saved so _pull_procstate knows it), and when MODULES the user modules' globals if code run here may
        have changed them."""
        procstate = self._procstate()
        ns = self.shell.user_ns
        names = list(names) + (self._module_entries() if modules else [])
        st = procstate.capture()
        blob = _state_blob(st)
        if not names and blob is not None and blob == self._ps_blob:
            # Nothing to commit (a Run right after a prefetch, GPU cells back to back): spare the
            # store's round trips on the way to the worker.
            from looseleaf_store.checkpoint import SaveReport
            return SaveReport()
        ns[procstate.NAME] = st
        try:
            rep = self._save_batched(list(names) + [procstate.NAME], give_way)
        finally:
            ns.pop(procstate.NAME, None)
        if procstate.NAME in rep.saved or procstate.NAME in rep.unchanged:
            self._ps = st
            self._ps_blob = blob
        if not rep.error and modules:
            self._mods_dirty = False
        if rep.saved:
            self._seen_version = max(self._seen_version, max(rep.saved.values()))
        self._stored.update(n for n in rep.saved if n != procstate.NAME)
        self._stored.difference_update(rep.deleted)
        return rep

    def _save_batched(self, names, give_way=None):
        """Save NAMES in commits of at most _COMMIT_BATCH names each (procstate and the rest of what goes with
        them last).  A Redis transaction costs more than linearly in its commands (Redis 7.0 grows a queued
        transaction one command at a time): 200k names made by one exec took one commit past the store's
        timeout, and since they stayed dirty, every later GPU cell too.  The kernel's commits need not be
        atomic: no worker reads the store while the kernel commits, a GPU cell runs only once every batch
        landed, and what a failed batch left out stays dirty (its owners come along in any batch: NeedOwner).
        One SaveReport for all; after an error, nothing more is saved."""
        # The commit's id starts with the cell it comes after (the history lists it: In[N]).
        cell = "In[%d] kernel-%s" % (max(0, self.shell.execution_count - 1), uuid.uuid4().hex[:12])
        if len(names) <= _COMMIT_BATCH:
            return self.cp.save(names, cell_id=cell, give_way=give_way)
        total = None
        for i in range(0, len(names), _COMMIT_BATCH):
            rep = self.cp.save(names[i:i + _COMMIT_BATCH], cell_id="%s-%d" % (cell, i // _COMMIT_BATCH),
                               sync=i == 0, give_way=give_way)
            if total is None:
                total = rep
            else:
                total.saved.update(rep.saved)
                total.unchanged += rep.unchanged
                total.deleted += rep.deleted
                total.failed.update(rep.failed)
                total.added += rep.added
                total.bytes_written += rep.bytes_written
                total.payload_bytes += rep.payload_bytes
                total.standins.update(rep.standins)
                total.graphs += rep.graphs
                total.seconds += rep.seconds
                total.error, total.error_kind = rep.error, rep.error_kind
            if rep.error:
                break
        return total

    # ---- around CPU cells ----------------------------------------------------------------------------
    def _imports(self, stmts):
        """Run the import statements that bind names the cell reads and the namespace lacks (a GPU cell
        on a worker imported them there)."""
        ns = self.shell.user_ns
        for stmt in stmts or []:
            try:
                node = ast.parse(stmt).body[0]
                names = [(a.asname or a.name.split(".")[0]) for a in node.names]
            except (SyntaxError, IndexError, AttributeError, ValueError):
                continue
            if all(n in ns for n in names):
                continue
            try:
                exec(compile(node_module(node), "<looseleaf import>", "exec"), ns)
            except BaseException:  # noqa: BLE001 - the cell meets the same error itself
                log.info("import for a CPU cell failed: %s", stmt, exc_info=True)

    def _stale(self, names):
        """NAMES a worker may have changed: moved themselves, or referencing (through the objects they
        share) a variable that moved, whose new objects they must be rebuilt around."""
        memo = {}

        def stale(n):
            if n not in memo:
                memo[n] = False  # a cycle adds nothing
                memo[n] = n in self._moved or any(stale(d) for d in self.cp.references(n))
            return memo[n]

        out = [n for n in names if stale(n)]
        stale = None  # the recursive closure would keep itself alive until gc
        return out

    def note_imports(self, code):
        """Remember the top-level import statements of CODE (a cell run here or on a worker): what a restore
        after a crash or restart runs again."""
        if not isinstance(code, str) or "import" not in code:
            return
        try:
            tree = ast.parse(self.shell.transform_cell(code))
        except Exception:  # noqa: BLE001 - magics, syntax errors: nothing to remember
            return
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                    isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__")):
                self.imports[ast.unparse(node)] = None

    def before_cpu(self, plan):
        """Refresh the cell's closure from the store where a worker changed it, and bring in the imports
        it reads; remember the namespace.  Returns the refresh's report for metadata.looseleaf."""
        self.install_outputs(plan.get("code"))
        self.note_imports(plan.get("code"))
        self._imports(plan.get("import_stmts"))
        load_index = getattr(self.shell.compile, "load_index", None)
        if load_index is not None:
            load_index()  # cells compiled by workers: their tracebacks read as ours
        # "unknown": a cell too big to analyse: it may read any variable.
        state = plan.get("state") or []
        out = self._refresh(None if plan.get("unknown") else state)
        if self._lost is not None and "error" not in out:
            # The store came back without its data: a cell reading what lived only there (or whose newest
            # version did) fails once, naming them, instead of meeting NameError or older values.
            gone, stale = self._lost
            if plan.get("unknown") or set(state) & (set(gone) | set(stale)):
                out.update(self._lost_error())
        for n in state:
            line = self.graph_lost.pop(n, None) if isinstance(n, str) else None
            if line:
                sys.stderr.write(line)
        self._before, self._before_mods = split_visible(self.shell)
        return out

    def refresh_for(self, code):
        """Before completion or inspection of CODE (a frontend's draft, or a name): bring the session
        variables it names up to date from the store where a worker made or changed them, as a CPU cell
        reading them would, so `t.resha<Tab>` completes a tensor a GPU cell made.  Nothing to do, and no store
        round trip, when no GPU cell ran since the last refresh."""
        self._refresh_named(code, ())

    def _refresh_named(self, code, skip):
        if self.cp is None or not code or (self._moved is not None and not self._moved):
            return
        names = set(_IDENTIFIER.findall(code)) - set(skip)
        if self._moved is not None:
            names &= self._moved
        if names:
            self._refresh(sorted(names))

    @contextlib.contextmanager
    def complete_view(self, code):
        """Completion of CODE (a frontend's draft) sees every session variable, within ipykernel's latency:
        as refresh_for, except that a variable a GPU cell changed whose restore would import a framework the
        kernel has not imported (torch: 0.5 s and more) or map more than _COMPLETE_RESTORE_BYTES is stood in
        for, for the completion only, by an object of its type's name whose dir() is the worker's.  JupyterLab
        drops completion replies slower than 1 s; the value itself comes when a CPU cell or an inspection
        reads it."""
        slow = {}
        if self._moved:
            for n in set(_IDENTIFIER.findall(code or "")) & self._moved:
                shape = self._shapes.get(n)
                if shape is not None and (shape[2] > _COMPLETE_RESTORE_BYTES
                                          or any(m not in sys.modules for m in shape[3])):
                    slow[n] = shape
        self._refresh_named(code, slow)
        ns = self.shell.user_ns
        swapped = {}
        for n, (type_name, attrs, _, _) in slow.items():
            swapped[n] = ns.get(n, _NOT_BOUND)
            ns[n] = _completion_stand_in(type_name, attrs)
        try:
            yield
        finally:
            for n, old in swapped.items():
                if old is _NOT_BOUND:
                    ns.pop(n, None)
                else:
                    ns[n] = old

    def worker_made(self):
        """{name: (type, value or None)} of the variables GPU cells saved that this process does not hold as
        committed (it has an older copy or none), by the workers' account: the debugger's variable explorer
        lists them without restoring them.  Empty while the kernel cannot tell which moved."""
        moved = self._moved or ()
        return {n: self._values[n] for n in moved if n in self._values and n not in self.dirty}

    def _note_shapes(self, shapes, saved, deleted):
        """Keep the worker's account (after_gpu's `shapes`) of the values it saved; forget what the cell
        deleted or saved without one."""
        for n in (saved or []) + (deleted or []):
            if isinstance(n, str):
                self._shapes.pop(n, None)
                self._values.pop(n, None)
        if not isinstance(shapes, dict):
            return
        dirs, named = shapes.get("dirs"), shapes.get("names")
        if not isinstance(dirs, list) or not isinstance(named, dict):
            return
        for n, entry in named.items():
            try:
                type_name, idx, nbytes, mods = entry[:4]
                attrs = dirs[idx]
                # The variable explorer's value (zyg._explorer_value), None when the worker gave none.
                value = entry[4] if len(entry) > 4 and isinstance(entry[4], str) else None
                self._values[n] = (str(type_name), value)
                self._shapes[n] = (str(type_name), [a for a in attrs if isinstance(a, str)], int(nbytes),
                                   tuple(m for m in mods if isinstance(m, str)))
            except (TypeError, ValueError, IndexError):
                continue  # a malformed entry: that name is restored for completion, as before

    def _refresh(self, names):
        """Bring NAMES (None: every variable) up to date from the store where a worker changed them, and
        the process state; the kernel's own newer copies (dirty) stay.  Returns the report for
        metadata.looseleaf ({} when no store is open: no GPU cell ran yet), with `error` when the store
        did not answer (or an interrupt came) while something had to be refreshed: then the cell must
        not run on values older than what a worker committed."""
        out = {}
        if self.cp is not None:
            t0 = time.perf_counter()
            out["restored"], out["bytes_restored"] = [], 0
            try:
                if self._moved is None:
                    held = self.cp.held()
                    self._moved = {n for n, v in self.cp.versions().items() if held.get(n) != v}
                self._pull_modules()
                if not self._moved:
                    names = []  # nothing moved: nothing is stale (the common case, with no round trip)
                elif names is None:  # what this process holds, and what workers made or deleted since
                    names = sorted((set(self.cp.held()) | self._moved) - {self._procstate().NAME})
                names = self._stale([n for n in names if n not in self.dirty and not _usermods().is_entry(n)])
                if names:
                    # What a worker committed is to be read: a store that came back empty has it no more,
                    # and the cell must say so rather than meet NameError (or older values).
                    # (before_cpu then fails a cell that reads what was lost)
                    self._lost = self._lost_data() or self._lost
                    if self._lost is not None:
                        return out
                    rep = self.cp.restore(self._saveable(names), protect=sorted(self.dirty))
                    self._unbind_homerefs(rep.restored)
                    self._moved.difference_update(n for n in names if n not in rep.failed)
                    self._moved.difference_update(rep.restored)
                    if rep.failed:
                        log.warning("cannot refresh %s from the store", rep.failed)
                        out["restore_failed"] = rep.failed
                        gone = sorted(n for n, why in rep.failed.items() if why.startswith("StoreUnavailable"))
                        if gone:
                            out.update(_cell_error("StoreUnavailable", "the checkpoint store did not answer; "
                                                   "cannot refresh %s: %s" % (", ".join(gone), rep.failed[gone[0]])))
                    out["restored"], out["bytes_restored"] = sorted(rep.restored), rep.payload_bytes
            except KeyboardInterrupt:
                self._moved = None
                out.update(_cell_error("KeyboardInterrupt", "interrupted while refreshing the cell's variables"))
            except Exception as e:  # noqa: BLE001 - the cell runs with what the namespace has
                log.warning("refreshing variables from the store failed", exc_info=True)
                out["restore_failed"] = {"*": _reason(e)}
                self._moved = None
                if type(e).__name__ in _CELL_ERRORS:
                    out.update(_cell_error(type(e).__name__, "the checkpoint store did not answer: %s" % e))
            try:
                if "error" not in out:
                    self._pull_procstate()
            except KeyboardInterrupt:
                out.update(_cell_error("KeyboardInterrupt", "interrupted while refreshing the process state"))
            except Exception as e:  # noqa: BLE001 - the cell runs with the process state it has
                log.warning("refreshing the process state from the store failed", exc_info=True)
                out["restore_failed"] = {"*": _reason(e)}
            out["restore_ms"] = (time.perf_counter() - t0) * 1e3
        return out

    def _rebound_since(self, before, after=None):
        """Names rebound or deleted since BEFORE (a _visible() snapshot; AFTER: the one now), or new."""
        after = self._visible() if after is None else after
        changed = {k for k, ident in after.items() if before.get(k) != ident}
        changed |= {k for k in before if k not in after}
        return changed

    @contextlib.contextmanager
    def untracked_code(self):
        """A context for user code that runs outside any cell (comm handlers: a widget's callback).  The code
        can read any variable, and no analysis says which: first every variable a worker changed is
        refreshed, as a CPU cell's closure is (nothing to do, and no store round trip, when no GPU cell ran
        since the last refresh).  What it rebinds or deletes in the namespace is dirty, as after a CPU cell,
        so a later GPU cell sees it.  (In-place changes there are as invisible as in a CPU cell the analysis
        cannot see into.)"""
        self._refresh(None)
        before = self._visible()
        try:
            yield
        finally:
            bound = self._rebound_since(before)
            self._mark_dirty(bound)
            self._mods_dirty = True
            self._rebound_here(bound)

    def after_cpu(self, plan):
        """Mark what the CPU cell may have changed as dirty.  Returns what metadata.looseleaf adds: the
        session's homes when the cell rebound a name a worker held."""
        before, self._before = self._before, None
        before_mods, self._before_mods = self._before_mods, {}
        if before is None:
            return {}
        if self._fresh:
            before = {k: v for k, v in before.items() if k not in self._fresh}
            before_mods = {k: v for k, v in before_mods.items() if k not in self._fresh}
            self._fresh = set()
        after, after_mods = split_visible(self.shell)
        bound = self._rebound_since(before, after)  # what the namespace shows bound or deleted
        changed = set(bound)
        # Names bound beyond the analysis (exec, %run, globals()[k] = v): for the gateway's session.
        dynamic = namespace_diff(self.shell.user_ns, dict(before, **before_mods), dict(after, **after_mods),
                                 plan.get("writes"))
        for key in ("writes", "deletes", "state"):
            changed.update(n for n in plan.get(key) or [] if isinstance(n, str))
        if plan.get("unknown"):
            changed.update(self._visible())  # (an unanalysed cell may have changed anything in place)
        self._mark_dirty(changed)
        self._mods_dirty = True
        out = self._rebound_here(bound)
        if dynamic:
            out["dynamic"] = dynamic
        return out

    # ---- between cells --------------------------------------------------------------------------------
    def commit_idle(self):
        """commit_idle_now, then the history's budget kept (looseleaf_store.history)."""
        try:
            return self.commit_idle_now()
        finally:
            self._keep_history()
            self._note_state()

    def _note_state(self):
        """In a store kept for the notebook: what a restore after a crash needs beyond the store (keep.py)."""
        from . import keep
        if self.cp is None or keep.notebook_key() is None:
            return
        try:
            keep.note_state(self, at_risk(self, self.cp.versions()))
        except Exception:  # noqa: BLE001 - a restore then says less
            log.info("cannot note the session's state", exc_info=True)

    def commit_idle_now(self):
        """The kernel stayed idle after user code ran here (a CPU cell, a widget's callback; the gateway's
        idle commit): commit what it made dirty, and the process state, so that the next GPU cell's Run finds
        nothing to commit even when its edit window was too short for a prefetch.  Only in a session whose
        store is open (a CPU-only notebook never starts one), and only when every dirty value is quick to
        save (_quick_to_save): a big array or an arbitrary object would hold up the next request, which may
        be a CPU cell; a prefetch or the Run commits those, as before.  Returns {"saved": [...]}, or
        {"skipped": why}."""
        if self.cp is None:
            return {"skipped": "no store"}
        self.install_outputs()  # in idle time: neither the GPU cell's reply nor the next cell waited for it
        ns = self.shell.user_ns
        try:
            # Committing into a store that came back empty would hide that it did (its commit numbers grow
            # again): the next cell reading what was lost, or the next GPU cell, says so first.
            self._lost = self._lost_data() or self._lost
        except Exception as e:  # noqa: BLE001 - the Run finds out
            return {"skipped": _reason(e)}
        if self._lost is not None:
            return {"skipped": "the checkpoint store came back without its data"}
        names = self._saveable(self.dirty)
        if len(names) > _QUICK_NAMES:
            return {"skipped": "%d names" % len(names), "slow": names}
        # What is slow to save waits for the background commit (commit_slow) or the Run; the rest is
        # committed now, so that a crash loses as little as it can.  (The kernel's commits need not be
        # atomic: _save_batched.)
        slow = [n for n in names if n in ns and not _quick_to_save(ns[n])]
        names = [n for n in names if n not in slow]
        if slow and not names:
            return {"skipped": "not quick to save: %s" % ", ".join(slow[:5]), "slow": slow}
        try:
            self._pull_procstate()  # a worker's newer state first, as before_gpu
            rep = self._push(names, modules=False)  # (a module's globals may be slow: the Run commits them)
        except Exception as e:  # noqa: BLE001 - the Run commits instead
            log.info("idle commit failed", exc_info=True)
            return {"skipped": _reason(e)}
        if rep.error:
            return {"skipped": rep.error}
        self.dirty -= set(rep.saved) | set(rep.unchanged) | set(rep.deleted)
        out = {"saved": sorted(n for n in rep.saved if n != self._procstate().NAME)}
        if slow:
            out["skipped"] = "not quick to save: %s" % ", ".join(slow[:5])
            out["slow"] = slow
        return out

    def commit_slow(self):
        """The kernel stayed idle LOOSELEAF_SLOW_COMMIT_IDLE_S after user code ran (the gateway's background
        commit, after the idle commit): commit every dirty name, the slow to save ones included (big arrays,
        models, nested containers), and the user modules' globals, so that a crash loses nothing.

        It must never hold up a cell, and it runs on the interpreter's (the main) thread, so it gives way:
        the Checkpointer asks _give_way before each variable is pickled, before each payload and between
        the ~64 MiB pieces of a large one (the copies run with the GIL released), and before the commit;
        when a request waits, the save is abandoned: nothing is published (a put is private until a commit
        lists it), the payloads are given back, the names stay dirty, and the gateway tries again after
        another idle spell.  So the committed version of a name is the one before or the whole new one.  A
        thread would not do: the cell it gave way to would change the values under its copy.  What it
        cannot split: pickling one variable's object graph (a nested container of millions of items) runs
        in one piece.  Returns {"saved": [...]}, {"abandoned": true} or {"skipped": why}."""
        if self.cp is None:
            return {"skipped": "no store"}
        try:
            self._lost = self._lost_data() or self._lost
        except Exception as e:  # noqa: BLE001 - the Run finds out
            return {"skipped": _reason(e)}
        if self._lost is not None:
            return {"skipped": "the checkpoint store came back without its data"}
        names = self._saveable(self.dirty)
        if not names and not self._mods_dirty:
            return {"saved": []}
        try:
            check = lambda: _give_way(self)  # noqa: E731
            check()
            self._pull_procstate()
            rep = self._push(names, give_way=check)
        except _GaveWay:
            log.info("background commit of %s gave way to a request", ", ".join(names[:5]))
            return {"abandoned": True}
        except Exception as e:  # noqa: BLE001 - the Run commits instead
            log.info("background commit failed", exc_info=True)
            return {"skipped": _reason(e)}
        finally:
            self._keep_history()
            self._note_state()
        if rep.error:
            return {"skipped": rep.error}
        self.dirty -= set(rep.saved) | set(rep.unchanged) | set(rep.deleted)
        return {"saved": sorted(n for n in rep.saved if n != self._procstate().NAME)}

    # ---- around GPU cells ----------------------------------------------------------------------------
    def before_gpu(self, plan):
        """Commit the dirty part of a GPU cell's closure (and the process state) so its worker can restore
        it.  Returns a dict for the gateway: the store's coordinates and the execution count, or
        `fallback` (why the cell must run here instead), or `error` ({ename, evalue}: the store did not
        answer, or an interrupt came: the cell fails with that error and runs nowhere)."""
        t0 = time.perf_counter()
        try:
            self._open()
        except Exception as e:  # noqa: BLE001 - reported; the cell runs in the interpreter
            return {"fallback": "the checkpoint store cannot start (%s)" % _reason(e)}
        try:
            lost = self._lost_data()
        except KeyboardInterrupt:
            return _cell_error("KeyboardInterrupt", "interrupted while the kernel asked the checkpoint store")
        except Exception as e:  # noqa: BLE001 - the store is unusable
            if type(e).__name__ in _CELL_ERRORS:
                return _cell_error(type(e).__name__, "the checkpoint store did not answer: %s" % e)
            return {"fallback": "the checkpoint store failed (%s)" % _reason(e)}
        ns = self.shell.user_ns
        state = set(self._saveable(plan.get("state") or []))
        # Every dirty name, not only the closure's: the store must know what the kernel's variables share
        # (b = a on a CPU cell, then a GPU cell mutating a): a worker's save re-commits the dependents of
        # what it changed, and a later refresh here then brings b back as the same object as a.  Names
        # deleted here are deletes.  Closure names the kernel holds no stored copy of (defined before
        # tracking began, by a startup file) count as dirty too.
        held = self.cp.held()
        fresh = {n for n in state if n in ns and n not in held}
        names = sorted(self.dirty | fresh)
        procstate = self._procstate()
        # The process state a worker left comes here first: saving ours over it would undo the chdir or
        # seed of an earlier GPU cell (a CPU cell in between has pulled it already: then a no-op).
        try:
            self._pull_procstate()
            rep = self._push(names)
        except KeyboardInterrupt:
            return _cell_error("KeyboardInterrupt", "interrupted while the kernel committed the cell's variables")
        except Exception as e:  # noqa: BLE001 - the store is unusable
            if type(e).__name__ in _CELL_ERRORS:
                return _cell_error(type(e).__name__, "the checkpoint store did not answer: %s" % e)
            return {"fallback": "the checkpoint store failed (%s)" % _reason(e)}
        out = {"kernel_save_ms": (time.perf_counter() - t0) * 1e3, "kernel_bytes_saved": rep.bytes_written,
               "kernel_saved": sorted(n for n in rep.saved if n != procstate.NAME)}
        if rep.error and rep.error_kind in _CELL_ERRORS:
            # Running the cell here instead would meet the variables only workers made with NameError.
            return dict(out, **_cell_error(rep.error_kind, "the checkpoint store did not answer: %s" % rep.error))
        if rep.error:
            return dict(out, fallback="the checkpoint store failed (%s)" % rep.error)
        blocking = {n: why for n, why in rep.failed.items() if n in state or n == procstate.NAME}
        if blocking:
            name, why = sorted(blocking.items())[0]
            return dict(out, fallback="variable '%s' cannot be saved (%s)" % (name, why),
                        unsaveable=blocking)
        self.dirty -= set(rep.saved) | set(rep.unchanged) | set(rep.deleted)
        self._lost = lost or self._lost
        if self._lost is not None and not plan.get("prefetch"):
            # The kernel's own variables are in the store again; the cell would meet the lost ones with
            # NameError (or older values): it fails once, saying which.
            return dict(out, **self._lost_error())
        st = self.store.stats()
        out.update({"store_dir": self.dir, "session": self.session, "redis_url": st.get("redis_url") or "",
                    "execution_count": self.shell.execution_count,
                    "cells_dir": self.shell.compile.session_dir()})
        out.update(self._for_worker(state, plan.get("prefetch")))
        if plan.get("prefetch"):
            # What a prepared worker will hold: the pool's GreedyDual weighs a speculative worker by it.
            try:
                import _llstore
                entries = self.store.fetch(sorted(state))
                out["closure_bytes"] = sum(_llstore.ref_nbytes(r) for e in entries.values() for r in e[2])
            except Exception:  # noqa: BLE001 - an estimate only
                log.info("cannot size the closure of a prefetch", exc_info=True)
        return out

    def install_outputs(self, code=None):
        """Bring GPU cells' results into the output history (Out, _N, and _, __, ___ as the three latest),
        as IPython's displayhook would have put them here.  Restoring a result may import its framework here
        (torch: 0.5 s and more), which must hold up neither the GPU cell's reply nor a CPU cell that does not
        read the history: so it runs in idle time (commit_idle), or before a CPU cell whose CODE reads the
        output history.  Returns the names installed."""
        if not self._pending_out or (code is not None and not _OUTPUT_NAMES.search(code)):
            return []
        shell, ns = self.shell, self.shell.user_ns
        pending, self._pending_out = self._pending_out, []
        out = shell.history_manager.output_hist
        for count, out_name in pending:
            try:
                rep = self.cp.restore([out_name])
                if out_name in ns and not rep.failed:
                    out[count] = ns[out_name]
            except Exception:  # noqa: BLE001 - the output was shown; only the history misses it
                log.warning("cannot bring a GPU cell's result into the output history", exc_info=True)
        ordered = sorted(out.items())  # in the order IPython would have filed them
        out.clear()
        out.update(ordered)
        # _, __, ___: the three latest results, in the displayhook (which shifts them at the next result) and
        # in the namespace, unless the user assigned one of them (IPython's own rule).
        dh = shell.displayhook
        unders = ("_", "__", "___")
        mine = all(ns[u] is getattr(dh, u, None) for u in unders if u in ns)
        latest = [out[c] for c in sorted(out)[-3:]][::-1]
        for name, value in zip(unders, latest):
            setattr(dh, name, value)
            if mine:
                ns[name] = value
        return [name for _, name in pending]

    def after_gpu(self, info):
        """A worker ran the cell (or tried to): history and counter as IPython's run_cell keeps them, and
        the namespace follows what the worker saved and deleted."""
        shell = self.shell
        code = info.get("code")
        self.note_imports(code)
        count = info.get("execution_count")
        # store_history=False: IPython neither records the cell nor advances its counter.
        keep = bool(info.get("store_history", True)) and not info.get("silent")
        if isinstance(code, str) and isinstance(count, int) and keep:
            try:
                shell.history_manager.store_inputs(count, code, code)
            except Exception:  # noqa: BLE001 - history is a convenience, the cell ran
                log.warning("cannot record a GPU cell in the history", exc_info=True)
        ns = shell.user_ns
        out_name = "_%d" % count if isinstance(count, int) and keep else None
        if out_name and out_name in (info.get("saved") or []) and self.cp is not None:
            # The cell's result (saved by its worker as _N) enters Out, _, __, ___ later (install_outputs):
            # restoring it may import its framework here (torch: 0.5 s and more), which must not hold up
            # the GPU cell's reply.
            self._pending_out.append((count, out_name))
        if isinstance(count, int) and keep:
            shell.execution_count = count + 1
        for n in info.get("deleted") or []:
            if isinstance(n, str):
                ns.pop(n, None)
                self.dirty.discard(n)
        for n in info.get("saved") or []:
            self.dirty.discard(n)
            if isinstance(n, str):
                self._stored.add(n)
        self._stored.difference_update(n for n in info.get("deleted") or [] if isinstance(n, str))
        # The worker's commit is what the store must hold from now on (_lost_data): a store that comes back
        # empty is then told from one that simply has not moved since the kernel's own last commit.
        if isinstance(info.get("committed"), int):
            self._seen_version = max(self._seen_version, info["committed"])
        self._ps_moved = True
        saved, deleted = info.get("saved"), info.get("deleted")
        if self._moved is not None and isinstance(saved, list) and isinstance(deleted, list) and \
                not info.get("unknown"):
            self._moved.update(n for n in saved + deleted if isinstance(n, str))
        else:
            self._moved = None
        self._note_shapes(info.get("shapes"), saved, deleted)
        for n in (saved or []) + (deleted or []):
            self.lost.pop(n, None)  # bound again (or deleted) by the cell
            self.graph_lost.pop(n, None)
        if isinstance(info.get("home"), dict):
            self._adopt_home(info["home"], info.get("worker_pid"))
        self._update_lost_names()
        if info.get("saved") and not info.get("unknown"):
            # What the worker committed superseded versions: keep the history's budget now (one read of its
            # index, bounded by LL_HISTORY_VERSIONS), not only when idle, which a "Run all" never is, so
            # old versions hold at most the budget even between cells.  Only after a commit that happened
            # (Redis answered it a moment ago): a cell that failed or was interrupted, perhaps because the
            # store went silent, must not wait for that store again before its reply; idle time prunes.
            self._keep_history()
        return {"home": self.home}

    # ---- homes ----------------------------------------------------------------------------------------
    def _adopt_home(self, home, pid):
        """HOME: what the worker PID that ran the session's last cell is the home of.  A held name another
        worker was home of, and which this one does not hold, went with that worker."""
        for n, h in list(self.home.items()):
            if n in home or h.get("pid") == pid:
                continue
            self._went(n, h, "which is gone")
        ns = self.shell.user_ns
        self.home = {n: h for n, h in home.items() if isinstance(n, str) and isinstance(h, dict)}
        for n, h in self.home.items():
            self.lost.pop(n, None)
            self.graph_lost.pop(n, None)
            if h.get("kind") == "held":
                # Its live value is the worker's: an older one here must not be read or saved.
                ns.pop(n, None)
                self.dirty.discard(n)

    def _went(self, name, h, why):
        """Home name NAME (its entry H) lost its worker (WHY: how it went)."""
        if h.get("kind") == "held":
            self.lost[name] = "'%s' lived only in worker %s (%s), %s" % (name, h.get("pid"), h.get("what"), why)
        elif h.get("kind") == "graph":
            self.graph_lost[name] = ("LooseLeaf: '%s' lost its autograd graph: it lived in worker %s, %s; its "
                                     "value is restored without it\n" % (name, h.get("pid"), why))

    def home_lost(self, content):
        """Workers of the session went (the host pool told: evicted, died, the pool went away):
        content {gone: [{pid, why}]}, pid 0 for every worker.  Their held names are lost, their graph names
        keep their saved values without the graph.  Returns {home}."""
        for ev in content.get("gone") or []:
            if not isinstance(ev, dict):
                continue
            pid, why = ev.get("pid") or 0, ev.get("why") or "which is gone"
            for n, h in list(self.home.items()):
                if not pid or h.get("pid") == pid:
                    self._went(n, h, why)
                    del self.home[n]
            if pid:
                # Names found lost before the pool said why (a cell reached them first).
                mark = "worker %d" % pid
                for table in (self.lost, self.graph_lost):
                    for n, msg in list(table.items()):
                        at = msg.find(mark)
                        if at >= 0 and not msg[at + len(mark):at + len(mark) + 1].isdigit() and \
                                "which is gone" in msg:
                            table[n] = msg.replace("which is gone", why)
        self._update_lost_names()
        return {"home": self.home}

    def _update_lost_names(self):
        """The shell's {name: message} for names whose value is not here: lost ones, and held ones whose
        home is a worker (this cell then runs here only because that worker could not take it)."""
        ns = self.shell.user_ns
        names = dict(self.lost)
        for n, h in self.home.items():
            if h.get("kind") == "held" and n not in ns:
                names[n] = "'%s' lives only in worker %s (%s), and this cell ran in the kernel" % (
                    n, h.get("pid"), h.get("what"))
        self.shell.lost_names = names

    def _unbind_homerefs(self, names):
        """A HomeRef among the restored NAMES is no value: it leaves the namespace (a worker holds the value,
        or held it)."""
        from looseleaf_store.homes import HomeRef
        ns = self.shell.user_ns
        for n in names:
            v = ns.get(n)
            if type(v) is HomeRef:
                ns.pop(n, None)
                if n not in self.home and n not in self.lost:
                    self.lost[n] = "'%s' lived only in worker %d (%s), which is gone" % (n, v.pid, v.what)
        self._update_lost_names()

    def _mark_dirty(self, names):
        """NAMES may have changed here: dirty, but for a held or lost name this process has no value of
        (saving it would delete the worker's value, or the record of its loss)."""
        ns = self.shell.user_ns
        self.dirty.update(n for n in self._saveable(names)
                          if n in ns or (n not in self.home and n not in self.lost))

    def _rebound_here(self, names):
        """NAMES were bound or deleted by code run here: no worker is their home, none lost them.  Returns
        {home} for metadata.looseleaf when that changed the session's homes, else {}."""
        moved = [n for n in names if n in self.home]
        for n in names:
            self.home.pop(n, None)
            self.lost.pop(n, None)
            self.graph_lost.pop(n, None)
        self._update_lost_names()
        return {"home": self.home} if moved else {}

    def _for_worker(self, state, prefetch):
        """What the worker running a cell with closure STATE needs to know of homes: {lost: {name: message}}
        of lost names it reads, and notices for the graphs they lost (told once)."""
        out = {}
        lost = {n: self.lost[n] for n in state if n in self.lost}
        if lost:
            out["lost"] = lost
        notices = [self.graph_lost.pop(n) for n in sorted(state) if n in self.graph_lost]
        if notices:
            out["notices"] = notices
        return out

    # ---- user modules ------------------------------------------------------------------------------------
    def _module_entries(self):
        """The entries of the user's modules when code run here may have changed their globals (bound in the
        namespace, usermods.py), else []."""
        usermods = _usermods()
        am = getattr(getattr(self.shell, "magics_manager", None), "registry", {}).get("AutoreloadMagics")
        reloader = getattr(am, "_reloader", None)
        if reloader is not None and getattr(reloader, "enabled", False):
            # %autoreload: a GPU cell reloads what changed on disk first, as a cell here would.
            try:
                reloader.check()
            except Exception:  # noqa: BLE001 - as IPython's own hook: a failed reload is no error here
                log.info("autoreload check failed", exc_info=True)
            self._mods_dirty = True
        if not self._mods_dirty or not usermods.user_modules():
            return []
        return usermods.bind_all(self.shell.user_ns)

    def _pull_modules(self):
        """Bring the globals of user modules a worker committed (their entries moved) into this process."""
        if not self._moved:
            return
        entries = sorted(n for n in self._moved if _usermods().is_entry(n))
        if not entries:
            return
        rep = self.cp.restore(entries)
        if rep.failed:
            log.warning("cannot bring user modules' globals from the store: %s", rep.failed)
        self._moved.difference_update(n for n in entries if n not in rep.failed)


def at_risk(coh, committed):
    """{name: why} of the variables a crash of the kernel right now would lose: what no commit holds (or
    holds only an older version of), and what no store can hold (a crash now would lose them).  COH: the kernel's
    coherence; COMMITTED: {name: version} in its store."""
    from looseleaf_store import homes
    from . import keep
    ns = coh.shell.user_ns
    out = {}
    if coh.cp is None:
        for name in sorted(visible(coh.shell)):
            out[name] = "nothing is committed before the session's first GPU cell"
        return out
    if keep.notebook_key() is None:
        for name in sorted(set(visible(coh.shell)) | set(committed)):
            if not name.startswith("_"):
                out[name] = "no store outlives a kernel run for no known notebook (JPY_SESSION_NAME)"
        return out
    slow_s = slow_commit_idle_s()
    for name, h in coh.home.items():
        if h.get("kind") == "held":
            out[name] = "%s, living only in worker %s: no store can hold it" % (h.get("what"), h.get("pid"))
    for name in sorted(coh._saveable(coh.dirty | {n for n in visible(coh.shell) if n not in committed})):
        if name not in ns or name in out:
            continue
        value = ns[name]
        what = homes._WHAT.get(type(value).__name__)
        if what:
            out[name] = "%s: no store can hold it" % what
        elif _quick_to_save(value):
            out[name] = "not committed yet: committed once the kernel is idle"
        elif slow_s:
            out[name] = ("slow to save, %s: committed in the background once the kernel is idle %g s "
                         "(LOOSELEAF_SLOW_COMMIT_IDLE_S), or by the next GPU cell's Run"
                         % ("its newest version not committed yet" if name in committed else "never committed",
                            slow_s))
        else:
            out[name] = ("slow to save, so not committed when idle: committed by the next GPU cell's Run"
                         if name in committed else "slow to save, never committed: the next GPU cell's Run "
                         "commits it")
    return out

"""Values that stay in the process that made them, so nothing a cell made is lost.

A value no pickle can take (a generator, an iterator over a live DataLoader, an open file, a socket, a lock, a
thread, a CUDA stream or event) cannot move between processes.  A worker that made one keeps it: it commits a
HomeRef in the value's place (Checkpointer.save(stand_in=...)), so the store knows the name, its version and
where it lives, and the worker becomes the session's *home* for it.  Cells that read it run there; a process
that restores a HomeRef it does not own knows the value is not here, and says so (LostVariable) instead of a
bare NameError.  A value whose pickle leaves something out that the process still holds (autograd history,
serial.Pickled.graph) is saved, and its process is its home too while it lives.

`tied` finds the variables whose objects a home value reaches (a DataLoader iterator's dataset, the
parameters at the leaves of a loss's graph): they must be used where the home value is, or the two would part.

Runs in whichever process saves variables (workers; the kernel reads HomeRefs), on the thread that runs cells.
"""
import gc
import sys
import types


class HomeRef:
    """Stands in the store for a value that lives only in worker PID (TOKEN tells that process from a later
    one with the same pid); WHAT says what it is ("a generator")."""

    __slots__ = ("pid", "token", "what")

    def __init__(self, pid, token, what):
        self.pid = pid
        self.token = token
        self.what = what

    def __reduce__(self):
        return (HomeRef, (self.pid, self.token, self.what))

    def __eq__(self, other):
        return isinstance(other, HomeRef) and (self.pid, self.token, self.what) == \
            (other.pid, other.token, other.what)

    def __hash__(self):
        return hash((self.pid, self.token))

    def __repr__(self):
        return "<LooseLeaf: %s, living only in worker %d>" % (self.what, self.pid)


# Type names (or the names pickle's error message gives) -> what the user would call the value.
_WHAT = {
    "generator": "a generator", "async_generator": "an async generator", "coroutine": "a coroutine",
    "_SingleProcessDataLoaderIter": "an iterator over a DataLoader",
    "_MultiProcessingDataLoaderIter": "an iterator over a DataLoader",
    "TextIOWrapper": "an open file", "BufferedReader": "an open file", "BufferedWriter": "an open file",
    "BufferedRandom": "an open file", "FileIO": "an open file", "socket": "a socket", "lock": "a lock",
    "RLock": "a lock", "_thread.lock": "a lock", "_thread.RLock": "a lock", "Thread": "a thread",
    "Stream": "a CUDA stream", "Event": "a CUDA event", "Popen": "a process handle",
    "Connection": "a database connection", "SSLContext": "an SSL context", "frame": "a frame",
}


def describe(value, why):
    """What VALUE is, in the user's words, given WHY its pickle failed ("TypeError: cannot pickle 'x' ...")."""
    w = _WHAT.get(type(value).__name__)
    if w:
        return w
    for quote in ("'", '"'):
        key = "pickle %s" % quote
        if key in why:
            inner = why.split(key, 1)[1].split(quote, 1)[0]
            w = _WHAT.get(inner) or _WHAT.get(inner.rsplit(".", 1)[-1])
            if w:
                return "%s holding %s" % (_article(type(value).__name__), w)
    if "cannot be pickled" in why and "DataLoaderIter" in why:
        return "an iterator over a DataLoader"
    return "%s that cannot be saved (%s)" % (_article(type(value).__name__), why[:120])


def _article(name):
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def tied(owner, ns, names, graph=None, budget=200000):
    """Names of variables whose exported objects the values of NAMES (in NS) reach.  OWNER is the
    Checkpointer's export table (key -> (name, ...)); GRAPH, its refs graph ({name: (version, deps)}), adds
    every variable sharing objects with those, transitively.  Reachability follows object references (not a
    function's globals: those are the namespace) and autograd graphs (grad_fn, next_functions and the
    leaves they accumulate into), at most BUDGET objects."""
    home = set(names)
    # Module globals are no values of the session (held in a list: a module's __dict__ may be made on access,
    # and a freed one's id would be reused).
    module_dicts = [d for d in (getattr(m, "__dict__", None) for m in list(sys.modules.values())) if d is not None]
    skip = {id(ns), id(sys.modules)} | {id(d) for d in module_dicts}
    torch = sys.modules.get("torch")
    tensor_t = torch.Tensor if torch is not None else ()
    found = set()
    seen = set()
    held = []  # what was visited stays alive, so no id in SEEN is reused (autograd nodes are fresh wrappers)
    stack = [ns[n] for n in names if n in ns]
    atoms = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType, types.CodeType,
             types.BuiltinFunctionType)
    while stack and budget > 0:
        o = stack.pop()
        if id(o) in seen or id(o) in skip or isinstance(o, atoms):
            continue
        seen.add(id(o))
        held.append(o)
        budget -= 1
        own = owner.get(id(o))
        if own is not None and own[0] not in home:
            found.add(own[0])
            continue
        if torch is not None and isinstance(o, tensor_t):
            try:
                from .serial import storage_key, untyped_storage
                own = owner.get(storage_key(untyped_storage(o))) if o.layout == torch.strided else None
            except Exception:  # noqa: BLE001 - a tensor without a plain storage
                own = None
            if own is not None and own[0] not in home:
                found.add(own[0])
            for attr in ("grad_fn", "grad", "_base") if o.is_leaf else ("grad_fn", "_base"):
                try:
                    v = getattr(o, attr)
                except Exception:  # noqa: BLE001
                    v = None
                if v is not None:
                    stack.append(v)
            stack.extend(gc.get_referents(o))
            continue
        nf = getattr(o, "next_functions", None) if type(o).__module__ in ("torch.autograd.graph", "builtins",
                                                                             "torch._C._functions") else None
        if isinstance(nf, tuple):
            # An autograd node: its inputs' nodes, and the leaf it accumulates into.
            stack.extend(fn for fn, _ in nf if fn is not None)
            v = getattr(o, "variable", None)
            if v is not None:
                stack.append(v)
            continue
        if isinstance(o, types.FunctionType):
            stack.extend(c.cell_contents for c in (o.__closure__ or ()) if _cell_full(c))
            stack.extend(o.__defaults__ or ())
            stack.extend((o.__kwdefaults__ or {}).values())
            continue
        if isinstance(o, types.FrameType):
            stack.extend(o.f_locals.values())
            continue
        if isinstance(o, types.GeneratorType):
            if o.gi_frame is not None:
                stack.extend(o.gi_frame.f_locals.values())
            continue
        stack.extend(gc.get_referents(o))
    if graph and found:
        found = component(graph, found) - home
    return found


def _cell_full(c):
    try:
        c.cell_contents
        return True
    except ValueError:
        return False


def component(graph, names):
    """NAMES and every variable connected to them in the refs GRAPH ({name: (version, deps)}), either way."""
    adj = {}
    for n, (_, deps) in graph.items():
        for d in deps:
            adj.setdefault(n, set()).add(d)
            adj.setdefault(d, set()).add(n)
    out = set(names)
    todo = list(names)
    while todo:
        for m in adj.get(todo.pop(), ()):
            if m not in out:
                out.add(m)
                todo.append(m)
    return out

"""Modules the user wrote are session state.

A module imported from the user's own files (not the standard library, not site-packages, not LooseLeaf) keeps
module globals a notebook changes: a counter a function of it bumps, an attribute a cell sets on it, a cache.
Each such module is saved as a store entry of its own, `ENTRY_PREFIX + module name`, bound in the namespace to
the module object itself (the name is no identifier, so no cell can use it; `coherence.visible` and %who skip
it).  Pickled as the top-level value of its entry, a user module goes by the value of its globals (serial.py
calls reduce_module) - its functions and classes excepted, which its source defines - with a fingerprint of
its code.  Restoring the entry imports the module where it is missing, reloads it when the saving process ran
other code (the file was edited and reloaded there: importlib.reload, %autoreload), then makes its globals the
saved ones.  Every other reference to a user module (a function's globals, a value holding it) still goes by
reference, so after restore it is the same module object.

Runs in whichever process saves or restores variables (the kernel, workers), on the thread that runs cells.
"""
import hashlib
import importlib
import marshal
import os
import site
import sys
import sysconfig
import types

ENTRY_PREFIX = "__looseleaf_module__."  # (serial.MODULE_ENTRY_PREFIX)

# Values a module global may hold that no pickle takes (kept as the importing process has them).
_SKIP_TYPES = ("lock", "RLock", "Condition", "Semaphore", "Thread", "Event", "socket", "generator")

_roots = None  # directories whose modules are not the user's
_verdict = {}  # module name -> (module, whether it is the user's): sys.modules is scanned at every save
_NOT_USERS = ("sitecustomize", "usercustomize")


def _excluded_roots():
    global _roots
    if _roots is None:
        dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            try:
                dirs.add(sysconfig.get_paths()[key])
            except KeyError:
                pass
        try:
            dirs.update(site.getsitepackages())
        except AttributeError:
            pass
        try:
            dirs.add(site.getusersitepackages())
        except AttributeError:
            pass
        # LooseLeaf's own packages (looseleaf_kernel, looseleaf_store, ...), wherever the tree is.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        dirs.add(here)
        _roots = tuple(sorted(os.path.join(os.path.realpath(d), "") for d in dirs if d))
    return _roots


def is_user_module(mod):
    """Whether module MOD was imported from the user's own files."""
    name = getattr(mod, "__name__", None)
    path = getattr(mod, "__file__", None)
    if not isinstance(name, str) or not isinstance(path, str) or name == "__main__" or \
            name.startswith(("_", "looseleaf")) or name in _NOT_USERS or not os.path.isabs(path):
        return False
    if not path.endswith((".py", ".pyc")):
        return False  # extension modules: compiled code, no globals worth carrying
    real = os.path.realpath(path)
    return not real.startswith(_excluded_roots())


def user_modules():
    """{module name: module} of the user modules this process imported."""
    out = {}
    for name, m in list(sys.modules.items()):
        v = _verdict.get(name)
        if v is None or v[0] is not m:
            v = _verdict[name] = (m, isinstance(m, types.ModuleType) and is_user_module(m))
        if v[1]:
            out[name] = m
    if len(_verdict) > 2 * len(sys.modules) + 64:
        for name in [n for n in _verdict if n not in sys.modules]:
            del _verdict[name]
    return out


def entry(name):
    """The store entry of user module NAME."""
    return ENTRY_PREFIX + name


def is_entry(name):
    return isinstance(name, str) and name.startswith(ENTRY_PREFIX)


def bind_all(ns):
    """Bind every user module of this process into NS under its entry name; returns the entry names."""
    out = []
    for name, m in user_modules().items():
        k = entry(name)
        if ns.get(k) is not m:
            ns[k] = m
        out.append(k)
    return sorted(out)


def _defined_here(mod, value):
    """Whether VALUE is a function or class module MOD's own source defines (its import or reload makes it)."""
    return isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == mod.__name__


def _is_data(mod, key, value):
    if key.startswith("__") and key.endswith("__"):
        return False
    if isinstance(value, types.ModuleType) or _defined_here(mod, value):
        return False
    return type(value).__name__ not in _SKIP_TYPES


def fingerprint(mod):
    """A digest of the code module MOD runs (its functions' and classes' code): two processes that loaded
    different versions of the file, or one that reloaded it, disagree."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(k for k in mod.__dict__ if isinstance(k, str)):
        v = mod.__dict__[key]
        if not _defined_here(mod, v):
            continue
        codes = [v.__code__] if isinstance(v, types.FunctionType) else \
            [f.__code__ for _, f in sorted(vars(v).items()) if isinstance(f, types.FunctionType)]
        h.update(key.encode())
        for c in codes:
            try:
                h.update(marshal.dumps(c))
            except ValueError:
                h.update(repr(c).encode())
    return h.hexdigest()


def reduce_module(mod):
    """How serial.py pickles user module MOD as its entry's value."""
    state = {k: v for k, v in mod.__dict__.items() if isinstance(k, str) and _is_data(mod, k, v)}
    return (_rebuild_module, (mod.__name__, fingerprint(mod), state))


# Set on a module (its name) whose code here is not the session's: the file changed since the session
# loaded it, so no import or reload here gets the session's code.
STALE_ATTR = "__looseleaf_stale__"


def _rebuild_module(name, fp, state):
    mod = sys.modules.get(name)
    if mod is None:
        mod = importlib.import_module(name)
    elif fingerprint(mod) != fp:
        mod = importlib.reload(mod)  # edited and reloaded where it was saved
    mod.__dict__.pop(STALE_ATTR, None)
    if fingerprint(mod) != fp:
        mod.__dict__[STALE_ATTR] = name
    d = mod.__dict__
    for k in [k for k, v in d.items() if isinstance(k, str) and _is_data(mod, k, v) and k not in state]:
        del d[k]
    d.update(state)
    return mod

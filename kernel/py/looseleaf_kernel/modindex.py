"""The names of modules the kernel has not imported, for completion.

Completing `torch.ar` or `from torch import ar` in a kernel that never imported torch made jedi and IPython
import it into the kernel (3-4 s), and the GPU cell sent meanwhile waited behind that completion.  Completion
answers such drafts from this index instead: per top-level package, {module: {name: kind}} of the package and
the submodules importing it loaded, as dir() sees them.

Who writes it: the zygote, right after it imported its head (torch, numpy, ...; it has them anyway), and
otherwise a throwaway process the kernel starts in the background (this file run by the kernel's Python with
the package's name, at low priority and with CUDA hidden), never the kernel itself.  Completion asked before the index
exists answers without the package's names (the frontend asks again as the user types on).

Where: one JSON file per package under $XDG_CACHE_HOME/looseleaf/modindex/<environment key>/, written
atomically; it names the package's file and that file's mtime, so an upgraded package is indexed afresh.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import types

__all__ = ["lookup", "ensure", "write_for", "kind_of", "has_source"]

_MAX_DEPTH = 2          # submodules below the package that are indexed: torch.nn.functional, not deeper
_MAX_MODULES = 400      # a package with more imported submodules is indexed in part (the shallow ones first)

_cache = {}   # top -> (file mtime, parsed index)
_building = {}  # top -> Popen of the process writing its index


def _dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    # The environment, not the program: the kernel embeds the interpreter the zygote runs as a program.
    env = "%s|%s" % (os.path.realpath(sys.prefix), sys.version)
    return os.path.join(base, "looseleaf", "modindex", hashlib.sha256(env.encode()).hexdigest()[:16])


def _origin(top):
    """(file, mtime) of package TOP found on sys.path without importing it, or None."""
    import importlib.machinery
    try:
        spec = importlib.machinery.PathFinder.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    try:
        return spec.origin, os.stat(spec.origin).st_mtime
    except OSError:
        return None


def has_source(top):
    """Whether package TOP is installed where the import system would find it (not a built-in module)."""
    return _origin(top) is not None


def kind_of(value):
    """IPython's completion type of VALUE: module, class, function or instance."""
    if isinstance(value, types.ModuleType):
        return "module"
    if isinstance(value, type):
        return "class"
    if callable(value):
        return "function"
    return "instance"


def _names(mod):
    out = {}
    try:
        names = dir(mod)
    except Exception:  # noqa: BLE001 - a module whose __dir__ fails has no names to offer
        return out
    # From the module's dict, never getattr: a module's __getattr__ may import (torch's lazy submodules), and
    # the zygote must import nothing it did not choose to.  A name only __dir__ knows is an instance.
    d = getattr(mod, "__dict__", {})
    for n in names:
        if isinstance(n, str):
            out[n] = kind_of(d[n]) if n in d else "instance"
    return out


def write_for(tops, missing_only=False):
    """Write the index of each package of TOPS that this process imported (MISSING_ONLY: unless a current
    one exists); returns the names written.  Cheap (dir() of modules already loaded, ~10 ms for torch): the
    zygote calls it after importing its head."""
    written = []
    for top in tops:
        if not isinstance(top, str) or top not in sys.modules or top.startswith("_") or \
                (missing_only and _load(top) is not None):
            continue
        origin = _origin(top)
        if origin is None:
            continue
        mods = sorted((n for n in list(sys.modules) if n == top or n.startswith(top + ".")),
                      key=lambda n: (n.count("."), n))
        index = {}
        for n in mods[:_MAX_MODULES]:
            parts = n.split(".")
            if len(parts) - 1 > _MAX_DEPTH or any(p.startswith("_") for p in parts[1:]):
                continue
            m = sys.modules.get(n)
            if isinstance(m, types.ModuleType):
                index[n] = _names(m)
        path = os.path.join(_dir(), top + ".json")
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % top)
            with os.fdopen(fd, "w") as f:
                json.dump({"origin": origin[0], "mtime": origin[1], "modules": index}, f)
            os.replace(tmp, path)
            written.append(top)
        except OSError:
            continue
    return written


def _load(top):
    path = os.path.join(_dir(), top + ".json")
    try:
        st = os.stat(path)
    except OSError:
        return None
    hit = _cache.get(top)
    if hit is not None and hit[0] == st.st_mtime:
        return hit[1]
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    origin = _origin(top)
    if not isinstance(data, dict) or origin is None or data.get("origin") != origin[0] \
            or data.get("mtime") != origin[1] or not isinstance(data.get("modules"), dict):
        return None  # written for another version of the package
    _cache[top] = (st.st_mtime, data["modules"])
    return data["modules"]


def lookup(module):
    """{name: kind} of MODULE ("torch", "torch.nn") from the index, or None when it is not indexed."""
    index = _load(module.split(".")[0])
    if index is None:
        return None
    names = index.get(module)
    return names if isinstance(names, dict) else None


def ensure(top):
    """Start writing the index of package TOP in a throwaway process unless it exists or is being written.
    Returns at once."""
    p = _building.get(top)
    if p is not None:
        if p.poll() is None:
            return
        del _building[top]
        if p.returncode != 0:
            return  # it cannot be imported here: not again in this kernel
    if _load(top) is not None or _origin(top) is None:
        return
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    # This file by path, not `-m looseleaf_kernel.modindex`: the package needs the kernel's C module.
    boot = ("import importlib.util as u, sys; s = u.spec_from_file_location('looseleaf_modindex', %r); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); sys.exit(m._main(sys.argv[1:]))"
            % os.path.abspath(__file__))
    try:
        _building[top] = subprocess.Popen(
            [sys.executable, "-c", boot, top], env=env, cwd="/", stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    except OSError:
        pass


def _main(argv):
    import importlib
    os.nice(10)  # here, not by preexec_fn: the kernel that starts it has threads
    for top in argv:
        importlib.import_module(top)
    return 0 if write_for(argv) == list(argv) else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

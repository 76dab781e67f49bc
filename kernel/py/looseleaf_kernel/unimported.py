"""Completion that never imports a package into the kernel.

jedi imports the compiled modules of a package it reads (`import torch\\ntorch.a` imports torch._C, so torch)
and IPython's import completer imports the package of `from torch import ar`: 3-4 s of the interpreter thread
per completion, while the GPU cell the user runs next waits behind it for the kernel's part of its run.

So, on the interpreter thread:
- answer(): a draft whose cursor is at `pkg.sub.prefix` or `from pkg.sub import prefix`, where the name
  resolves (through the draft's own imports and aliases) to a package the kernel has not imported and the
  session has no variable of that name, is answered from modindex (the names as dir() sees them, written by
  the zygote or a throwaway process), without jedi: at once, whatever the package's size;
- imports_held(): around every other completion, jedi's and IPython's import points import nothing new, and
  jedi does not read such a package's files either (for torch that alone takes ~2.5 s the first time, the
  same hold-up): `x = torch.zeros(3)` then `x.res` in a draft completes nothing until the cell has run
  (then x is a session variable, completed from its worker's account); IPython's import completer lists
  submodules from the file system and names from the index.
"""
import contextlib
import importlib.machinery
import pkgutil
import re
import sys

from . import modindex

__all__ = ["answer", "imports_held"]

_NAME = r"[A-Za-z_]\w*"
_DOTTED = r"%s(?:\s*\.\s*%s)*" % (_NAME, _NAME)
# The cursor after `a.b.` or `a.b.pre` (not after another dot or inside a longer name).
_ATTR = re.compile(r"(?<![\w.])(%s)\s*\.\s*(%s)?$" % (_DOTTED, _NAME))
# The cursor in the name list of `from a.b import x, pre`.
_FROM = re.compile(r"^\s*from\s+(%s)\s+import\s+(?:\(\s*)?(?:%s\s*(?:as\s+%s\s*)?,\s*)*(%s)?$"
                   % (_DOTTED, _NAME, _NAME, _NAME))
_IMPORT_LINE = re.compile(r"^\s*(?:import|from)\s")
_IMPORT_STMT = re.compile(r"^\s*import\s+(.+?)\s*(?:#.*)?$", re.M)
_FROM_STMT = re.compile(r"^\s*from\s+(%s)\s+import\s+\(?([^#)]+)" % _DOTTED, re.M)


def _bindings(code):
    """{name: module path} that the draft's import statements bind (`import a.b` binds a to a, `import a.b as
    c` binds c to a.b, `from a import b as c` binds c to a.b)."""
    out = {}
    for m in _IMPORT_STMT.finditer(code):
        for part in m.group(1).split(","):
            words = part.split()
            if not words or not re.fullmatch(_DOTTED, words[0]):
                continue
            if len(words) == 3 and words[1] == "as":
                out[words[2]] = words[0]
            elif len(words) == 1:
                out[words[0].split(".")[0]] = words[0].split(".")[0]
    for m in _FROM_STMT.finditer(code):
        for part in m.group(2).split(","):
            words = part.split()
            if words and re.fullmatch(_NAME, words[0]):
                alias = words[2] if len(words) == 3 and words[1] == "as" else words[0]
                out[alias] = m.group(1) + "." + words[0]
    return out


def _locations(module):
    """The directories of package MODULE ("a.b"), found without importing it (nor its parents), or None."""
    locations = None
    for part in module.split("."):
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, locations)
        except (ImportError, ValueError):
            return None
        if spec is None or spec.submodule_search_locations is None:
            return None
        locations = list(spec.submodule_search_locations)
    return locations


def _names(module):
    """{name: kind} of MODULE without importing it: the index's, plus its submodules on disk; None when the
    index does not have it (then the index is started)."""
    names = modindex.lookup(module)
    if names is None:
        modindex.ensure(module.split(".")[0])
    out = dict(names or {})
    for info in pkgutil.iter_modules(_locations(module) or []):
        out.setdefault(info.name, "module")
    return out if names is not None or out else None


def _unimported(module):
    top = module.split(".")[0]
    return top not in sys.modules and modindex.has_source(top)


def _sort_key(name):
    # IPython's order (completer.completions_sorting_key): public names, then _x, then __x__.
    return (name.startswith("__"), name.startswith("_"), name.lower(), name)


def answer(code, cursor_pos, user_ns):
    """The complete_reply content for CODE at CURSOR_POS when it completes names of a package the kernel has
    not imported, else None (complete as usual)."""
    before = code[:cursor_pos]
    line = before.rsplit("\n", 1)[-1]
    m = _FROM.match(line)
    if m:
        module, prefix = re.sub(r"\s+", "", m.group(1)), m.group(2) or ""
    elif _IMPORT_LINE.match(line):
        return None  # `import a.b` / `from a.b`: module names, IPython's import completer (imports_held)
    else:
        m = _ATTR.search(line)
        if not m:
            return None
        dotted, prefix = re.sub(r"\s+", "", m.group(1)).split("."), m.group(2) or ""
        if dotted[0] in user_ns:
            return None  # a variable of the session (a module the kernel has, or anything else)
        # Bound by the draft, else by a cell that ran (a GPU cell's `import torch` binds torch in the session,
        # not in the kernel's namespace until a CPU cell reads it).
        bound = _bindings(code).get(dotted[0])
        if bound is None:
            history = user_ns.get("In")
            if isinstance(history, list):
                bound = _bindings("\n".join(c for c in history if isinstance(c, str))).get(dotted[0])
        if bound is None:
            return None
        module = ".".join([bound] + dotted[1:])
    if not _unimported(module):
        return None
    names = _names(module) or {}
    hide = not prefix.startswith("_")
    matches = sorted((n for n in names if n.startswith(prefix) and not (hide and n.startswith("_"))),
                     key=_sort_key)
    start = cursor_pos - len(prefix)
    return {"matches": matches, "cursor_start": start, "cursor_end": cursor_pos, "status": "ok",
            "metadata": {"_jupyter_types_experimental": [
                {"start": start, "end": cursor_pos, "text": n, "type": names[n], "signature": ""}
                for n in matches]}}


@contextlib.contextmanager
def imports_held():
    """While completing: jedi's compiled-module loader and IPython's import completer import no package
    the kernel has not imported."""
    patched = []
    try:
        import jedi.inference.compiled.access as access
    except ImportError:
        access = None
    if access is not None and hasattr(access, "load_module"):
        load = access.load_module

        def load_module(inference_state, dotted_name, *a, **k):
            if _unimported(dotted_name):
                return None  # jedi's answer for a module that cannot be imported: it reads files instead
            return load(inference_state, dotted_name, *a, **k)
        patched.append((access, "load_module", load))
        access.load_module = load_module
    try:
        from jedi.inference import imports as jedi_imports
        from jedi.inference.base_value import NO_VALUES
    except ImportError:
        jedi_imports = None
    if jedi_imports is not None and hasattr(jedi_imports, "import_module_by_names"):
        by_names = jedi_imports.import_module_by_names

        def import_module_by_names(inference_state, import_names, *a, **k):
            first = import_names[0] if import_names else None
            first = getattr(first, "value", first)
            if isinstance(first, str) and _unimported(first):
                return NO_VALUES  # as for a package that is not installed: nothing read, nothing imported
            return by_names(inference_state, import_names, *a, **k)
        patched.append((jedi_imports, "import_module_by_names", by_names))
        jedi_imports.import_module_by_names = import_module_by_names
    try:
        from IPython.core import completerlib
    except ImportError:
        completerlib = None
    if completerlib is not None and hasattr(completerlib, "try_import"):
        try_import = completerlib.try_import

        def guarded_try_import(mod, only_modules=False):
            mod = mod.rstrip(".")
            if not _unimported(mod):
                return try_import(mod, only_modules)
            names = _names(mod) or {}
            return [n for n, kind in names.items() if not only_modules or kind == "module"]
        patched.append((completerlib, "try_import", try_import))
        completerlib.try_import = guarded_try_import
    try:
        yield
    finally:
        for owner, name, value in reversed(patched):
            setattr(owner, name, value)

"""No two C files of a module need each other: inside each module, the files' "uses" graph has no circle.

A file that was split only because it grew too long keeps calling back into its other half, and a reader then
has to hold both to understand either.  Split by concept instead, so that each file uses only lower ones (a
self-test that exercises its siblings lives in its own `*_selftest.c`, above them).

"Uses" is read from the built objects, not guessed from the text: file A uses file B of the same module when
an undefined symbol of build/<module>/A.o is a global symbol (function or data) that build/<module>/B.o
defines (`nm -P`).  That sees every call and every shared variable, including ones made through a macro, and
is blind to comments and to names that merely look alike.  What it cannot see, types and static inlines of a
header, are shared through headers, whose include graph tests/tree/test_layering.py checks for circles.

Needs the objects of `make all`; a missing or stale object fails the test with what to run.
"""
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(REPO, "build")
# nm -P kinds of a symbol an object defines for others (text, data, bss, read-only, weak, common, small data).
DEFINED = set("TDBRVWGSC")


def _modules():
    """The top-level directories that hold C sources and a make fragment (a module), tests/ aside."""
    out = []
    for name in sorted(os.listdir(REPO)):
        d = os.path.join(REPO, name)
        if name.startswith(".") or name in ("tests", "build") or not os.path.isdir(d):
            continue
        files = os.listdir(d)
        if any(f.endswith(".c") for f in files) and any(f.endswith(".mk") for f in files):
            out.append(name)
    return out


def _symbols(obj):
    """(defined global symbols, undefined symbols) of object file OBJ."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        if parts[1] == "U":
            undefined.add(parts[0])
        elif parts[1] in DEFINED:
            defined.add(parts[0])
    return defined, undefined


def uses_graph(module):
    """{file: {files of MODULE it uses}} and {(file, used file): [symbols]} from build/MODULE/*.o."""
    sources = sorted(f for f in os.listdir(os.path.join(REPO, module)) if f.endswith(".c"))
    missing, stale, objs = [], [], {}
    for src in sources:
        obj = os.path.join(BUILD, module, src[:-2] + ".o")
        if not os.path.exists(obj):
            missing.append("%s/%s" % (module, src))
        elif os.path.getmtime(obj) < os.path.getmtime(os.path.join(REPO, module, src)):
            stale.append("%s/%s" % (module, src))
        else:
            objs[src] = obj
    if missing or stale:
        pytest.fail("run `make all` first:%s%s" % (" no object for %s." % missing if missing else "",
                                                   " stale object for %s." % stale if stale else ""))
    definer, undefined = {}, {}
    for src, obj in objs.items():
        defined, undefined[src] = _symbols(obj)
        for sym in defined:
            definer.setdefault(sym, src)
    graph, why = {}, {}
    for src in objs:
        graph[src] = set()
        for sym in sorted(undefined[src]):
            dep = definer.get(sym)
            if dep and dep != src:
                graph[src].add(dep)
                why.setdefault((src, dep), []).append(sym)
    return graph, why


def circles(graph):
    """The strongly connected components of GRAPH with more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circle_finder_finds_circles():
    """The finder itself: a circle of three, a pair, and a chain that is none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("module", _modules())
def test_no_circle_between_files_of_a_module(module):
    graph, why = uses_graph(module)
    found = circles(graph)
    lines = []
    for comp in found:
        lines.append("circle: " + ", ".join("%s/%s" % (module, f) for f in comp))
        for a in comp:
            for b in comp:
                if (a, b) in why:
                    lines.append("    %s uses %s: %s" % (a, b, ", ".join(why[(a, b)][:6])))
    assert not found, "files of %s that need each other:\n" % module + "\n".join(lines)

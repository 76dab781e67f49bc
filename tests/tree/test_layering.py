"""The tree's shape, checked: dependencies point one way, nothing includes or imports in a circle, and no C
file or function grows past what one reader can hold without saying why.

Layers (a module may include or import only its own and lower layers):

    base  <-  proto, policy  <-  store, kernel  <-  analysis  <-  hostd  <-  zygote  <-  sim  <-  gateway  <-  cli

policy/ holds the pure decisions (scheduling, GreedyDual, placement, provisioning, the GPU slot plan, the broker's
policy): it includes nothing but base/ and the C standard library, and sits below every user of it (the host
pool, the broker, the simulator).  store and kernel are siblings (neither includes the other).  hostd/, the host's
slot broker, lends slots to host pools and must never depend on one: it includes nothing of zygote/, and the
pool's side of it (zygote/ll_hostpool_hostd.c) uses only its wire header.  sim/ (the fleet simulator) uses the
policies and the cell analysis.  gateway/ is the kernel gateway (it uses the host pool's client API).  cli/ is
the `looseleaf` program's dispatcher, the only module at the top: it starts every role, and nothing includes it;
only it may use sim/.  The Python packages follow the same order: looseleaf_store <- looseleaf_kernel <-
looseleaf_zygote.

Size limits: a C source file over 1,200 lines, or a function over 150 lines, must say why at the top of its
file, in a comment line starting "Why this file is long:" / "Why <function> is long:".
"""
import ast
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK = {"base": 0, "proto": 1, "policy": 1, "store": 2, "kernel": 2, "cluster": 2, "analysis": 3, "hostd": 4, "zygote": 5,
        "sim": 6, "gateway": 7, "cli": 8}
PY_RANK = {"looseleaf_store": 0, "looseleaf_kernel": 1, "looseleaf_zygote": 2}
PY_ROOTS = {"looseleaf_store": "store/py/looseleaf_store", "looseleaf_kernel": "kernel/py/looseleaf_kernel",
            "looseleaf_zygote": "zygote/py/looseleaf_zygote"}
MAX_FILE_LINES = 1200
MAX_FUNCTION_LINES = 150
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([A-Za-z0-9_]+\.h)"', re.M)


def _c_files():
    out = []
    for mod in RANK:
        d = os.path.join(REPO, mod)
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if name.endswith((".c", ".h")):
                out.append("%s/%s" % (mod, name))
    return out


def _read(rel):
    with open(os.path.join(REPO, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def test_c_includes_point_down():
    bad = []
    for rel in _c_files():
        mod = rel.split("/")[0]
        for dep_mod, header in INCLUDE.findall(_read(rel)):
            if dep_mod not in RANK:
                continue
            if dep_mod != mod and RANK[dep_mod] >= RANK[mod]:
                bad.append("%s includes %s/%s" % (rel, dep_mod, header))
    assert not bad, "includes against the layering:\n  " + "\n  ".join(bad)


def _includes(prefix):
    """(file, module, header) for each tree include of the C files under PREFIX ("policy/", ...)."""
    return [(rel, dep_mod, header) for rel in _c_files() if rel.startswith(prefix)
            for dep_mod, header in INCLUDE.findall(_read(rel))]


def test_every_c_module_is_ranked():
    """A new top-level directory of C code must take its place in RANK, or none of these rules would see it."""
    skip = {"tests", "build", "docs", "examples"}
    unranked = sorted(d for d in os.listdir(REPO)
                      if os.path.isdir(os.path.join(REPO, d)) and d not in skip and not d.startswith(".")
                      and d not in RANK and any(n.endswith((".c", ".h")) for n in os.listdir(os.path.join(REPO, d))))
    assert not unranked, "modules of C code missing from RANK: %s" % unranked


# What a pure decision may use of the system: the C standard library (stdio for a self-test's messages), no
# POSIX, no sockets, no threads, no clock.
POLICY_SYSTEM_HEADERS = {"assert.h", "float.h", "inttypes.h", "limits.h", "math.h", "stdbool.h", "stddef.h",
                         "stdint.h", "stdio.h", "stdlib.h", "string.h"}
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)


def test_policy_is_pure_and_below_its_users():
    bad = ["%s includes %s/%s" % (rel, dep, header) for rel, dep, header in _includes("policy/")
           if dep not in ("policy", "base")]
    bad += ["%s includes <%s>" % (rel, header) for rel in _c_files() if rel.startswith("policy/")
            for header in SYSTEM_INCLUDE.findall(_read(rel)) if header not in POLICY_SYSTEM_HEADERS]
    assert not bad, "policy/ is pure decisions on base/ only:\n  " + "\n  ".join(bad)
    users = {rel.split("/")[0] for rel in _c_files() for dep, _ in INCLUDE.findall(_read(rel)) if dep == "policy"}
    users.discard("policy")
    assert {"zygote", "hostd", "sim"} <= users, users
    below = [u for u in sorted(users) if RANK[u] <= RANK["policy"]]
    assert not below, "policy/ must sit below its users: %s" % below


def test_hostd_never_depends_on_the_pool():
    bad = ["%s includes zygote/%s" % (rel, header) for rel, dep, header in _includes("hostd/") if dep == "zygote"]
    assert not bad, "the broker lends slots and must not depend on the host pool:\n  " + "\n  ".join(bad)
    # Nor does it link the pool's files: its build fragment names none.
    mk = [m for m in os.listdir(os.path.join(REPO, "hostd")) if m.endswith(".mk")]
    assert mk, "hostd/ has no build fragment"
    bad = ["hostd/%s names %s" % (m, src) for m in mk for line in _read("hostd/" + m).split("\n")
           if not line.lstrip().startswith("#") for src in re.findall(r"\bzygote/[\w./]+", line)]
    assert not bad, "the broker's build links nothing of zygote/:\n  " + "\n  ".join(bad)
    # The pool's side of the broker speaks its protocol and nothing more of it.
    bad = ["%s includes hostd/%s" % (rel, header) for rel, dep, header in _includes("zygote/")
           if dep == "hostd" and header != "ll_hostd_wire.h"]
    assert not bad, "zygote/ uses only hostd/ll_hostd_wire.h of the broker:\n  " + "\n  ".join(bad)


def test_only_the_dispatcher_at_the_top():
    top = max(RANK.values())
    assert [m for m, r in RANK.items() if r == top] == ["cli"], "cli/ alone is at the top"
    bad = ["%s includes cli/%s" % (rel, header) for rel in _c_files()
           for dep, header in INCLUDE.findall(_read(rel)) if dep == "cli" and not rel.startswith("cli/")]
    assert not bad, "nothing includes the dispatcher:\n  " + "\n  ".join(bad)
    # The kernel gateway is not a dispatcher: the other roles' entry points are cli/'s business.
    bad = ["%s includes %s/%s" % (rel, dep, header) for rel, dep, header in _includes("gateway/")
           if dep in ("hostd", "sim", "cli")]
    assert not bad, "gateway/ is the kernel gateway only:\n  " + "\n  ".join(bad)


def test_only_main_uses_sim():
    bad = ["%s includes sim/%s" % (rel, header) for rel in _c_files()
           for dep_mod, header in INCLUDE.findall(_read(rel))
           if dep_mod == "sim" and not rel.startswith("sim/") and rel != "cli/main.c"]
    assert not bad, "sim/ is used only by cli/main.c:\n  " + "\n  ".join(bad)


def _cycle(graph):
    """One cycle of GRAPH ({node: set(nodes)}) as a list, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_c_include_cycle():
    graph = {}
    for rel in _c_files():
        if rel.endswith(".h"):
            graph[rel] = {"%s/%s" % dep for dep in INCLUDE.findall(_read(rel))}
    assert _cycle(graph) is None, "header include cycle: %s" % " -> ".join(_cycle(graph))


def test_no_c_file_includes_a_c_file():
    bad = [rel for rel in _c_files() if re.search(r'^\s*#\s*include\s+"[^"]+\.c"', _read(rel), re.M)]
    assert not bad, bad


def _py_modules():
    """{dotted module name: path} of the three packages."""
    out = {}
    for pkg, root in PY_ROOTS.items():
        for name in sorted(os.listdir(os.path.join(REPO, root))):
            if name.endswith(".py"):
                mod = pkg if name == "__init__.py" else "%s.%s" % (pkg, name[:-3])
                out[mod] = os.path.join(REPO, root, name)
    return out


def _py_imports(mod, path, known):
    """The modules of KNOWN that MOD imports (at any depth of its code: a lazy import is still one)."""
    pkg = mod.split(".")[0]
    tree = ast.parse(_read(os.path.relpath(path, REPO)))
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = pkg + ("." + base if base else "")
            names = [base] + ["%s.%s" % (base, a.name) for a in node.names]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != mod:
                out.add(n)
    return out


def test_python_imports_point_down_without_cycles():
    mods = _py_modules()
    graph = {m: _py_imports(m, p, mods) for m, p in mods.items()}
    bad = ["%s imports %s" % (m, d) for m, deps in sorted(graph.items()) for d in sorted(deps)
           if PY_RANK[d.split(".")[0]] > PY_RANK[m.split(".")[0]]]
    assert not bad, "imports against the layering:\n  " + "\n  ".join(bad)
    # A package's __init__ importing its own modules is how packages work; cycles among real modules are not.
    graph = {m: {d for d in deps if "." in d} for m, deps in graph.items() if "." in m}
    assert _cycle(graph) is None, "import cycle: %s" % " -> ".join(_cycle(graph))


def _functions(text):
    """(name, first line, length in lines) of each top-level function body of C source TEXT: a line that is
    just '{' after a signature, to the next line that is just '}'."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i] == "{" and i > 0:
            j = i - 1
            while j > 0 and "(" not in lines[j]:
                j -= 1
            m = re.search(r"(\w+)\s*\(", lines[j])
            k = i + 1
            while k < len(lines) and lines[k] != "}":
                k += 1
            if m and not lines[j].lstrip().startswith(("struct", "typedef", "static const", "enum")):
                out.append((m.group(1), j + 1, k - i - 1))
            i = k
        i += 1
    return out


@pytest.mark.parametrize("rel", [r for r in _c_files() if r.endswith(".c")])
def test_c_file_and_function_sizes(rel):
    text = _read(rel)
    head = text[:4000]
    nlines = text.count("\n")
    if nlines > MAX_FILE_LINES:
        assert "Why this file is long:" in head, "%s has %d lines and does not say why" % (rel, nlines)
    for name, line, length in _functions(text):
        if length > MAX_FUNCTION_LINES:
            assert ("Why %s is long:" % name) in head, "%s:%d %s() is %d lines and %s does not say why" % (
                rel, line, name, length, rel)


@pytest.mark.parametrize("rel", _c_files())
def test_every_file_opens_with_a_note(rel):
    text = _read(rel).lstrip()
    assert text.startswith("/*") and len(text.split("*/", 1)[0]) > 40, \
        "%s does not open with a note on what it is for" % rel

"""Differential test: the C analysis against the pure-Python port of the same
algorithm (tests/analysis/pyoracle.py, also `make bench`'s baseline) on
random sessions of random cells (issue 3).

The generator combines the constructs the analysis cares about (scopes,
comprehensions, lambdas, walrus, global, match, try/except-as, imports,
attribute stores, del, nested defs and classes) over a small pool of names so
that cells read, rebind and delete each other's variables.  For every cell
both implementations must agree on reads, state closure, import closure,
import statements and opaque flag, and the CLI must never crash.  Seeds are
fixed, so a failure reproduces.
"""
import random
import pytest

import pyoracle as py
from test_analysis_corpus import analyze

N = ["a","b","c","d","f","g","h","k","m","C","np","torch","os"]
def name(): return random.choice(N)
def expr(d=0):
    r = random.random()
    if d > 2 or r < 0.3: return name() if random.random() < 0.7 else str(random.randint(0,9))
    c = random.choice(["bin","call","attr","sub","lambda","listcomp","genexp","walrus","ifexp","dict","fstr","meth"])
    if c == "bin": return f"({expr(d+1)} + {expr(d+1)})"
    if c == "call": return f"{name()}({expr(d+1)})"
    if c == "attr": return f"{name()}.x"
    if c == "sub": return f"{name()}[{expr(d+1)}]"
    if c == "lambda": return f"(lambda {random.choice(['v','a'])}: {expr(d+1)})"
    if c == "listcomp": return f"[{expr(d+1)} for {random.choice(['v','a'])} in {expr(d+1)} if {expr(d+1)}]"
    if c == "genexp": return f"({expr(d+1)} for v in {expr(d+1)})"
    if c == "walrus": return f"({random.choice(['w','a'])} := {expr(d+1)})"
    if c == "ifexp": return f"({expr(d+1)} if {expr(d+1)} else {expr(d+1)})"
    if c == "dict": return f"{{{expr(d+1)}: {expr(d+1)}}}"
    if c == "fstr": return f"f'{{{expr(d+1)}}}'"
    return f"{name()}.meth({expr(d+1)})"
def stmt(ind="", d=0):
    r = random.random()
    kinds = ["assign","aug","expr","import","from","def","class","for","if","try","with","del","attrset","global","match"]
    k = random.choice(kinds if d < 2 else kinds[:7])
    if k == "assign": return f"{ind}{name()} = {expr()}\n"
    if k == "aug": return f"{ind}{name()} += {expr()}\n"
    if k == "expr": return f"{ind}{expr()}\n"
    if k == "import": return f"{ind}import {random.choice(['numpy as np','torch','os','os.path','json'])}\n"
    if k == "from": return f"{ind}from {random.choice(['torch','numpy','collections'])} import {random.choice(['nn','a','b','OrderedDict as C'])}\n"
    if k == "def":
        body = "".join(stmt(ind+"    ", d+1) for _ in range(random.randint(1,3)))
        glob = f"{ind}    global {name()}\n" if random.random() < 0.3 else ""
        return f"{ind}def {random.choice(['f','g','h'])}({random.choice(['','v','v, a=' + name()])}):\n{glob}{body}{ind}    return {expr()}\n"
    if k == "class":
        body = "".join(stmt(ind+"    ", d+1) for _ in range(random.randint(1,2)))
        return f"{ind}class C({name()}):\n{body}{ind}    def m(self):\n{ind}        return {expr()}\n"
    if k == "for": return f"{ind}for {random.choice(['v','a'])} in {expr()}:\n" + stmt(ind+"    ", d+1) + (f"{ind}else:\n" + stmt(ind+"    ", d+1) if random.random()<0.3 else "")
    if k == "if": return f"{ind}if {expr()}:\n" + stmt(ind+"    ", d+1) + (f"{ind}else:\n" + stmt(ind+"    ", d+1) if random.random()<0.5 else "")
    if k == "try": return f"{ind}try:\n" + stmt(ind+"    ", d+1) + f"{ind}except {name()} as e:\n" + stmt(ind+"    ", d+1) + (f"{ind}finally:\n" + stmt(ind+"    ", d+1) if random.random()<0.3 else "")
    if k == "with": return f"{ind}with {expr()} as {random.choice(['v','a'])}:\n" + stmt(ind+"    ", d+1)
    if k == "del": return f"{ind}del {name()}\n"
    if k == "attrset": return f"{ind}{name()}.y = {expr()}\n"
    if k == "global": return f"{ind}global {name()}\n"
    return f"{ind}match {expr()}:\n{ind}    case [{random.choice(['a','v'])}, *rest]:\n" + stmt(ind+"        ", d+1) + f"{ind}    case _:\n{ind}        pass\n"


def random_session(rng):
    random.seed(rng.random())
    return [{"code": "".join(stmt() for _ in range(random.randint(1, 4)))}
            for _ in range(random.randint(2, 6))]


@pytest.mark.parametrize("seed", range(8))
def test_random_sessions_agree_with_python_port(seed):
    rng = random.Random(seed)
    failures, checked = [], 0
    for _ in range(12):
        cells = random_session(rng)
        result = analyze(cells)
        baseline = py.Session()
        for cell, got in zip(cells, result["cells"]):
            pc = py.Cell(cell["code"])
            if pc.error or got["facts"]["error"]:
                if bool(pc.error) != bool(got["facts"]["error"]):
                    failures.append(f"parse verdicts differ on {cell['code']!r}: "
                                    f"{pc.error} / {got['facts']['error']}")
                continue
            want, have = baseline.closure(pc), got["closure"]
            pairs = {"reads": (sorted(pc.reads - py.BUILTINS), sorted(got["facts"]["reads"])),
                     "state": (want["state"], have["state_closure"]),
                     "imports": (want["imports"], have["import_closure"]),
                     "stmts": (want["stmts"], have["import_statements"]),
                     "opaque": (want["opaque"], have["opaque"])}
            for key, (a, b) in pairs.items():
                if a != b:
                    failures.append(f"{key}: python {a} / C {b}\n  session "
                                    f"{[c['code'] for c in cells]!r}\n  cell {cell['code']!r}")
            baseline.record(pc)
            checked += 1
    assert checked > 20
    assert not failures, "\n".join(failures[:5])

"""Soundness of the computed closures on real notebooks (issue 3).

For each notebook, `build/looseleaf analyze --json` computes every code
cell's state closure and import statements; soundness_runner.py then executes the notebook
twice in fresh processes and working directories: once normally, once with
each cell seeing only its closure (plus its imports, plus IPython's own
names).  Every cell must produce the same stdout, stderr, display outputs and
error in both runs.  A missed name shows up as a NameError in the second run.

Notebooks: every one in examples/ (the project's one copy; sources and
licences in examples/SOURCES.md), the one public notebook kept out of
examples/ (tests/analysis/notebooks/, see SOURCES.md there), the ones
written below for the constructs they lack, and random runnable sessions
(fixed seeds).  A negative control checks
that the harness does catch a closure with one needed name removed.
"""
import sys
import json
import os
import pathlib
import random
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ANALYZE = [str(ROOT / "build" / "looseleaf"), "analyze"]
RUNNER = HERE / "soundness_runner.py"
PYTHON = sys.executable

PUBLIC = sorted([*(ROOT / "examples").glob("*.ipynb"), *(HERE / "notebooks").glob("*.ipynb")],
                key=lambda p: p.name)

WRITTEN = {
    "functions_objects_magics": [
        "import numpy as np\nSCALE = 3\nrank_w = np.array([1.0, 0.5])\n",
        "def helper(v):\n    return v * SCALE\n"
        "def score(v):\n    return helper(v) + rank_w.sum()\n",
        "class Net:\n    def __init__(self, k):\n        self.k = k\n"
        "    def forward(self, x):\n        return score(x) * self.k\n",
        "net = Net(2)\nprint(net.forward(1.0))\n",
        "OFFSET = 10\ncallbacks = [score, lambda v: v + OFFSET]\n",
        "print([cb(1) for cb in callbacks])\n",
        "def make(k):\n    def add(v):\n        return v + k + SCALE\n    return add\n"
        "adder = make(5)\n",
        "print(adder(1))\n",
        "SCALE = 4\nprint(net.forward(2.0), adder(0))\n",
        "counter = 0\ndef bump():\n    global counter\n    counter += 1\n    return counter\n",
        "bump(); bump()\nprint(counter)\n",
        "data = {'a': 1}\ndata['b'] = 2\nprint(sorted(data))\n",
        "total = 0\nfor i in range(5):\n    total += i\nprint(total, i)\n",
        "try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    msg = str(err)\nprint(msg)\n",
        "match data:\n    case {'a': av, **rest}:\n        print(av, rest)\n",
        "if (n := len(data)) > 1:\n    print(n)\n"
        "vals = [y for x in range(3) if (y := x * SCALE)]\nprint(vals, y)\n",
        "%time res = sum(v * SCALE for v in range(10))\nprint(res)\n",
        "%%capture cap\nprint('hidden', SCALE)\n",
        "print(cap.stdout)\n",
        "from math import *\nprint(floor(2.5))\n",
        "print(sqrt(16), pi > 3)\n",
        "key = lambda r: r[1] * SCALE\nrows = sorted([(1, 3), (2, 1)], key=key)\nprint(rows)\n",
        "print(sorted(rows, key=key))\n",
        "import functools\npart = functools.partial(helper, 3)\nprint(part())\n",
        "print(part())\n",
        "class Cfg:\n    lr = 0.1\n    def show(self):\n        return f'{self.lr} {SCALE}'\n"
        "cfg = Cfg()\ncfg.lr = 0.2\nprint(cfg.show())\n",
        "x = 5\nx += SCALE\nprint(x)\n",
        "exec('print(x)')\n",
        "print(eval('x + 1'))\n",
        "del data\nprint('data' in dir())\n",
        "print(undefined_name)\n",
        "%%gpu\nprint(helper(2))\n",
        "x\n",
        "k = 2\ng = (v * k for v in range(3))\n",
        "print(list(g))\n",
        "class Registry:\n    def __init__(self):\n        self.funcs = []\n"
        "    def register(self, f):\n        self.funcs.append(f)\n        return f\n"
        "registry = Registry()\n",
        "LIMIT = 5\n@registry.register\ndef check(v):\n    return v < LIMIT\n",
        "print([f(3) for f in registry.funcs])\n",
        "HOOKS = []\ndef register(fn):\n    HOOKS.append(fn)\n    return fn\n"
        "def run_all():\n    return [h() for h in HOOKS]\n",
        "LEVEL = 3\ndef probe():\n    return LEVEL * 2\nregister(probe)\n",
        "print(run_all())\n",
        "table = {}\nok = table.setdefault('k', lambda: LIMIT2)\nLIMIT2 = 9\n",
        "print(table['k']())\n",
    ],
    "scoping_edge_cases": [
        "size = 10\nclass A:\n    size = 1\n    def get(self):\n        return size\n",
        "print(A().get(), A.size)\n",
        "factor = 3\nclass B:\n    vals = [1, 2]\n    scaled = [v * factor for v in vals]\n",
        "print(B.scaled)\n",
        "PREFIX = '>'\ndef deco(fn):\n    def wrapper(*a):\n        return PREFIX + str(fn(*a))\n"
        "    return wrapper\n",
        "BASE = 5\n@deco\ndef val():\n    return BASE\n",
        "print(val())\n",
        "REGISTRY = []\nclass Base:\n    def __init_subclass__(cls):\n"
        "        REGISTRY.append(cls.__name__)\n",
        "class Child(Base):\n    pass\nprint(REGISTRY)\n",
        "FMT = '<{}>'\nclass Box:\n    def __init__(self, v):\n        self.v = v\n"
        "    def __repr__(self):\n        return FMT.format(self.v)\n",
        "box = Box(3)\n",
        "box\n",
        "print([box])\n",
        "def gen():\n    for i in range(3):\n        yield i * MULT\nMULT = 2\nit = gen()\n",
        "print(list(it))\n",
        "class AppError(Exception):\n    def __str__(self):\n        return 'app: ' + CODE\nCODE = 'x1'\n",
        "try:\n    raise AppError()\nexcept AppError as e:\n    print(e)\n",
        "from dataclasses import dataclass, field\nDEFAULTS = {'a': 1}\n"
        "@dataclass\nclass Conf:\n    opts: dict = field(default_factory=lambda: dict(DEFAULTS))\n",
        "print(Conf())\n",
        "import functools\nWEIGHTS = {'a': 2, 'b': 3}\n"
        "total = functools.reduce(lambda acc, k: acc + WEIGHTS[k], ['a', 'b'], 0)\nprint(total)\n",
        "order = sorted(WEIGHTS, key=lambda k: -WEIGHTS[k])\nprint(order)\n",
        "def outer():\n    count = 0\n    def inc():\n        nonlocal count\n        count += STEP\n"
        "        return count\n    return inc\nSTEP = 4\ninc = outer()\n",
        "inc(); print(inc())\n",
        "def set_mode(m):\n    global MODE\n    MODE = m\nset_mode('fast')\n",
        "print(MODE)\n",
        "vals = [y for x in range(4) if (y := x * x) > 2]\nprint(vals, y)\n",
        "print(y + 1)\n",
        "def fib(n, memo={}):\n    if n < 2:\n        return n\n    if n not in memo:\n"
        "        memo[n] = fib(n - 1) + fib(n - 2)\n    return memo[n]\n",
        "print(fib(30))\n",
        "handlers = {'sq': lambda v: v * v * SCALE2}\nSCALE2 = 3\n",
        "print(handlers['sq'](2))\n",
        "import math as m\ndef area(r):\n    return m.pi * r * r\n",
        "print(round(area(2), 3))\n",
        "class Meta(type):\n    def __call__(cls, *a):\n        return ('made', TAG, cls.__name__)\n"
        "TAG = 't'\nclass Thing(metaclass=Meta):\n    pass\n",
        "print(Thing())\n",
        "ZZ = 7\n",
        "for i in range(3):\n    if i:\n        print(later())\n    def later():\n        return ZZ * i\n",
    ],
    "pandas_analysis": [
        "import pandas as pd\nimport numpy as np\nrng = np.random.default_rng(0)\n",
        "df = pd.DataFrame({'city': rng.choice(['a', 'b', 'c'], 50), "
        "'temp': rng.normal(20, 5, 50).round(1), 'rain': rng.integers(0, 2, 50)})\n",
        "CUTOFF = 22\ndef label(t):\n    return 'hot' if t > CUTOFF else 'mild'\n",
        "df['kind'] = df['temp'].apply(label)\ndf.head()\n",
        "summary = df.groupby('city').agg(mean_temp=('temp', 'mean'), rainy=('rain', 'sum'))\n"
        "summary\n",
        "hot = df[df.kind == 'hot']\nprint(len(hot), sorted(hot.city.unique()))\n",
        "scale = 1.8\nconv = lambda c: c * scale + 32\ndf['temp_f'] = df.temp.map(conv)\n",
        "print(df.temp_f.describe().round(2))\n",
        "pivot = df.pivot_table(index='city', columns='kind', values='temp', aggfunc='count')\n"
        "print(pivot.fillna(0).astype(int))\n",
        "styled = summary.assign(z=lambda d: (d.mean_temp - d.mean_temp.mean()) / d.mean_temp.std())\n"
        "print(styled.round(3))\n",
        "for name, group in df.groupby('city'):\n    print(name, round(group.temp.max(), 1))\n",
        "CUTOFF = 25\nprint(df.temp.apply(label).value_counts().to_dict())\n",
        "del hot\nprint(sorted(k for k in ('df', 'summary', 'pivot')))\n",
    ],
    "torch_training": [
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n",
        "X = torch.randn(32, 4)\ny = X.sum(dim=1, keepdim=True)\n",
        "HIDDEN = 8\ndef build():\n    return nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), "
        "nn.Linear(HIDDEN, 1))\nmodel = build()\n",
        "loss_fn = nn.MSELoss()\nopt = torch.optim.SGD(model.parameters(), lr=0.05)\n",
        "def step():\n    opt.zero_grad()\n    loss = loss_fn(model(X), y)\n    loss.backward()\n"
        "    opt.step()\n    return loss.item()\n",
        "losses = [step() for _ in range(20)]\nprint(round(losses[0], 4), round(losses[-1], 4))\n",
        "with torch.no_grad():\n    pred = model(X[:2])\nprint(pred.shape)\n",
        "class Wrapper(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.inner = build()\n    def forward(self, x):\n        return self.inner(x) * 2\n",
        "w = Wrapper()\nprint(w(X[:1]).shape)\n",
        "HIDDEN = 3\nprint(sum(p.numel() for p in Wrapper().parameters()))\n",
    ],
}


# Random but runnable sessions: variables, functions reading globals, lists
# of callables, objects whose methods read globals, lazy generators,
# rebinding, deletion, `global` setters, branches, loops, walrus, match.
def random_program(seed, ncells=40):
    r = random.Random(seed)
    V = [f"v{i}" for i in range(6)]
    F = [f"f{i}" for i in range(4)]
    H = [f"h{i}" for i in range(3)]
    O = [f"o{i}" for i in range(3)]
    C = [f"C{i}" for i in range(3)]
    G = [f"g{i}" for i in range(2)]
    def v(): return r.choice(V)
    def ie(d=0):
        k = r.random()
        if d > 1 or k < 0.4: return v() if r.random() < 0.8 else str(r.randint(1, 5))
        if k < 0.6: return f"({ie(d+1)} + {ie(d+1)})"
        if k < 0.75: return f"{r.choice(F)}({ie(d+1)})"
        if k < 0.85: return f"{r.choice(O)}.m({ie(d+1)})"
        return f"sum(c({ie(d+1)}) for c in {r.choice(H)})"
    cells = [f"{x} = {i}\n" for i, x in enumerate(V)]
    cells += [f"def {f}(x):\n    return x + {v()}\n" for f in F]
    cells += [f"class {c}:\n    k = {v()}\n    def m(self, x):\n        return x + {v()}\n" for c in C]
    cells += [f"{o} = {r.choice(C)}()\n" for o in O]
    cells += [f"{h} = [{r.choice(F)}]\n" for h in H]
    cells += [f"{g} = (x + {v()} for x in range(3))\n" for g in G]
    T = [
        lambda: f"{v()} = {ie()}\n",
        lambda: f"{v()} += {ie()}\n",
        lambda: f"def {r.choice(F)}(x):\n    return x * {ie(1)} + {v()}\n",
        lambda: f"def {r.choice(F)}(x):\n    def inner(y):\n        return y + {v()}\n    return inner(x) + {r.choice(F)}(0)\n",
        lambda: f"{r.choice(H)} = [{r.choice(F)}, lambda x: x + {v()}]\n",
        lambda: f"{r.choice(H)}.append({r.choice(F)})\n",
        lambda: (lambda c: f"class {c}:\n    k = {v()}\n    def m(self, x):\n        return x + {v()} + {r.choice(F)}(1)\n")(r.choice(C)),
        lambda: f"{r.choice(O)} = {r.choice(C)}()\n",
        lambda: f"{r.choice(G)} = (x + {v()} for x in range(3))\n",
        lambda: f"print(sum({r.choice(G)}))\n",
        lambda: f"print({ie()})\n",
        lambda: f"print([c(2) for c in {r.choice(H)}])\n",
        lambda: f"print({r.choice(O)}.m({ie()}))\n",
        lambda: f"if {ie()} > 4:\n    {v()} = {ie()}\nelse:\n    {v()} = {ie()}\nprint({v()})\n",
        lambda: f"for i in range(3):\n    {v()} = {ie()} + i\nprint(i)\n",
        lambda: f"try:\n    {v()} = 10 // ({ie()} - 3)\nexcept ZeroDivisionError as err:\n    print('zero', err)\n",
        lambda: f"def setter():\n    global {v()}\n    {v()} = {ie()}\nsetter()\n",
        lambda: (lambda x: f"del {x}\n{x} = 7\n")(v()),
        lambda: f"print([y for x in range(3) if (y := x + {v()})])\nprint(y)\n",
        lambda: f"key = lambda x: -x * {v()}\nprint(sorted([3, 1, 2], key=key))\n",
        lambda: f"print(sorted([3, 1, 2], key=key if 'key' in dir() else None))\n",
        lambda: f"match {ie()}:\n    case 1:\n        {v()} = 1\n    case n:\n        {v()} = n + {v()}\n",
        lambda: f"{v()} = {r.choice(C)}.k + {ie()}\n",
    ]
    for _ in range(ncells):
        cells.append(r.choice(T)())
    return cells


def write_notebook(path, sources):
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {},
                     "outputs": [], "source": s} for s in sources],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def analyse(nb_path):
    proc = subprocess.run([*ANALYZE, "--json", str(nb_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


_MPLCONFIG = []


def mpl_config_dir():
    """One matplotlib config dir whose font cache is built once, before any
    two runners start together: two processes building it at the same time
    contend for its lock, and one of them fails with a TimeoutError."""
    if not _MPLCONFIG:
        path = pathlib.Path(tempfile.mkdtemp(prefix="ll-analysis-mpl-"))
        subprocess.run([PYTHON, "-c", "import matplotlib.font_manager"], timeout=300,
                       env=dict(os.environ, MPLCONFIGDIR=str(path), MPLBACKEND="Agg"),
                       capture_output=True)
        _MPLCONFIG.append(path)
    return _MPLCONFIG[0]


def run(nb_path, workdir, mode, analysis_path=None):
    workdir.mkdir()
    out = workdir / "out.json"
    args = [PYTHON, str(RUNNER), str(nb_path), str(out), mode]
    if analysis_path:
        args.append(str(analysis_path))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONHASHSEED="0",
               MPLCONFIGDIR=str(mpl_config_dir()))
    proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def compare(nb_path, tmp_path, analysis):
    analysis_path = tmp_path / "analysis.json"
    analysis_path.write_text(json.dumps(analysis))
    mpl_config_dir()  # before the two runs start in parallel
    with ThreadPoolExecutor(2) as pool:
        full = pool.submit(run, nb_path, tmp_path / "full", "full")
        narrow = pool.submit(run, nb_path, tmp_path / "closure", "closure", analysis_path)
        full, narrow = full.result(), narrow.result()
    assert len(full) == len(narrow) == len(analysis["cells"])
    diffs = []
    for i, (a, b) in enumerate(zip(full, narrow)):
        if a != b:
            closure = analysis["cells"][i].get("closure", {}).get("state_closure")
            diffs.append(f"code cell {i + 1} (closure {closure}):\n  full:    {a}\n  closure: {b}")
    return diffs


for _seed in (1, 2, 3):
    WRITTEN[f"random_{_seed}"] = random_program(_seed, 60)

NOTEBOOKS = [pytest.param(p, id=p.stem) for p in PUBLIC] + \
            [pytest.param(name, id=name) for name in WRITTEN]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_closure_gives_same_outputs(notebook, tmp_path):
    if isinstance(notebook, str):
        nb_path = tmp_path / f"{notebook}.ipynb"
        write_notebook(nb_path, WRITTEN[notebook])
    else:
        nb_path = notebook
    analysis = analyse(nb_path)
    assert analysis["summary"]["analysed"] > 0
    diffs = compare(nb_path, tmp_path, analysis)
    assert not diffs, "\n".join(diffs)


def test_public_notebooks_present():
    assert len(PUBLIC) >= 9, "the notebooks of examples/ and tests/analysis/notebooks/"


def test_harness_catches_a_missing_name(tmp_path):
    """Negative control: drop a name a cell needs and the harness must notice."""
    nb_path = tmp_path / "control.ipynb"
    write_notebook(nb_path, ["A = 2\ndef f():\n    return A * 3\n", "print(f())\n"])
    analysis = analyse(nb_path)
    assert analysis["cells"][1]["closure"]["state_closure"] == ["A", "f"]
    analysis["cells"][1]["closure"]["state_closure"] = ["f"]  # lose A
    diffs = compare(nb_path, tmp_path, analysis)
    assert len(diffs) == 1 and "NameError" in diffs[0]


@pytest.fixture(scope="module", autouse=True)
def _remove_mpl_config():
    yield
    for path in _MPLCONFIG:
        shutil.rmtree(path, ignore_errors=True)
    _MPLCONFIG.clear()

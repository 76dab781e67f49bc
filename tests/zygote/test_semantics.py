"""A session whose cells run on different forked workers behaves like one Python process: torch training
across cells (model + optimizer restored, sharing intact), views, in-place mutation, functions, redefinition,
del, exceptions, and process state (cwd, env, sys.path, RNGs, torch dtype/grad mode)."""
import sys
import os
import subprocess

TORCH_HEAD = "numpy,torch,IPython,looseleaf_kernel,looseleaf_store"

TRAIN_CELLS = [
    ("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
     "opt = torch.optim.Adam(model.parameters(), lr=0.1)\nX = torch.randn(16, 4)\nY = torch.randn(16, 2)",
     [], ["model", "opt", "X", "Y"]),
    # (loss ends as a float: a tensor with its graph would keep its worker as the session's home, and these
    # cells are about restoring on fresh workers)
    ("for _ in range(5):\n    opt.zero_grad()\n    loss = ((model(X) - Y) ** 2).mean()\n    loss.backward()\n"
     "    opt.step()\nprint('%.6f' % float(loss))\nloss = loss.item()", ["model", "opt", "X", "Y"], ["loss"]),
    ("for _ in range(5):\n    opt.zero_grad()\n    loss = ((model(X) - Y) ** 2).mean()\n    loss.backward()\n"
     "    opt.step()\nprint('%.6f' % float(loss))\nloss = loss.item()", ["model", "opt", "X", "Y"], ["loss"]),
    ("print('%.6f' % float(model.weight.sum()), opt.param_groups[0]['params'][0] is model.weight)",
     ["model", "opt"], []),
]


def test_torch_training_across_workers_matches_one_process(env):
    c = env.client(head=TORCH_HEAD)
    outs = []
    pids = set()
    for i, (code, closure, defines) in enumerate(TRAIN_CELLS):
        cell = c.run("t%d" % i, code, state_closure=closure, defines=defines, import_closure=["torch"],
                     import_stmts=["import torch"] if i else [])
        assert cell.ok, cell.events
        outs.append(cell.stdout)
        pids.add(cell.ll["worker_pid"])
    assert len(pids) == len(TRAIN_CELLS)
    plain = subprocess.run([sys.executable, "-c", "\n".join(code for code, _, _ in TRAIN_CELLS)],
                           capture_output=True, text=True, check=True).stdout
    assert "".join(outs) == plain
    assert outs[-1].split()[1] == "True"


def test_views_inplace_functions_redefinition_del_exceptions(env):
    c = env.client()
    r = c.run("a", "import numpy as np\nbase = np.zeros(6)\nv = base[2:4]\nk = 3\ndef f(a):\n    return a * k",
              defines=["base", "v", "k", "f"])
    assert r.ok, r.events
    # In-place through the view, in a later worker: the base sees it.
    r = c.run("b", "v[:] = 7\nprint(base.tolist(), np.shares_memory(base, v))", state_closure=["v", "base"],
              import_stmts=["import numpy as np"])
    assert r.stdout == "[0.0, 0.0, 7.0, 7.0, 0.0, 0.0] True\n", r.events
    r = c.run("c", "print(base.tolist())", state_closure=["base"])
    assert r.stdout == "[0.0, 0.0, 7.0, 7.0, 0.0, 0.0]\n"
    # Functions defined in one cell, used in another; redefinition.
    assert c.run("d", "print(f(2))", state_closure=["f", "k"]).stdout == "6\n"
    assert c.run("e", "def f(a):\n    return a + k", defines=["f"]).ok
    assert c.run("g", "print(f(2))", state_closure=["f", "k"]).stdout == "5\n"
    # del
    r = c.run("h", "del k", deletes=["k"], state_closure=["k"])
    assert r.ok and r.ll["deleted"] == ["k"], r.ll
    r = c.run("i", "print('k' in globals())", state_closure=["k"])
    assert r.stdout == "False\n"
    # An exception keeps what the cell changed before it.
    r = c.run("j", "y = 41\nbase[0] = 1\nraise ValueError('boom')", defines=["y"], state_closure=["base"])
    assert r.content["status"] == "error" and r.content["ename"] == "ValueError"
    assert any(e["type"] == "iopub" and e["msg_type"] == "error" for e in r.events)
    r = c.run("l", "print(y + 1, base[0])", state_closure=["y", "base"])
    assert r.stdout == "42 1.0\n", r.events


def test_process_state_follows_the_session(env):
    c = env.client(head=TORCH_HEAD)
    code1 = ("import os, sys, random, numpy as np, torch\nos.chdir(%r)\nos.environ['LL_T_FOO'] = 'bar'\n"
             "sys.path.append('/ll-test-path')\nrandom.seed(5)\nnp.random.seed(6)\ntorch.manual_seed(7)\n"
             "print(random.random(), np.random.rand(), float(torch.rand(1)))\n"
             "torch.set_default_dtype(torch.float64)\ntorch.set_grad_enabled(False)") % env.tmp
    code2 = ("print(random.random(), np.random.rand(), float(torch.rand(1)))\n"
             "print(os.getcwd(), os.environ.get('LL_T_FOO'), '/ll-test-path' in sys.path, "
             "torch.get_default_dtype(), torch.is_grad_enabled())")
    stmts = ["import os", "import sys", "import random", "import numpy as np", "import torch"]
    a = c.run("p1", code1, import_closure=["torch"])
    b = c.run("p2", code2, import_closure=["torch"], import_stmts=stmts)
    assert a.ok and b.ok, (a.events, b.events)
    plain = subprocess.run([sys.executable, "-c", code1 + "\n" + code2], capture_output=True, text=True,
                           check=True).stdout
    assert a.stdout + b.stdout == plain


def test_a_variable_that_cannot_be_saved_stays_in_its_worker(env):
    # (nothing lost, no "could not save": the generator stays in its worker, a HomeRef stands for it in the store)
    c = env.client()
    r = c.run("g", "g = (i for i in range(3))\nok = 5", defines=["g", "ok"])
    assert r.ok and r.stderr == "" and "save_failed" not in r.ll, (r.ll, r.stderr)
    assert r.ll["home"]["g"]["what"] == "a generator" and r.ll["saved"] == ["g", "ok"], r.ll
    pid = r.ll["worker_pid"]
    r = c.run("h", "print(ok, next(g))", state_closure=["ok", "g"])
    assert r.stdout == "5 0\n" and r.ll["worker_pid"] == pid, r.events


def test_imports_see_the_sys_path_a_cell_set(env):
    # A package reachable only through a directory an earlier cell put on sys.path: the next worker applies
    # the session's process state before it imports the cell's import closure.
    mods = os.path.join(env.tmp, "onpath")
    os.makedirs(mods)
    with open(os.path.join(mods, "llz_onpath.py"), "w") as f:
        f.write("VALUE = 11\n")
    c = env.client()
    assert c.run("p", "import sys\nsys.path.append(%r)" % mods).ok
    r = c.run("q", "print(llz_onpath.VALUE)", import_closure=["llz_onpath"], import_stmts=["import llz_onpath"])
    assert r.stdout == "11\n", r.events
    assert r.ll["imported_after_fork"] == ["llz_onpath"] and "import_failed" not in r.ll, r.ll

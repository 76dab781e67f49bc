#!/usr/bin/env python3
"""bench_zygote: cold preparation of GPU cells on forked workers against the naive serverless path (issue 5).

Run by `make bench` (after `make all`).  Starts its own redis-server and host pool (torch in the base zygote)
in a temp dir and replays a scripted notebook session: a small model trained across several GPU cells, with
CPU cells between (run here, in this process, the way the kernel's interpreter would: restore what moved,
run, save).  The session holds a 256 MiB raw array the GPU cells never read, as real notebooks do (their GPU
cells read a median 4-22% of the live variables).

Prints, in one run:
  per GPU cell: cold preparation split into fork, import and restore (from the worker's report), bytes restored;
  the worker fork latency from the base zygote (trivial cells);
  the same GPU cells on the naive path: a fresh Python (the bench's) that imports torch and numpy from scratch and
  loads the whole namespace with plain pickle, timed from spawn to ready;
  the ratio naive / cold preparation.  Target: cold preparation at least 10x faster;
  the same session again on a pool with warm workers (--warm-idle, issue 6): per GPU cell whether it was a warm
  hit and its preparation (a hit forks nothing and restores only what moved), the hit rate, and the median
  preparation of hits against the cold one (no target yet: the kernel-level bench of issue 6 sets them).
Restore maps payloads copy-on-write (no copy): the first touch of restored pages is paid inside the cell
(exec ms), as MEASURED.md describes for 4 KiB pages.  LL_BENCH_RAW_MB changes the size of the unread array (default 256).
"""
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Kernels, pools and workers run in the environment of the Python running the bench (kernel/ll_pyenv.h).
os.environ.setdefault("LOOSELEAF_PYTHON", sys.executable)
sys.path[:0] = [os.path.join(REPO, "build", "py"), os.path.join(REPO, "store", "py"),
                os.path.join(REPO, "tests", "zygote")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _llstore  # noqa: E402
from looseleaf_store import Checkpointer  # noqa: E402
from zyghelp import Env  # noqa: E402

RAW_MB = int(os.environ.get("LL_BENCH_RAW_MB", "256"))
HEAD = "numpy,torch,IPython,looseleaf_kernel,looseleaf_store"

# (kind, code, state closure, defines)
SESSION = [
    ("cpu", "raw = np.random.default_rng(0).random(%d)\nmeta = {'name': 'bench', 'rows': 65536}" %
     (RAW_MB * 1024 * 1024 // 8), [], ["raw", "meta"]),
    ("cpu", "X = torch.from_numpy(raw[:65536 * 64].reshape(65536, 64).astype(np.float32))\n"
            "Y = X.sum(1, keepdim=True)", ["raw"], ["X", "Y"]),
    ("gpu", "torch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),"
            " torch.nn.Linear(256, 1))\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)", [], ["model", "opt"]),
    ("gpu", "for i in range(4):\n    b = slice(i * 1024, (i + 1) * 1024)\n    opt.zero_grad()\n"
            "    loss = ((model(X[b]) - Y[b]) ** 2).mean()\n    loss.backward()\n    opt.step()\nprint(float(loss))",
     ["model", "opt", "X", "Y"], ["loss"]),
    ("cpu", "for g in opt.param_groups:\n    g['lr'] *= 0.5", ["opt", "model"], ["opt"]),
    ("gpu", "for i in range(4):\n    b = slice(i * 1024, (i + 1) * 1024)\n    opt.zero_grad()\n"
            "    loss = ((model(X[b]) - Y[b]) ** 2).mean()\n    loss.backward()\n    opt.step()\nprint(float(loss))",
     ["model", "opt", "X", "Y"], ["loss"]),
    ("gpu", "with torch.no_grad():\n    print(float(((model(X[:4096]) - Y[:4096]) ** 2).mean()))",
     ["model", "X", "Y"], []),
]

NAIVE = r"""
import sys, time, pickle
import numpy, torch
with open(sys.argv[1], 'rb') as f:
    ns = pickle.load(f)
sys.stdout.write('ready %d\n' % len(ns))
sys.stdout.flush()
"""


def _cpu_cell(cp, ns, i, code, closure, defines):
    """A CPU cell as the kernel's interpreter runs it: restore what moved, run, save what it defined."""
    rep = cp.restore(closure) if closure else None
    assert rep is None or not rep.failed, rep
    exec(compile(code, "<cpu cell %d>" % i, "exec"), ns)
    srep = cp.save(defines)
    assert not srep.failed and not srep.error, srep


def naive_prep(path):
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", NAIVE, path], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    t = time.perf_counter() - t0
    p.wait()
    assert line.startswith("ready"), line
    return t * 1e3


def main():
    with tempfile.TemporaryDirectory(prefix="ll-bench-zyg-") as tmp:
        env = Env(tmp)
        try:
            med_cold = run(env, tmp)
        finally:
            env.close()
    with tempfile.TemporaryDirectory(prefix="ll-bench-zyg-warm-") as tmp:
        env = Env(tmp)
        try:
            run_warm(env, med_cold)
        finally:
            env.close()


def run_warm(env, med_cold):
    """The session again, on a pool whose workers stay warm: the CPU cells commit between GPU cells (so a
    warm worker re-checks versions and restores what they changed), the GPU cells hit the session's worker."""
    store = _llstore.Store(env.store_dir, env.session, redis_url=env.redis_url)
    ns = {"np": np, "torch": torch}
    cp = Checkpointer(store, ns)
    c = env.client(head=HEAD, slots=1, extra=["--warm-idle", "300"])
    stmts = ["import numpy as np", "import torch"]
    rows = []
    for i, (kind, code, closure, defines) in enumerate(SESSION):
        if kind == "cpu":
            _cpu_cell(cp, ns, i, code, closure, defines)
            continue
        cell = c.run("w%d" % i, code, state_closure=closure, defines=defines, import_closure=["torch", "numpy"],
                     import_stmts=stmts)
        assert cell.ok, cell.events
        ll = cell.ll
        prep = ll["prep_ms"]
        rows.append((i, bool(ll.get("warm_hit")), prep["fork"], prep["import"], prep["restore"],
                     prep["fork"] + prep["import"] + prep["restore"], ll["bytes_restored"], ll["exec_ms"]))
    print("  the same GPU cells on a pool with warm workers (--warm-idle)")
    print("  %-5s %5s %8s %8s %9s %9s %11s %8s" % ("cell", "hit", "fork ms", "imp ms", "rest ms", "prep ms",
                                                  "restored B", "exec ms"))
    for r in rows:
        print("  %-5d %5s %8.1f %8.1f %9.1f %9.1f %11d %8.1f" % (r[0], "yes" if r[1] else "no", *r[2:]))
    hits = [r for r in rows if r[1]]
    med_hit = statistics.median(r[5] for r in hits) if hits else float("nan")
    print("  warm hits %d of %d GPU cells; warm-hit preparation median %.1f ms vs cold %.1f ms (%.1fx)" % (
        len(hits), len(rows), med_hit, med_cold, med_cold / med_hit if hits and med_hit > 0 else float("nan")))
    print(json.dumps({"bench": "zygote_warm", "hit_rate": len(hits) / len(rows), "warm_prep_ms_median": med_hit,
                      "cold_prep_ms_median": med_cold}))
    store.close()


def run(env, tmp):
    store = _llstore.Store(env.store_dir, env.session, redis_url=env.redis_url)
    ns = {"np": np, "torch": torch}
    cp = Checkpointer(store, ns)
    c = env.client(head=HEAD, slots=1)
    # Warm-up: the base zygote has imported the head once the first cell runs.
    assert c.run("warm", "pass").ok
    forks = [c.run("f%d" % i, "pass").ll["fork_ms"] for i in range(5)]
    stmts = ["import numpy as np", "import torch"]
    rows = []
    for i, (kind, code, closure, defines) in enumerate(SESSION):
        if kind == "cpu":
            _cpu_cell(cp, ns, i, code, closure, defines)
            continue
        # The naive path restores the whole namespace as it stands before this cell.
        allnames = sorted(store.versions())
        rep = cp.restore(allnames)
        assert not rep.failed, rep
        whole = {k: v for k, v in ns.items() if k in allnames}
        path = os.path.join(tmp, "ns.pickle")
        with open(path, "wb") as f:
            pickle.dump(whole, f, protocol=pickle.HIGHEST_PROTOCOL)
        naive = min(naive_prep(path) for _ in range(2))
        cell = c.run("g%d" % i, code, state_closure=closure, defines=defines, import_closure=["torch", "numpy"],
                     import_stmts=stmts)
        assert cell.ok, cell.events
        ll = cell.ll
        prep = ll["prep_ms"]
        cold = prep["fork"] + prep["import"] + prep["restore"]
        rows.append((i, prep["fork"], prep["import"], prep["restore"], cold, ll["bytes_restored"], naive,
                     os.path.getsize(path), ll["exec_ms"], ll["save_ms"], ll["bytes_saved"]))
    print("  GPU cells on forked workers vs the naive path (fresh python3 + imports + whole namespace pickled)")
    print("  %-5s %8s %8s %9s %9s %11s | %9s %11s %7s | %8s %8s %10s" % (
        "cell", "fork ms", "imp ms", "rest ms", "cold ms", "restored B", "naive ms", "naive B", "ratio",
        "exec ms", "save ms", "saved B"))
    for r in rows:
        print("  %-5d %8.1f %8.1f %9.1f %9.1f %11d | %9.1f %11d %6.1fx | %8.1f %8.1f %10d" % (
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[6] / r[4], r[8], r[9], r[10]))
    med_cold = statistics.median(r[4] for r in rows)
    med_naive = statistics.median(r[6] for r in rows)
    print("  worker fork latency from the base zygote (trivial cells): median %.1f ms, min %.1f, max %.1f" % (
        statistics.median(forks), min(forks), max(forks)))
    ratio = med_naive / med_cold
    print("  cold preparation median %.1f ms vs naive %.1f ms: %.1fx faster (target >= 10x: %s)" % (
        med_cold, med_naive, ratio, "met" if ratio >= 10 else "NOT met"))
    print(json.dumps({"bench": "zygote", "cold_prep_ms_median": med_cold, "naive_prep_ms_median": med_naive,
                      "ratio": ratio, "fork_ms_median": statistics.median(forks)}))
    store.close()  # Env.close drops the session (its pool in /dev/shm) with its keys
    return med_cold


if __name__ == "__main__":
    main()

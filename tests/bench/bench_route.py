#!/usr/bin/env python3
"""bench_route: a scripted notebook session through the real kernel, GPU cells on forked workers (issue 5).

Run by `make bench` (after `make all`).  Starts the LooseLeaf kernel through jupyter_client (its own pool in a
temp dir) and replays bench_zygote's session: a small model trained across several GPU cells with CPU cells
between, plus a 256 MiB array the GPU cells never read.  Nothing is told to the kernel: its cell analysis
picks the route and the closures, exactly as for a user.

Prints, in one run:
  per GPU cell, from execute_reply.metadata.looseleaf: the kernel's commit of what CPU cells changed, then
  the worker's cold preparation split into fork, import and restore, bytes restored, exec and save;
  the worker fork latency from the base zygote (trivial GPU cells);
  the same cells on the naive path: a fresh Python (the bench's) that imports torch and numpy from scratch and
  loads the whole namespace with plain pickle (the namespace built by running the session in this process),
  timed from spawn to ready; the ratio naive / cold preparation (target: at least 10x);
  Run-to-reply time of each cell on LooseLeaf against ipykernel running the same cells, in this run.
"""
import contextlib
import io
import json
import os
import pickle
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Kernels, pools and workers run in the environment of the Python running the bench (kernel/ll_pyenv.h).
os.environ.setdefault("LOOSELEAF_PYTHON", sys.executable)
sys.path[:0] = [os.path.join(REPO, "tests", "bench"), os.path.join(REPO, "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from jupyter_client import KernelManager  # noqa: E402

from bench_zygote import SESSION, naive_prep  # noqa: E402
from llpool_util import stop_pool as _stop_pool  # noqa: E402  (bench_prefetch imports it from here)

LOOSELEAF = os.path.join(REPO, "build", "looseleaf")


def _kernelspecs(root):
    specs = {
        "looseleaf": [LOOSELEAF, "-f", "{connection_file}"],
        "python3": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    }
    for name, argv in specs.items():
        d = os.path.join(root, "share", "kernels", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "kernel.json"), "w") as f:
            json.dump({"argv": argv, "display_name": name, "language": "python"}, f)


class Session:
    def __init__(self, name, env):
        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code):
        t0 = time.perf_counter()
        mid = self.kc.execute(code)
        while True:
            m = self.kc.get_shell_msg(timeout=600)
            if m["parent_header"].get("msg_id") == mid:
                break
        dt = (time.perf_counter() - t0) * 1e3
        assert m["content"]["status"] == "ok", m["content"]
        return dt, m["metadata"].get("looseleaf", {})

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def main():
    with tempfile.TemporaryDirectory(prefix="ll-bench-route-") as tmp:
        _kernelspecs(tmp)
        pool_dir = os.path.join(tmp, "pool")
        env = dict(os.environ, JUPYTER_PATH=os.path.join(tmp, "share"), IPYTHONDIR=os.path.join(tmp, "ipy"),
                   LOOSELEAF_POOL_DIR=pool_dir, LL_POOL_SLOTS="1", PYDEVD_DISABLE_FILE_VALIDATION="1",
                   # cold preparation is what this measures: no warm workers (bench_prefetch has those)
                   LL_POOL_WARM_IDLE_S="0")
        env.pop("PYTEST_CURRENT_TEST", None)
        os.environ["JUPYTER_PATH"] = env["JUPYTER_PATH"]  # where KernelManager looks the specs up
        try:
            run(tmp, env)
        finally:
            _stop_pool(pool_dir)


def run(tmp, env):
    setup = "import numpy as np\nimport torch"
    ll = Session("looseleaf", env)
    ref = Session("python3", env)
    try:
        ll.run(setup)
        ref.run(setup)
        # Warm-up: the pool starts with the first GPU cell and its base zygote imports the head.
        ll.run("%%gpu\npass")
        forks = [ll.run("%%gpu\npass")[1]["fork_ms"] for _ in range(5)]
        ns = {"np": np, "torch": torch}
        rows, ratios_wall = [], []
        for i, (kind, code, _closure, _defines) in enumerate(SESSION):
            naive = None
            if kind == "gpu":
                whole = {k: v for k, v in ns.items() if k not in ("np", "torch") and not k.startswith("__")}
                path = os.path.join(tmp, "ns.pickle")
                with open(path, "wb") as f:
                    pickle.dump(whole, f, protocol=pickle.HIGHEST_PROTOCOL)
                naive = (min(naive_prep(path) for _ in range(2)), os.path.getsize(path))
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, "<cell %d>" % i, "exec"), ns)
            t_ll, md = ll.run(code)
            t_ref, _ = ref.run(code)
            ratios_wall.append((i, kind, md.get("route"), t_ll, t_ref))
            if kind == "gpu":
                assert md.get("route") == "gpu", (i, md.get("route"), md.get("fallback"))
                prep = md["prep_ms"]
                cold = prep["fork"] + prep["import"] + prep["restore"]
                rows.append((i, md.get("kernel_save_ms", 0.0), prep["fork"], prep["import"], prep["restore"],
                             cold, md["bytes_restored"], naive[0], naive[1], md["exec_ms"], md["save_ms"],
                             md["bytes_saved"]))
    finally:
        ll.close()
        ref.close()
    print("  GPU cells through the kernel vs the naive path (fresh python3 + imports + whole namespace pickled)")
    print("  %-4s %8s | %7s %7s %8s %8s %11s | %9s %11s %7s | %8s %8s %10s" % (
        "cell", "kern ms", "fork", "import", "restore", "cold ms", "restored B", "naive ms", "naive B", "ratio",
        "exec ms", "save ms", "saved B"))
    for r in rows:
        print("  %-4d %8.1f | %7.1f %7.1f %8.1f %8.1f %11d | %9.1f %11d %6.1fx | %8.1f %8.1f %10d" % (
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[7] / r[5], r[9], r[10], r[11]))
    med_cold = statistics.median(r[5] for r in rows)
    med_naive = statistics.median(r[7] for r in rows)
    print("  worker fork latency from the base zygote (trivial GPU cells): median %.1f ms, min %.1f, max %.1f" % (
        statistics.median(forks), min(forks), max(forks)))
    ratio = med_naive / med_cold
    print("  cold preparation median %.1f ms vs naive %.1f ms: %.1fx faster (target >= 10x: %s)" % (
        med_cold, med_naive, ratio, "met" if ratio >= 10 else "NOT met"))
    print("  Run to reply, LooseLeaf vs ipykernel (same cells, this run):")
    for i, kind, route, t_ll, t_ref in ratios_wall:
        print("    cell %d (%s, ran on %s): %8.1f ms vs %8.1f ms  (%.2fx)" % (i, kind, route, t_ll, t_ref,
                                                                          t_ll / t_ref))
    print(json.dumps({"bench": "route", "cold_prep_ms_median": med_cold, "naive_prep_ms_median": med_naive,
                      "ratio": ratio, "fork_ms_median": statistics.median(forks)}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""bench_sim: the fleet simulator's longer checks (issue 18; sim/API.md), run by `make bench` after `make all`.

1. The paper's frontier.  For 24, 48 and 72 concurrent sessions over a simulated day on 8-GPU hosts (the
   paper's Fig. 1, 9, 10), a trace of the tree's GPU notebooks (examples/looseleaf_torch_training,
   mrdbourke_00_pytorch_fundamentals, mrdbourke_01_pytorch_workflow; `looseleaf trace --gpu-busy 0.19`: their
   GPU cells' measured times scaled so that a pinned session's GPU is busy 19% of the time, the paper's
   "reserved GPUs idle more than 81%") is simulated for every design.  Prints LooseLeaf's GPU-hour savings
   against session-pinned, NotebookOS and keep-alive, and its share of GPU cells starting within 1 s, next to
   the paper's; writes the plots to docs/sim/ (frontier.png: GPU-hours against the share missing 1 s, every
   design at each size; provisioned_gpus.png: GPUs powered over the day at 48 sessions) and the table to
   docs/sim/frontier.csv.
2. Scale.  10,000 concurrent sessions over a simulated day (LL_BENCH_SIM_SESSIONS; the frontier's notebooks
   and GPU load), every design, on this machine's 2 cores: the wall and CPU time and peak memory of
   `looseleaf simulate`.  Target: minutes (under 10 of wall time on an idle machine; on a shared one the CPU
   time tells).

LL_BENCH_SIM_SKIP_SCALE=1 runs only the frontier.
"""
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
DOCS = os.path.join(REPO, "docs", "sim")
GPU_NOTEBOOKS = [os.path.join(REPO, "examples", n) for n in (
    "looseleaf_torch_training.ipynb", "mrdbourke_00_pytorch_fundamentals.ipynb",
    "mrdbourke_01_pytorch_workflow.ipynb")]
DAY = 86400
# The paper's numbers (DESIGN.md, "Numbers to beat"): savings ranges over 24-72 sessions, and the 1-s share.
PAPER = {"vs_pinned": "43-70%", "vs_notebookos": "32-55%", "vs_keepalive": "29-47%",
         "within_1s": {24: "98.9%", 48: "-", 72: "95.9%"}}


def _trace(path, sessions, extra=(), notebooks=GPU_NOTEBOOKS):
    with open(path, "w") as f:
        subprocess.run([LOOSELEAF, "trace", "--sessions", str(sessions), "--seed", "1", "--duration", str(DAY)]
                       + list(extra) + notebooks, stdout=f, check=True)


def _simulate(trace, out=None, extra=()):
    args = [LOOSELEAF, "simulate", "--json", trace] + list(extra)
    if out:
        args += ["--out", out, "--no-plots"]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(r.stdout), r.stderr.strip()


def frontier(tmp):
    rows, dirs = [], []
    print("  the paper's frontier: N concurrent sessions over a day, GPU notebooks, GPU busy 19% of a pinned session")
    print("  %-9s %-21s %9s %9s %9s %9s %8s %8s" % ("sessions", "design", "GPU-h", "vs pinned", "vs NBOS",
                                                 "vs k-a", "<=1 s", "warm"))
    for n in (24, 48, 72):
        trace = os.path.join(tmp, "frontier_%d.jsonl" % n)
        _trace(trace, n, ["--gpu-busy", "0.19"])
        out = os.path.join(tmp, "%d sessions" % n)
        doc, _ = _simulate(trace, out)
        dirs.append(out)
        pin, nbos, ka = (doc[k]["gpu_hours"] for k in ("pinned", "notebookos", "keepalive"))
        for name, d in doc.items():
            row = {"sessions": n, "design": name, "gpu_hours": d["gpu_hours"],
                   "savings_vs_pinned": 1 - d["gpu_hours"] / pin, "savings_vs_notebookos": 1 - d["gpu_hours"] / nbos,
                   "savings_vs_keepalive": 1 - d["gpu_hours"] / ka, "share_within_1s": d["share_within_1s"],
                   "warm_hit_rate": d["warm_hit_rate"], "peak_gpus": d["peak_gpus"],
                   "mean_busy_gpus": d["mean_busy_gpus"], "latency_p95_s": d["latency_p95_s"]}
            rows.append(row)
            print("  %-9d %-21s %9.1f %8.0f%% %8.0f%% %8.0f%% %7.1f%% %7.1f%%" % (
                n, name, d["gpu_hours"], 100 * row["savings_vs_pinned"], 100 * row["savings_vs_notebookos"],
                100 * row["savings_vs_keepalive"], 100 * d["share_within_1s"], 100 * d["warm_hit_rate"]))
    print("  LooseLeaf next to the paper:")
    print("  %-9s %16s %16s %16s %14s" % ("sessions", "vs pinned", "vs NotebookOS", "vs keep-alive", "<=1 s"))
    for n in (24, 48, 72):
        r = next(r for r in rows if r["sessions"] == n and r["design"] == "looseleaf")
        print("  %-9d %6.0f%% (%7s) %6.0f%% (%7s) %6.0f%% (%7s) %5.1f%% (%s)" % (
            n, 100 * r["savings_vs_pinned"], PAPER["vs_pinned"], 100 * r["savings_vs_notebookos"],
            PAPER["vs_notebookos"], 100 * r["savings_vs_keepalive"], PAPER["vs_keepalive"],
            100 * r["share_within_1s"], PAPER["within_1s"][n]))
    os.makedirs(DOCS, exist_ok=True)
    with open(os.path.join(DOCS, "frontier.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("%.4g" % v if isinstance(v, float) else v) for k, v in r.items()})
    plot = [sys.executable, os.path.join(REPO, "sim", "plot_sim.py")]
    subprocess.run(plot + ["--frontier", os.path.join(DOCS, "frontier.png")] + dirs, check=True)
    subprocess.run(plot + [dirs[1]], check=True, stdout=subprocess.DEVNULL)
    shutil.copy(os.path.join(dirs[1], "provisioned_gpus.png"), os.path.join(DOCS, "provisioned_gpus.png"))
    print("  plots and table: docs/sim/frontier.png, docs/sim/provisioned_gpus.png, docs/sim/frontier.csv")
    print(json.dumps({"bench": "sim_frontier", "looseleaf": [
        {k: r[k] for k in ("sessions", "savings_vs_pinned", "savings_vs_notebookos", "share_within_1s")}
        for r in rows if r["design"] == "looseleaf"]}))


def scale(tmp):
    n = int(os.environ.get("LL_BENCH_SIM_SESSIONS", "10000"))
    trace = os.path.join(tmp, "scale.jsonl")
    t0 = time.perf_counter()
    _trace(trace, n, ["--gpu-busy", "0.19"])
    gen = time.perf_counter() - t0
    size = os.path.getsize(trace)
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc, summary = _simulate(trace)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    rss = after.ru_maxrss / 1024.0
    sessions = doc["looseleaf"]["sessions"]
    cells = doc["looseleaf"]["gpu_cells"]
    print("  scale: %d concurrent sessions over a simulated day (%d sessions, %d GPU cells, trace %.0f MB made in "
          "%.0f s)" % (n, sessions, cells, size / 1e6, gen))
    print("  %s" % summary.replace("looseleaf simulate: ", ""))
    print("  simulate: %.0f s wall, %.0f s CPU on 2 threads, for all %d designs; peak memory %.0f MiB "
          "(target: minutes, < 600 s wall: %s)" % (wall, cpu, len(doc), rss, "met" if wall < 600 else "NOT met"))
    print(json.dumps({"bench": "sim_scale", "concurrent": n, "sessions": sessions, "wall_s": wall, "cpu_s": cpu,
                      "peak_rss_mib": rss}))


def main():
    with tempfile.TemporaryDirectory(prefix="ll-bench-sim-") as tmp:
        frontier(tmp)
        if not os.environ.get("LL_BENCH_SIM_SKIP_SCALE"):
            scale(tmp)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The fleet simulator's tables over several seeds, each figure with a confidence interval.

    python3 sim/experiments.py frontier   [--seeds 5] [--sessions 24,48,72]   # the paper's frontier
    python3 sim/experiments.py ablations  [--seeds 5] [--sessions 48]         # what each mechanism buys
    python3 sim/experiments.py baselines  [--seeds 5] [--sessions 48]         # the baselines' assumed numbers swept
    python3 sim/experiments.py autoscaler [--seeds 5] [--sessions 48]         # the autoscaler's settings swept
    python3 sim/experiments.py fleet      [--seeds 5] [--sessions 48]         # each design under each fleet rule
    python3 sim/experiments.py all        ...                                 # the five, one after the other
    python3 sim/experiments.py mix --workload paper [--seeds 5] [--sessions 48] # the assumed session mix swept

`--workload paper` draws the traces from sim/workload.py (the paper's workload, sim/workload.json) instead of the
tree's notebooks; `--workload-set PATH=VALUE` changes one of its parameters.

(`make sim-frontier`, `make sim-ablations`, `make sim-baselines`, `make sim-autoscaler`, `make sim-fleet`,
`make sim-tables`; `make sim-paper` runs the frontier, the ablations, the fleet's rules, the autoscaler and the mix
on the paper's workload.)

Each seed is its own trace (`looseleaf trace --seed S`: the seats' arrivals, notebooks, reruns, edit windows and
gaps drawn anew) of the same workload: by default the tree's three GPU notebooks, N seats over a simulated day,
their GPU cells scaled so that a pinned session's GPU is busy 19% of the time (`--gpu-busy 0.19`).  Every design
sees the same traces, so differences between designs are paired: a saving is computed per seed, then averaged.

Statistics: a figure is "mean ± h" over the seeds, h the half-width of the two-sided 95% confidence interval of
the mean from Student's t with (seeds - 1) degrees of freedom: h = t(0.975, n-1) * s / sqrt(n), s the sample
standard deviation.  It says how much the figure moves with the draw of the workload, not how far the model is
from a real fleet.  With one seed no interval is given.

Tables are printed as Markdown (paste into the README as they come) and, with --out DIR, written as CSV.
Runs stay small: a day of 48 sessions is simulated in about a second on this project's 2-core machine.
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
WORKLOAD = os.path.join(REPO, "sim", "workload.py")
NOTEBOOKS = [os.path.join(REPO, "examples", n) for n in (
    "looseleaf_torch_training.ipynb", "mrdbourke_00_pytorch_fundamentals.ipynb",
    "mrdbourke_01_pytorch_workflow.ipynb")]

# Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom.
_T975 = [12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423]


def t975(df):
    """The 0.975 quantile of Student's t with DF degrees of freedom (a table to 30, then the Cornish-Fisher
    expansion around the normal's 1.95996, within 1e-3 beyond)."""
    if df < 1:
        raise ValueError("t needs at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_ci(values):
    """(mean, half-width of the t-based 95% confidence interval of the mean); the half-width is None for one
    value."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = sum(values) / n
    if n == 1:
        return m, None
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, t975(n - 1) * s / math.sqrt(n)


def fmt(values, scale=1.0, digits=1, unit=""):
    m, h = mean_ci([v * scale for v in values])
    if h is None:
        return "%.*f%s" % (digits, m, unit)
    return "%.*f ± %.*f%s" % (digits, m, digits, h, unit)


def pct(values, digits=1):
    return fmt(values, 100.0, digits, "%")


SIZES = ("closure_bytes", "written_bytes", "namespace_bytes")


def scale_state(text, factor):
    """TEXT (a trace) with every cell's state sizes times FACTOR (notebook lines and inline session cells): the
    same sessions with larger state, a what-if for the mechanisms that move state (--state-scale)."""
    if factor == 1:
        return text
    out = []
    for line in text.splitlines():
        if '"cells"' in line:
            doc = json.loads(line)
            for c in doc["cells"]:
                for k in SIZES:
                    if k in c:
                        c[k] *= factor
            line = json.dumps(doc, separators=(",", ":"))
        out.append(line)
    return "\n".join(out) + "\n"


class Runner:
    """Traces (made once per size and seed, in a scratch directory) and simulations of them."""

    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.TemporaryDirectory(prefix="ll-sim-exp-")
        self.traces = {}
        self.extra_sets = ()  # sim/workload.py --set, for the mix sweep

    def trace(self, sessions, seed):
        key = (sessions, seed, tuple(self.extra_sets))
        if key not in self.traces:
            path = os.path.join(self.tmp.name, "t%d_%d_%d.jsonl" % (sessions, seed, len(self.traces)))
            if self.args.workload == "paper":
                cmd = [sys.executable, WORKLOAD, "--sessions", str(sessions), "--seed", str(seed),
                       "--duration", str(self.args.duration)]
                for s in self.args.workload_set + list(self.extra_sets):
                    cmd += ["--set", s]
            else:
                cmd = [LOOSELEAF, "trace", "--sessions", str(sessions), "--seed", str(seed),
                       "--duration", str(self.args.duration), "--gpu-busy", str(self.args.gpu_busy)]
                cmd += self.args.notebooks
            r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            with open(path, "w") as f:
                f.write(scale_state(r.stdout, self.args.state_scale))
            self.traces[key] = path
        return self.traces[key]

    def simulate(self, sessions, seed, designs=None, sets=(), ablations=False):
        cmd = [LOOSELEAF, "simulate", "--json", self.trace(sessions, seed)]
        if ablations:
            cmd.append("--ablations")
        if designs:
            cmd += ["--designs", ",".join(designs)]
        for s in sets:
            cmd += ["--set", s]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("looseleaf simulate failed: %s\n%s" % (" ".join(cmd), r.stderr))
        return json.loads(r.stdout)

    def seeds(self):
        return list(range(1, self.args.seeds + 1))


def table(title, head, rows, out=None, name=None):
    print("\n" + title + "\n")
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name + ".csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(head)
            w.writerows(rows)
    sys.stdout.flush()


def _conf(args):
    if args.workload == "paper":
        return ("%d seeds (mean ± t-based 95%% CI over seeds), %s seats over %.0f h (sessions end after it), "
                "the paper's workload (sim/workload.json%s)%s" % (
                    args.seeds, args.sessions, args.duration / 3600,
                    "; " + ", ".join(args.workload_set) if args.workload_set else "",
                    ", state sizes x %g" % args.state_scale if args.state_scale != 1 else ""))
    return ("%d seeds (mean ± t-based 95%% CI over seeds), %s sessions over %.0f h, GPU busy %.0f%% of a pinned "
            "session%s" % (args.seeds, args.sessions, args.duration / 3600, 100 * args.gpu_busy,
                           ", state sizes x %g" % args.state_scale if args.state_scale != 1 else ""))


# ---- the frontier ----

FRONTIER = ["pinned", "pinned_packed", "keepalive", "notebookos", "naive", "looseleaf_noprefetch", "looseleaf"]


def frontier(run, args):
    rows = []
    for n in args.sizes:
        docs = [run.simulate(n, s) for s in run.seeds()]
        for d in FRONTIER:
            col = lambda key: [doc[d][key] for doc in docs]  # noqa: E731
            save = lambda base: [1 - doc[d]["gpu_hours"] / doc[base]["gpu_hours"] for doc in docs]  # noqa: E731
            rows.append([n, d, fmt(col("gpu_hours")), fmt(col("peak_gpus"), digits=0),
                         pct(save("pinned")), pct(save("pinned_packed")), pct(save("notebookos")),
                         pct(save("keepalive")), pct(save("naive")), pct(col("share_within_50ms")),
                         pct(col("share_within_1s")), fmt(col("latency_p99_s"), 1000, 0, " ms")])
    table("Frontier: " + _conf(args),
          ["sessions", "design", "GPU-h", "peak GPUs", "saves vs pinned", "vs packed pinned", "vs NotebookOS",
           "vs keep-alive", "vs naive", "<= 50 ms", "<= 1 s", "p99 wait"], rows, args.out, "frontier")


# ---- ablations ----

ABLATIONS = [("looseleaf", "LooseLeaf"), ("looseleaf_noclosure", "closures off (whole namespace)"),
             ("looseleaf_fullsave", "incremental save off (full save)"),
             ("looseleaf_noprefetch", "prefetch off"), ("looseleaf_noimportcache", "import cache off (cold start)"),
             ("looseleaf_nowarm", "warm worker cache off"), ("naive", "naive serverless")]


def ablations(run, args):
    for n in args.sizes:
        docs = [run.simulate(n, s, ablations=True) for s in run.seeds()]
        rows = []
        for d, what in ABLATIONS:
            col = lambda key: [doc[d][key] for doc in docs]  # noqa: E731
            more = [doc[d]["gpu_hours"] / doc["looseleaf"]["gpu_hours"] - 1 for doc in docs]
            rows.append([what, fmt(col("gpu_hours")), pct(more), fmt(col("working_gpu_hours")),
                         pct(col("share_within_50ms")), pct(col("share_within_1s")),
                         fmt(col("latency_p95_s"), 1000, 0, " ms"), fmt(col("latency_p99_s"), 1000, 0, " ms"),
                         pct(col("warm_hit_rate"))])
        a = argparse.Namespace(**vars(args))
        a.sessions = str(n)
        table("Ablations: " + _conf(a),
              ["design", "GPU-h", "GPU-h vs LooseLeaf", "GPU-h working", "<= 50 ms", "<= 1 s", "p95 wait",
               "p99 wait", "warm"], rows, args.out, "ablations_%d" % n)


# ---- the baselines' assumed numbers ----

NBOS_SUBSCRIPTION = [1, 2, 3, 4, 6, 8, 21]
KEEPALIVE_IDLE = [60, 300, 600, 1200]


def baselines(run, args):
    for n in args.sizes:
        a = argparse.Namespace(**vars(args))
        a.sessions = str(n)
        ll = {s: run.simulate(n, s, designs=["looseleaf"]) for s in run.seeds()}
        rows = []
        for sr in NBOS_SUBSCRIPTION:
            docs = {s: run.simulate(n, s, designs=["notebookos"], sets=["nbos_subscription=%g" % sr])
                    for s in run.seeds()}
            h = [docs[s]["notebookos"]["gpu_hours"] for s in run.seeds()]
            save = [1 - ll[s]["looseleaf"]["gpu_hours"] / docs[s]["notebookos"]["gpu_hours"] for s in run.seeds()]
            rows.append(["nbos_subscription = %g" % sr, fmt(h),
                         fmt([docs[s]["notebookos"]["peak_gpus"] for s in run.seeds()], digits=0), pct(save),
                         pct([docs[s]["notebookos"]["share_within_1s"] for s in run.seeds()])])
        for idle in KEEPALIVE_IDLE:
            docs = {s: run.simulate(n, s, designs=["keepalive"], sets=["keepalive_idle_s=%g" % idle])
                    for s in run.seeds()}
            h = [docs[s]["keepalive"]["gpu_hours"] for s in run.seeds()]
            save = [1 - ll[s]["looseleaf"]["gpu_hours"] / docs[s]["keepalive"]["gpu_hours"] for s in run.seeds()]
            rows.append(["keepalive_idle_s = %g" % idle, fmt(h),
                         fmt([docs[s]["keepalive"]["peak_gpus"] for s in run.seeds()], digits=0), pct(save),
                         pct([docs[s]["keepalive"]["share_within_1s"] for s in run.seeds()])])
        table("Baselines' assumed parameters swept: " + _conf(a),
              ["setting", "baseline GPU-h", "baseline peak GPUs", "LooseLeaf saves", "baseline <= 1 s"], rows,
              args.out, "baselines_%d" % n)


# ---- the autoscaler ----

AUTOSCALER = [("target_util", [0.5, 0.6, 0.75, 0.9]), ("p_wait", [0.01, 0.05, 0.2]),
              ("load_window_s", [60, 300, 900]), ("down_hold_s", [0, 120, 600, 1800]), ("min_hosts", [0, 1, 2]),
              ("control_s", [1, 10, 60]), ("host_boot_s", [30, 120, 300])]


def autoscaler(run, args):
    for n in args.sizes:
        a = argparse.Namespace(**vars(args))
        a.sessions = str(n)
        pin = {s: run.simulate(n, s, designs=["pinned"]) for s in run.seeds()}
        rows = []
        for name, values in AUTOSCALER:
            for v in values:
                docs = {s: run.simulate(n, s, designs=["looseleaf", "keepalive", "naive"],
                                        sets=["%s=%g" % (name, v)]) for s in run.seeds()}
                col = lambda d, key: [docs[s][d][key] for s in run.seeds()]  # noqa: E731
                save = [1 - docs[s]["looseleaf"]["gpu_hours"] / pin[s]["pinned"]["gpu_hours"] for s in run.seeds()]
                ka = [1 - docs[s]["looseleaf"]["gpu_hours"] / docs[s]["keepalive"]["gpu_hours"] for s in run.seeds()]
                rows.append(["%s = %g" % (name, v), fmt(col("looseleaf", "gpu_hours")), pct(save),
                             pct(col("looseleaf", "share_within_50ms")), pct(col("looseleaf", "share_within_1s")),
                             fmt(col("looseleaf", "latency_p99_s"), 1000, 0, " ms"),
                             fmt(col("keepalive", "gpu_hours")), pct(ka), fmt(col("naive", "gpu_hours"))])
        table("Autoscaler sensitivity (one setting changed at a time, for every design on the elastic fleet; "
              "sim/costs.json's defaults: target_util 0.75, p_wait 0.05, load_window_s 300, down_hold_s 600, "
              "min_hosts 1, control_s 10, host_boot_s 120): " + _conf(a),
              ["setting", "LooseLeaf GPU-h", "saves vs pinned", "<= 50 ms", "<= 1 s", "p99 wait", "keep-alive GPU-h",
               "LooseLeaf saves vs keep-alive", "naive GPU-h"], rows, args.out, "autoscaler_%d" % n)


# ---- the fleet's rules: the same for every design, three ways ----

FLEETS = [("elastic fleet (default: min_hosts 1, down_hold_s 600)", []),
          ("elastic fleet, min_hosts 0, down_hold_s 0", ["min_hosts=0", "down_hold_s=0"]),
          ("shared capacity (fleet_shared=1)", ["fleet_shared=1"])]
FLEET_DESIGNS = ["keepalive", "naive", "looseleaf"]


def fleet(run, args):
    """LooseLeaf, keep-alive and naive serverless under each of the fleet's rules, every design under the same
    one: what the hosts' accounting costs, apart from what each design holds."""
    for n in args.sizes:
        rows = []
        for what, sets in FLEETS:
            docs = [run.simulate(n, s, designs=FLEET_DESIGNS, sets=sets) for s in run.seeds()]
            col = lambda d, key: [doc[d][key] for doc in docs]  # noqa: E731
            for d in FLEET_DESIGNS:
                ka = [1 - doc[d]["gpu_hours"] / doc["keepalive"]["gpu_hours"] for doc in docs]
                rows.append([what, d, fmt(col(d, "gpu_hours")), fmt(col(d, "held_gpu_hours")),
                             fmt(col(d, "peak_gpus"), digits=0), pct(ka), pct(col(d, "share_within_50ms")),
                             pct(col(d, "share_within_1s")), fmt(col(d, "latency_p99_s"), 1000, 0, " ms")])
        a = argparse.Namespace(**vars(args))
        a.sessions = str(n)
        table("The fleet's rules, the same for each design: " + _conf(a),
              ["fleet", "design", "GPU-h", "GPU-h held", "peak GPUs", "saves vs keep-alive", "<= 50 ms", "<= 1 s",
               "p99 wait"], rows, args.out, "fleet_%d" % n)


# ---- the paper's workload: the assumed session mix swept ----

CATEGORIES = ["training", "training_inference", "peft", "inference"]
MIX_DESIGNS = ["pinned", "keepalive", "notebookos", "naive", "looseleaf"]


def mix(run, args):
    """Each of the four kinds at 55% of sessions (the others 15% each) and the default equal shares: what the
    assumed shares move (sim/workload.json marks them assumed)."""
    if args.workload != "paper":
        sys.exit("mix sweeps sim/workload.json's session mix: use --workload paper")
    mixes = [("equal shares (default)", {})]
    for c in CATEGORIES:
        mixes.append(("%s 55%%, others 15%%" % c, {k: (0.55 if k == c else 0.15) for k in CATEGORIES}))
    for n in args.sizes:
        rows = []
        for what, shares in mixes:
            run.extra_sets = tuple("categories.%s.share=%g" % kv for kv in sorted(shares.items()))
            docs = [run.simulate(n, s, designs=MIX_DESIGNS) for s in run.seeds()]
            col = lambda d, key: [doc[d][key] for doc in docs]  # noqa: E731
            save = lambda b: [1 - doc["looseleaf"]["gpu_hours"] / doc[b]["gpu_hours"] for doc in docs]  # noqa: E731
            rows.append([what, fmt(col("looseleaf", "gpu_hours")), pct(save("pinned")), pct(save("keepalive")),
                         pct(save("notebookos")), pct(save("naive")), pct(col("looseleaf", "share_within_1s")),
                         fmt(col("looseleaf", "latency_p99_s"), 1000, 0, " ms"),
                         pct(col("naive", "share_within_1s"))])
        run.extra_sets = ()
        a = argparse.Namespace(**vars(args))
        a.sessions = str(n)
        table("The session mix swept (the paper's Table 2 shares are not available; equal shares assumed): " + _conf(a),
              ["mix", "LooseLeaf GPU-h", "saves vs pinned", "vs keep-alive", "vs NotebookOS", "vs naive",
               "LooseLeaf <= 1 s", "LooseLeaf p99 wait", "naive <= 1 s"], rows, args.out, "mix_%d" % n)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["frontier", "ablations", "baselines", "autoscaler", "fleet", "mix", "all"])
    p.add_argument("--seeds", type=int, default=5, help="traces per size, seeds 1..N (default 5)")
    p.add_argument("--sessions", default=None,
                   help="concurrent sessions, comma-separated (default 24,48,72 for the frontier, else 48)")
    p.add_argument("--duration", type=float, default=86400, help="simulated seconds (default a day)")
    p.add_argument("--gpu-busy", type=float, default=0.19, help="looseleaf trace --gpu-busy (default 0.19)")
    p.add_argument("--notebooks", nargs="+", default=NOTEBOOKS, help="the notebooks (default the tree's three "
                   "GPU notebooks)")
    p.add_argument("--state-scale", type=float, default=1.0,
                   help="multiply every cell's closure, written and namespace bytes (a what-if: the tree's "
                   "notebooks hold at most 1.8 MB; default 1)")
    p.add_argument("--workload", choices=["tree", "paper"], default="tree",
                   help="tree: `looseleaf trace` on the tree's notebooks (default); paper: sim/workload.py, the "
                   "paper's workload from sim/workload.json (--gpu-busy and --notebooks do not apply)")
    p.add_argument("--workload-set", action="append", default=[], metavar="PATH=VALUE",
                   help="with --workload paper: change one parameter of sim/workload.json (repeatable)")
    p.add_argument("--out", help="also write each table as DIR/NAME.csv")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    if not os.access(LOOSELEAF, os.X_OK):
        sys.exit("%s is missing: run `make all` first" % LOOSELEAF)
    if args.workload_set and args.workload != "paper":
        p.error("--workload-set needs --workload paper")
    run = Runner(args)
    todo = ["frontier", "ablations", "baselines", "autoscaler", "fleet"] if args.what == "all" else [args.what]
    for what in todo:
        a = argparse.Namespace(**vars(args))
        a.sessions = args.sessions or ("24,48,72" if what == "frontier" else "48")
        a.sizes = [int(x) for x in a.sessions.split(",")]
        globals()[what](run, a)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""workload: traces of the paper's workload for `looseleaf simulate`, from one parameter file (sim/workload.json).

    python3 sim/workload.py [--sessions N] [--seed S] [--duration D] [--params FILE] [--set PATH=VALUE]... > t.jsonl
    python3 sim/workload.py check [--sessions N] [--seed S]     # the generated distributions against the file's
    python3 sim/workload.py fit                                 # refit the two fitted parameters (prints them)
    python3 sim/workload.py derive TEMPLATE.json                # the Adobe tables, from NotebookOS's released template

The other trace source, `looseleaf trace`, replays the tree's tutorial notebooks (98.6% of their cells GPU, at most
1.8 MB of state).  This one follows the paper's description instead: sessions of four kinds
(training, training with inference, parameter-efficient fine-tuning, inference only) on models from an 11.7 M
parameter CNN to a 14 B parameter LLM, state sizes from the models (parameters x bytes, Adam's two fp32 moments for
what is trained), GPU-cell durations from the A100's published throughput scaled to the model, and the timing of a
session (its length, its tasks, the time between them) from the Adobe notebook trace that NotebookOS released.
Every number comes from sim/workload.json, each with its source or marked assumed; sim/API.md "The paper's
workload" says how a session is built.

A trace depends only on the parameter file, the options and the tree's notebooks (the CPU cells are the cells
`looseleaf analyze` labels CPU in examples/, with the times `looseleaf trace` measured for them): each seat draws
from its own generator, seeded by (seed, seat).
"""
import argparse
import bisect
import copy
import heapq
import json
import math
import os
import random
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
PARAMS = os.path.join(REPO, "sim", "workload.json")


def val(x):
    """A parameter's value: {"value": V, "source": ...} or V itself."""
    return x["value"] if isinstance(x, dict) and "value" in x else x


def load_params(path=PARAMS, sets=()):
    """The parameter file with --set PATH=VALUE applied (PATH: dot-separated keys; a {"value": ...} entry is set
    through its value).  Checks that the category shares sum to 1."""
    with open(path) as f:
        p = json.load(f)
    for s in sets:
        key, _, text = s.partition("=")
        if not text:
            raise ValueError("--set wants PATH=VALUE, not %r" % s)
        node, parts = p, key.split(".")
        for k in parts[:-1]:
            if not isinstance(node, dict) or k not in node:
                raise ValueError("--set %s: no such parameter" % key)
            node = node[k]
        last = parts[-1]
        if not isinstance(node, dict) or last not in node:
            raise ValueError("--set %s: no such parameter" % key)
        v = json.loads(text)
        if isinstance(node[last], dict) and "value" in node[last]:
            node[last]["value"] = v
        else:
            node[last] = v
    total = sum(val(c["share"]) for c in p["categories"].values())
    if abs(total - 1) > 1e-6 or any(val(c["share"]) < 0 for c in p["categories"].values()):
        raise ValueError("the category shares must be >= 0 and sum to 1 (they sum to %g)" % total)
    return p


# ---- distributions ----

def quantile_draw(rng, table):
    """A draw from a distribution given by quantiles: table["p"] (increasing, 0..1) and table["x"], linear between
    them (the inverse CDF)."""
    ps, xs = table["p"], table["x"]
    u = rng.random()
    i = bisect.bisect_right(ps, u)
    if i <= 0:
        return xs[0]
    if i >= len(ps):
        return xs[-1]
    f = (u - ps[i - 1]) / (ps[i] - ps[i - 1]) if ps[i] > ps[i - 1] else 0
    return xs[i - 1] + f * (xs[i] - xs[i - 1])


def lognormal(rng, d):
    return val(d["median"]) * math.exp(val(d["sigma"]) * rng.gauss(0, 1))


def quantile(values, q):
    v = sorted(values)
    if not v:
        raise ValueError("no values")
    k = q * (len(v) - 1)
    lo = int(math.floor(k))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (k - lo) * (v[hi] - v[lo])


# ---- models: state and time per step ----

def model_state(p, cat, entry):
    """(weight bytes, trained bytes, total model state) for ENTRY of category CAT: the weights at the entry's
    precision; what training writes (every weight and its Adam moments for full training; the LoRA adapter and
    its moments for PEFT; nothing for inference)."""
    m = p["models"][entry["model"]]
    n = val(m["params"])
    weights = n * val(entry["weight_bytes"])
    if cat["state"] == "full":
        trained = weights + n * val(p["state"]["adam_bytes_per_param"])
        return weights, trained, trained
    if cat["state"] == "lora":
        lora = n * val(p["state"]["lora_fraction"])
        trained = lora * (val(p["state"]["lora_weight_bytes"]) + val(p["state"]["adam_bytes_per_param"]))
        return weights, trained, weights + trained
    return weights, 0.0, weights


def step_s(p, kind, entry):
    """Seconds of one step of KIND on ENTRY's model: FLOPs over the GPU's sustained rate (peak x MFU), and for a
    decoder generating tokens at least its weights read once from GPU memory per token."""
    t = p["throughput"]
    m = p["models"][entry["model"]]
    rate = val(t["peak_flops"]) * val(t["mfu"])
    per_step = val(t["tokens_per_step"]) if m["unit"] == "token" else val(t["images_per_step"])
    fwd = val(m["fwd_flops_per_unit"])
    if kind == "train":
        return val(t["train_flops_factor"]) * fwd * per_step / rate
    if kind == "peft":
        return val(t["peft_flops_factor"]) * fwd * per_step / rate
    if m.get("decoder"):
        batch = val(t["decode_batch"])
        weights = val(m["params"]) * val(entry["weight_bytes"])
        return max(fwd * batch / rate, weights / val(t["hbm_bw"]))
    return fwd * per_step / rate


# ---- the tree's cells (labels by looseleaf analyze, CPU times measured by looseleaf trace) ----

def tree_cells(p, measure=True):
    """(cpu cells, gpu cells, import_s) from `looseleaf trace` on the parameter file's notebooks: each cell's label
    (the project's analysis), imports and measured time (cached by looseleaf trace; --no-measure: times 0)."""
    nbs = [os.path.join(REPO, n) for n in p["cells"]["notebooks"]]
    cmd = [LOOSELEAF, "trace", "--sessions", "1"] + ([] if measure else ["--no-run"]) + nbs
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("workload: %s failed:\n%s" % (" ".join(cmd), r.stderr))
    cpu, gpu, import_s = [], [], {}
    for line in r.stdout.splitlines():
        d = json.loads(line)
        if "trace" in d:
            import_s = d.get("import_s", {})
        elif "notebook" in d and "session" not in d:
            for c in d["cells"]:
                cell = {"exec_s": c["exec_s"], "imports": c.get("imports", []), "source": d["source"]}
                (gpu if c["label"] == "gpu" else cpu).append(cell)
    if not cpu or not gpu:
        sys.exit("workload: the notebooks gave %d CPU and %d GPU cells; both kinds are needed" % (len(cpu), len(gpu)))
    return cpu, gpu, import_s


# ---- one session ----

def choose(rng, weighted):
    """A key of WEIGHTED (key -> weight) drawn by weight, keys in sorted order (deterministic)."""
    keys = sorted(weighted)
    u = rng.random() * sum(weighted[k] for k in keys)
    for k in keys:
        u -= weighted[k]
        if u < 0:
            return k
    return keys[-1]


def spacings(rng, n, total):
    """N nonnegative pieces summing to TOTAL, uniform spacings (the gaps between N-1 uniform points)."""
    cuts = sorted(rng.random() * total for _ in range(n - 1))
    edges = [0.0] + cuts + [total]
    return [edges[i + 1] - edges[i] for i in range(n)]


def session(p, rng, pools):
    """One session drawn with RNG: (facts, cells, tail_s).  Its length, task count, the share of its tasks that
    use a GPU, the delay to the first task and the time between tasks come from the Adobe tables; CPU cells
    (the tree's, by their analysis labels) are added between tasks so that the share of GPU cells follows the
    paper's; a GPU cell lasts what a GPU task of the trace lasted, at least min_steps of its model's steps."""
    cpu_pool, gpu_pool = pools
    cats = p["categories"]
    cname = choose(rng, {k: val(c["share"]) for k, c in cats.items()})
    cat = cats[cname]
    entry = cat["models"][int(rng.random() * len(cat["models"]))]
    weights, trained, model_bytes = model_state(p, cat, entry)
    a = p["adobe"]
    data = lognormal(rng, p["state"]["data_bytes"])
    extra_mean = val(p["cells"]["extra_cpu_cells_per_interval"])
    steps = p["gpu_cell"]
    kinds = cat["kinds"]  # one kind, or [train, infer] for training with inference
    train_share = val(cat.get("train_share", 1.0))
    edit = p["edit_s"]

    cells = []
    loaded = False
    t_end = 0.0

    def cpu_cell():
        src = cpu_pool[int(rng.random() * len(cpu_pool))]
        written = lognormal(rng, p["state"]["cpu_written_bytes"])
        return {"label": "cpu", "exec_s": src["exec_s"], "closure_bytes": data, "written_bytes": written,
                "namespace_bytes": data + (model_bytes if loaded else 0), "imports": src["imports"]}

    def gpu_task():
        """(kind, seconds) of a GPU task: the trace's GPU task durations, at least min_steps of the model's time
        per step (sim/API.md)."""
        kind = kinds[0] if len(kinds) == 1 else (kinds[0] if rng.random() < train_share else kinds[1])
        return kind, max(quantile_draw(rng, a["gpu_task_minutes"]) * 60,
                         val(steps["min_steps"]) * step_s(p, kind, entry))

    def gpu_cell(kind, exec_s):
        nonlocal loaded
        src = gpu_pool[int(rng.random() * len(gpu_pool))]
        ns = data + (model_bytes if loaded else 0)
        if not loaded:
            # The session's first GPU cell builds (or loads) the model: it reads the data, writes all the state.
            closure, written = data, model_bytes
        elif kind == "infer":
            # Inference reads the weights (not the optimizer) and the inputs, writes its outputs.
            closure, written = weights + data, lognormal(rng, p["state"]["output_bytes"])
        else:
            closure, written = model_bytes + data, trained
        loaded = True
        return {"label": "gpu", "kind": kind, "exec_s": exec_s, "closure_bytes": closure, "written_bytes": written,
                "namespace_bytes": ns, "imports": src["imports"]}

    def interval(span, task):
        """Cells over SPAN seconds ending with TASK (a cell factory): some extra CPU cells, then the task; the
        span is split among their think times (gap + edit window) after the CPU cells' own times."""
        nonlocal t_end
        k = 0
        while rng.random() < extra_mean / (1 + extra_mean):  # geometric, mean extra_mean
            k += 1
        made = [cpu_cell() for _ in range(k)]
        busy = sum(c["exec_s"] for c in made)
        for c, piece in zip(made + [None], spacings(rng, k + 1, max(0.0, span - busy))):
            c = c if c is not None else task()
            e = min(lognormal(rng, edit), piece)
            c["gap_s"], c["edit_s"] = piece - e, e
            cells.append(c)
            t_end += piece + c["exec_s"]

    # The session's length and its tasks are drawn from their own tables (the trace gives them apart); when
    # the tasks overrun the length, the times between them shrink in proportion so that they fit (the length
    # keeps the trace's distribution; short sessions get shorter gaps); GPU tasks that alone overrun it are drawn
    # again (fewer tasks in shorter sessions: in the trace, tasks and length correlate at 0.30), and after
    # max_draws the session lasts longer, its tail drawn from the trace's.
    length = quantile_draw(rng, a["session_minutes"]) * 60
    for _ in range(int(val(p["max_draws"]))):
        ntasks = max(1, int(round(quantile_draw(rng, a["tasks_per_session"]))))
        gshare = quantile_draw(rng, a["gpu_task_share"])
        tasks = [gpu_task() if rng.random() < gshare else None for _ in range(ntasks)]
        if sum(t[1] for t in tasks if t) < length:
            break
    spans = [quantile_draw(rng, a["first_task_minutes"]) * 60] + \
        [quantile_draw(rng, a["gap_minutes"]) * 60 for _ in range(ntasks - 1)]
    busy = sum(t[1] for t in tasks if t)
    if busy + sum(spans) > length and busy < length:
        f = (length - busy) / sum(spans)
        spans = [x * f for x in spans]
    # It opens with a CPU cell (imports, data), then its tasks.
    setup = cpu_cell()
    setup["gap_s"], setup["edit_s"] = 0.0, min(lognormal(rng, edit), spans[0])
    cells.append(setup)
    t_end = setup["edit_s"] + setup["exec_s"]
    spans[0] = max(0.0, spans[0] - t_end)
    for task, span in zip(tasks, spans):
        interval(span, (lambda t=task: gpu_cell(*t)) if task else cpu_cell)
    tail = length - t_end
    if tail < 0:
        tail = quantile_draw(rng, a["tail_minutes"]) * 60
    facts = {"category": cname, "model": entry["model"], "model_bytes": model_bytes, "data_bytes": data}
    return facts, cells, tail


# ---- a trace ----

def generate(p, sessions, seed, duration, pools, import_s, out, params_path=PARAMS):
    """Write a trace of SESSIONS seats (each its own generator) to OUT: sessions back to back per seat until
    DURATION (0: one each), in arrival order."""
    spread = val(p["spread_s"])
    header = {"trace": "looseleaf-fleet", "version": 1, "generator": "sim/workload.py", "workload": "paper",
              "params": os.path.relpath(params_path, REPO) if params_path.startswith(REPO) else params_path,
              "seed": seed, "sessions": sessions, "duration_s": duration, "import_s": import_s}
    out.write(json.dumps(header, separators=(",", ":"), sort_keys=True) + "\n")
    seats = []
    for k in range(sessions):
        rng = random.Random("%d:%d" % (seed, k))
        heapq.heappush(seats, (spread * rng.random(), k, rng))
    sid = 0
    digits = lambda x: round(x, 4)  # noqa: E731
    while seats:
        at, k, rng = heapq.heappop(seats)
        facts, cells, tail = session(p, rng, pools)
        for c in cells:
            for key in ("exec_s", "gap_s", "edit_s"):
                c[key] = digits(c[key])
            for key in ("closure_bytes", "written_bytes", "namespace_bytes"):
                c[key] = float(round(c[key]))
        line = {"session": "s%d" % sid, "seat": k, "arrival_s": round(at, 3), "tail_s": round(tail, 3),
                "cells": cells}
        line.update(facts)
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        sid += 1
        end = at + sum(c["gap_s"] + c["edit_s"] + c["exec_s"] for c in cells) + tail
        if duration > 0 and end < duration:
            heapq.heappush(seats, (end, k, rng))


# ---- checking, fitting, deriving ----

def sample_sessions(p, n, seed, pools):
    out = []
    for k in range(n):
        rng = random.Random("%d:%d" % (seed, k))
        rng.random()  # as generate(): the first draw is the arrival
        out.append(session(p, rng, pools))
    return out


def summary(p, sess):
    """The figures the parameter file promises, measured on sessions SESS."""
    cats = {}
    gshare, gdur, lengths, busy, gaps = [], [], [], [], []
    for facts, cells, tail in sess:
        cats[facts["category"]] = cats.get(facts["category"], 0) + 1
        g = [c for c in cells if c["label"] == "gpu"]
        gshare.append(len(g) / len(cells))
        gdur += [c["exec_s"] for c in g]
        length = sum(c["gap_s"] + c["edit_s"] + c["exec_s"] for c in cells) + tail
        lengths.append(length)
        busy.append(sum(c["exec_s"] for c in g) / length if length > 0 else 0)
        gaps += [c["gap_s"] + c["edit_s"] for c in cells[1:]]
    n = len(sess)
    return {"sessions": n, "category_share": {k: v / n for k, v in sorted(cats.items())},
            "gpu_cell_share_median": quantile(gshare, 0.5),
            "gpu_cell_minutes_p25_p50_p75_p90": [quantile(gdur, q) / 60 for q in (0.25, 0.5, 0.75, 0.9)],
            "session_minutes_p25_p50_p75": [quantile(lengths, q) / 60 for q in (0.25, 0.5, 0.75)],
            "gpu_busy_share_of_session_p50_mean": [quantile(busy, 0.5), sum(busy) / n],
            "cell_to_cell_seconds_p10_p50_p90": [quantile(gaps, q) for q in (0.1, 0.5, 0.9)],
            "model_bytes_max": max(f["model_bytes"] for f, _, _ in sess)}


def fit(p, pools, n=3000, seed=12345):
    """The fitted parameter: the mean number of extra CPU cells per interval, so that the median session's share
    of GPU cells is the paper's (bisection on sampled sessions)."""
    q = copy.deepcopy(p)
    goal = val(p["cells"]["gpu_cell_share_target"])
    lo, hi = 0.0, 20.0
    for _ in range(14):
        mid = (lo + hi) / 2
        q["cells"]["extra_cpu_cells_per_interval"] = {"value": mid}
        share = summary(q, sample_sessions(q, n, seed, pools))["gpu_cell_share_median"]
        lo, hi = (mid, hi) if share > goal else (lo, mid)
    return {"extra_cpu_cells_per_interval": round((lo + hi) / 2, 2)}


QS = [0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1]


def derive(path):
    """The Adobe tables from NotebookOS's workload template (its sessions' start/stop ticks and training events;
    one tick = 60 s)."""
    with open(path) as f:
        t = json.load(f)
    ss = [s for s in t["sessions"] if s.get("trainings")]
    tasks = [sorted(s["trainings"], key=lambda e: e["start_tick"]) for s in ss]
    table = lambda v: {"p": QS, "x": [round(quantile(v, q), 3) for q in QS]}  # noqa: E731
    gaps = [b["start_tick"] - a["end_tick"] for ts in tasks for a, b in zip(ts, ts[1:])]
    gdur = [e["duration_in_ticks"] for ts in tasks for e in ts if e["gpus"] > 0]
    return {
        "sessions": len(ss), "events": sum(len(ts) for ts in tasks),
        "session_minutes": table([s["stop_tick"] - s["start_tick"] for s in ss]),
        "tasks_per_session": table([len(ts) for ts in tasks]),
        "gpu_task_share": table([sum(e["gpus"] > 0 for e in ts) / len(ts) for ts in tasks]),
        "first_task_minutes": table([ts[0]["start_tick"] - s["start_tick"] for s, ts in zip(ss, tasks)]),
        "gap_minutes": table(gaps),
        "tail_minutes": table([s["stop_tick"] - max(e["end_tick"] for e in ts) for s, ts in zip(ss, tasks)]),
        "gpu_task_minutes": table(gdur),
        "gpu_task_minutes_p25_p50_p75_p90": [quantile(gdur, q) for q in (0.25, 0.5, 0.75, 0.9)],
        "gpu_busy_share_of_session_p50_mean": [
            quantile([sum(e["duration_in_ticks"] for e in ts if e["gpus"] > 0) / (s["stop_tick"] - s["start_tick"])
                      for s, ts in zip(ss, tasks)], 0.5),
            sum(sum(e["duration_in_ticks"] for e in ts if e["gpus"] > 0) / (s["stop_tick"] - s["start_tick"])
                for s, ts in zip(ss, tasks)) / len(ss)],
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    what = argv[0] if argv and argv[0] in ("check", "fit", "derive") else "generate"
    if what != "generate":
        argv = argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1, help="seats: concurrent sessions (default 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=0,
                    help="a seat takes a new session when one ends, until this many seconds (default 0: one each)")
    ap.add_argument("--params", default=PARAMS, help="the parameter file (default sim/workload.json)")
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                    help="change one parameter, e.g. categories.training.share=0.4 (JSON value)")
    ap.add_argument("--no-measure", action="store_true",
                    help="do not run the notebooks: CPU cells' times 0 (labels and imports still analysed)")
    ap.add_argument("template", nargs="?", help="derive: NotebookOS's workload template JSON")
    a = ap.parse_args(argv)
    if what == "derive":
        if not a.template:
            ap.error("derive needs the template file")
        json.dump(derive(a.template), sys.stdout, indent=1)
        print()
        return 0
    if a.sessions < 1:
        ap.error("--sessions must be at least 1")
    try:
        p = load_params(a.params, a.set)
    except (ValueError, KeyError, OSError) as e:
        sys.exit("workload: %s" % e)
    if not os.access(LOOSELEAF, os.X_OK):
        sys.exit("workload: %s is missing: run `make all` first" % LOOSELEAF)
    cpu, gpu, import_s = tree_cells(p, measure=not a.no_measure)
    if what == "fit":
        print(json.dumps(fit(p, (cpu, gpu)), indent=1))
    elif what == "check":
        print(json.dumps(summary(p, sample_sessions(p, a.sessions, a.seed, (cpu, gpu))), indent=1))
    else:
        generate(p, a.sessions, a.seed, a.duration, (cpu, gpu), import_s, sys.stdout, a.params)
    return 0


if __name__ == "__main__":
    sys.exit(main())

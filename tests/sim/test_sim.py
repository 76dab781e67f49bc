"""`looseleaf trace` and `looseleaf simulate` (issue 18; sim/API.md): the commands, the trace format's errors,
and the simulator's fidelity against a measured run of bench_prefetch.

Fidelity: sim/fidelity/bench_prefetch_recorded.json is one run of bench_prefetch's editing sessions (3 kernels
sharing a host pool of 2 slots, 16 GPU cells each; with and without edit-time hints) recorded cell by cell on
this 2-core VM by sim/fidelity/record_prefetch.py.  sim/fidelity/to_trace.py turns it into a trace (the recorded
edit windows, gaps, execution times, closures); the simulator, with the cost table's numbers (sim/costs.json:
`make bench` figures, none from this recording), must predict what was measured:

  warm-hit rate                          within 5 points
  GPU-seconds held / connected (the pool's per-session bill)   within 5 points
  median and p95 of the visible wait     within a factor of 2.5, or 10 ms
  GPU cells starting within 1 s          within 2 points

Why a factor of 2.5 for the latency percentiles: three recordings of the same bench on this shared VM gave
median visible waits without hints of 23, 58 and 92 ms (a factor of 4 between runs); the cost table's numbers
come from a quieter `make bench` run.  The rates and the held share depend on the schedule, not on the machine's
load, and are held to 5 points.
"""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
RECORDED = os.path.join(REPO, "sim", "fidelity", "bench_prefetch_recorded.json")
sys.path.insert(0, os.path.join(REPO, "sim", "fidelity"))

import to_trace  # noqa: E402

DESIGNS = ["pinned", "pinned_packed", "keepalive", "notebookos", "naive", "looseleaf_noprefetch", "looseleaf"]


def _run(args, **kw):
    return subprocess.run([LOOSELEAF] + args, capture_output=True, text=True, timeout=120, **kw)


def _write(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A trace of 6 sessions of the tree's torch example, measured (cached in a private cache dir)."""
    d = tmp_path_factory.mktemp("trace")
    env = dict(os.environ, XDG_CACHE_HOME=str(d / "cache"))
    nb = os.path.join(REPO, "examples", "looseleaf_torch_training.ipynb")
    r = _run(["trace", "--sessions", "6", "--seed", "7", "--spread", "60", nb], env=env)
    assert r.returncode == 0, r.stderr
    path = d / "t.jsonl"
    path.write_text(r.stdout)
    again = _run(["trace", "--sessions", "6", "--seed", "7", "--spread", "60", nb], env=env)
    assert again.stdout == r.stdout, "a trace depends only on its options (the measurement is cached)"
    assert "running" not in again.stderr
    return path


def test_trace_format(trace):
    lines = [json.loads(l) for l in trace.read_text().splitlines()]
    head, nb, sessions = lines[0], lines[1], lines[2:]
    assert head["trace"] == "looseleaf-fleet" and head["seed"] == 7 and head["sessions"] == 6
    assert head["distributions"]["edit_s_lognormal"] == {"median": 10.0, "sigma": 1.0}
    assert head["import_s"]["torch"] > 0.1  # measured in a fresh interpreter
    assert nb["notebook"] == "nb0" and nb["source"].endswith("looseleaf_torch_training.ipynb")
    # The project's own analysis: every cell of the torch example is a GPU cell, and the training cell reads the
    # model, the optimiser and the data; their sizes were measured by running the notebook.
    assert all(c["label"] == "gpu" for c in nb["cells"]) and nb["cells"][0]["imports"] == ["torch"]
    train = nb["cells"][3]
    assert {"model", "opt", "X", "y"} <= set(train["state"]) and train["closure_bytes"] > 1000
    assert len(sessions) == 6 and [s["arrival_s"] for s in sessions] == sorted(s["arrival_s"] for s in sessions)
    assert all(0 <= s["arrival_s"] <= 60 for s in sessions)
    for s in sessions:
        cells = [c["cell"] for c in s["cells"]]
        assert cells == sorted(cells) and set(cells) == set(range(len(nb["cells"])))  # in order, reruns kept
        assert all(c["edit_s"] > 0 and c["gap_s"] > 0 for c in s["cells"])


def test_simulate_table_and_json(trace, tmp_path):
    r = _run(["simulate", str(trace)])
    assert r.returncode == 0, r.stderr
    for name in DESIGNS:
        assert name in r.stdout
    assert "6 sessions" in r.stdout
    j = _run(["simulate", "--json", "--out", str(tmp_path / "out"), "--no-plots", str(trace)])
    assert j.returncode == 0, j.stderr
    doc = json.loads(j.stdout)
    assert list(doc) == DESIGNS
    for name, d in doc.items():
        for key in ("gpu_hours", "peak_gpus", "mean_busy_gpus", "share_within_1s", "latency_p50_s",
                    "latency_p95_s", "warm_hit_rate", "latency_cdf", "sessions"):
            assert key in d, (name, key)
        assert d["sessions"] == 6 and d["gpu_cells"] == doc["pinned"]["gpu_cells"] > 0
        assert d["peak_gpus"] % 8 == 0  # whole hosts
        cdf = [s for _, s in d["latency_cdf"]]
        assert cdf == sorted(cdf) and 0 <= cdf[0] and cdf[-1] <= 1
    assert doc["pinned"]["warm_hit_rate"] == 1.0 and doc["naive"]["warm_hit_rate"] == 0.0
    # NotebookOS keeps three replicas on distinct hosts: at least three hosts.
    assert doc["notebookos"]["peak_gpus"] >= 24
    # Edit-time prefetch: more warm hits than without, and the cells start within 1 s.
    assert doc["looseleaf"]["warm_hit_rate"] > doc["looseleaf_noprefetch"]["warm_hit_rate"]
    assert doc["looseleaf"]["share_within_1s"] >= 0.95
    for f in ("summary.csv", "cdf.csv", "timeline.csv"):
        assert (tmp_path / "out" / f).stat().st_size > 0
    head = (tmp_path / "out" / "summary.csv").read_text().splitlines()
    assert head[0].startswith("design,gpu_hours") and len(head) == 1 + len(DESIGNS)


def test_simulate_threads_agree(trace):
    one = json.loads(_run(["simulate", "--json", "--threads", "1", str(trace)]).stdout)
    two = json.loads(_run(["simulate", "--json", "--threads", "2", str(trace)]).stdout)
    assert one == two
    one = json.loads(_run(["simulate", "--json", "--ablations", "--threads", "1", str(trace)]).stdout)
    two = json.loads(_run(["simulate", "--json", "--ablations", "--threads", "2", str(trace)]).stdout)
    assert one == two and len(one) == 7


def test_simulate_bad_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    _write(bad, [{"session": "a", "arrival_s": 5, "cells": []}, {"session": "b", "arrival_s": 1, "cells": []}])
    r = _run(["simulate", str(bad)])
    assert r.returncode == 1 and "line 2" in r.stderr and "arrival order" in r.stderr
    _write(bad, ['{"session": "a", "arrival_s": 0, "cells": [{"label": "tpu", "exec_s": 1}]}'])
    r = _run(["simulate", str(bad)])
    assert r.returncode == 1 and "line 1" in r.stderr and "label" in r.stderr
    _write(bad, ["not json"])
    assert _run(["simulate", str(bad)]).returncode == 1
    assert _run(["simulate", str(tmp_path / "missing.jsonl")]).returncode == 2
    assert _run(["simulate", "--designs", "nope", str(bad)]).returncode == 2
    r = _run(["simulate", "--set", "no_such_cost=1", str(bad)])
    assert r.returncode == 2 and "no_such_cost" in r.stderr
    assert _run(["simulate"]).returncode == 2
    assert _run(["trace"]).returncode == 2
    r = _run(["trace", "--no-run", str(tmp_path / "missing.ipynb")])
    assert r.returncode == 1 and "cannot open" in r.stderr


def test_operator_trace_inline_cells(tmp_path):
    """A trace an operator writes from logs: cells inline, no notebook lines, numbers as session ids."""
    t = tmp_path / "ops.jsonl"
    _write(t, [{"session": 1, "arrival_s": 0, "cells": [
                   {"label": "cpu", "exec_s": 2, "edit_s": 5, "gap_s": 1},
                   {"label": "gpu", "exec_s": 30, "edit_s": 20, "gap_s": 10, "closure_bytes": 2e9,
                    "written_bytes": 1e8, "namespace_bytes": 4e9, "imports": ["torch"]}]},
               {"session": 2, "arrival_s": 3, "tail_s": 60,
                "cells": [{"label": "gpu", "exec_s": 5, "edit_s": 3}]}])
    doc = json.loads(_run(["simulate", "--json", str(t)]).stdout)
    assert doc["pinned"]["gpu_cells"] == 2 and doc["looseleaf"]["sessions"] == 2


def _predict(trace_path, design):
    r = _run(["simulate", "--json", "--hosts", "1", "--gpus-per-host", "2", "--gpu", "none", "--designs", design,
              str(trace_path)])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[design]


def _close(pred, meas, factor=2.5, slack=0.010):
    return meas / factor - slack <= pred <= meas * factor + slack


@pytest.mark.parametrize("name,design", [("hints", "looseleaf"), ("nohints", "looseleaf_noprefetch")])
def test_fidelity_bench_prefetch(tmp_path, name, design):
    with open(RECORDED) as f:
        doc = json.load(f)
    path = tmp_path / ("%s.jsonl" % name)
    _write(path, to_trace.trace_lines(doc, name))
    meas = to_trace.figures(doc, name)
    pred = _predict(path, design)
    report = "%s: measured %s, predicted %s" % (name, meas, {k: pred[k] for k in (
        "latency_p50_s", "latency_p95_s", "warm_hit_rate", "session_held_share", "share_within_1s")})
    assert pred["gpu_cells"] == meas["gpu_cells"] == 48, report
    assert abs(pred["warm_hit_rate"] - meas["warm_hit_rate"]) <= 0.05, report
    assert abs(pred["session_held_share"] - meas["session_held_share"]) <= 0.05, report
    assert abs(pred["share_within_1s"] - 1.0) <= 0.02, report  # every measured GPU cell started within 1 s
    assert _close(pred["latency_p50_s"], meas["latency_p50_s"]), report
    assert _close(pred["latency_p95_s"], meas["latency_p95_s"]), report


def test_trace_from_recorded_timing(tmp_path):
    """Notebooks saved by JupyterLab with Record Timing: one session each, their own execution times."""
    import datetime
    with open(os.path.join(REPO, "examples", "looseleaf_torch_training.ipynb")) as f:
        nb = json.load(f)
    t, k = 1700000000.0, 0

    def iso(x):
        return datetime.datetime.fromtimestamp(x, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c.setdefault("metadata", {})["execution"] = {"iopub.execute_input": iso(t),
                                                        "shell.execute_reply": iso(t + 2 + k)}
            t += 2 + k + 40
            k += 1
    path = tmp_path / "timed.ipynb"
    path.write_text(json.dumps(nb))
    r = _run(["trace", "--timing", "--no-run", str(path), os.path.join(REPO, "examples", "looseleaf_cpu_basics.ipynb")])
    assert r.returncode == 0, r.stderr
    assert "no recorded timing" in r.stderr  # the second notebook has none: left out
    sessions = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{"session"')]
    assert len(sessions) == 1 and sessions[0]["arrival_s"] == 0
    cells = sessions[0]["cells"]
    assert [c["cell"] for c in cells] == list(range(k))
    assert [round(c["exec_s"], 3) for c in cells] == [2.0 + i for i in range(k)]
    assert all(abs(c["gap_s"] + c["edit_s"] - 40) < 1e-3 for c in cells[1:])  # output to next Run: 40 s


def _seated(path, seats, gpus_first=True):
    """SEATS seats with two sessions each, the second arriving when the first would end without waits (the
    generator's handover): one GPU cell each, so pinned's first cell waits the CUDA start and ends later."""
    lines = []
    for k in range(seats):
        lines.append({"session": "a%d" % k, "seat": k, "arrival_s": k, "tail_s": 5,
                      "cells": [{"label": "gpu", "exec_s": 10, "edit_s": 5, "hints_s": []}]})
    for k in range(seats):  # each ends at k + 5 + 10 + 5 without waits
        lines.append({"session": "b%d" % k, "seat": k, "arrival_s": k + 20, "tail_s": 5,
                      "cells": [{"label": "gpu", "exec_s": 10, "edit_s": 5, "hints_s": []}]})
    _write(path, lines)


def test_seat_handover_never_holds_both(tmp_path):
    """Issue 26: a seat's next session arrives when the previous one would have ended without waits; with waits
    (pinned's CUDA start) the previous one is still there, and the seat must not hold both: 8 seats on 8-GPU hosts
    are one host, for pinned and its packed bound, and every session still runs."""
    t = tmp_path / "seats.jsonl"
    _seated(t, 8)
    doc = json.loads(_run(["simulate", "--json", "--designs", "pinned,pinned_packed,looseleaf", str(t)]).stdout)
    for name in ("pinned", "pinned_packed"):
        assert doc[name]["peak_gpus"] == 8, (name, doc[name]["peak_gpus"])
        assert doc[name]["sessions"] == 16 and doc[name]["gpu_cells"] == 16
    # The second session of a seat connects when the first left: 2 x (5 + 0.68 + 10 + 5) s of pinned GPU time per
    # seat, not more.
    assert doc["pinned"]["held_gpu_hours"] * 3600 == pytest.approx(8 * 2 * (5 + 0.68 + 10 + 5), rel=1e-3)
    bad = tmp_path / "bad.jsonl"
    for seat in (-1, 1000001, 1.5, "x"):
        _write(bad, [{"session": "a", "seat": seat, "arrival_s": 0, "cells": []}])
        r = _run(["simulate", str(bad)])
        assert r.returncode == 1 and "seat" in r.stderr, seat


def test_departure_before_arrival_at_the_same_instant(tmp_path):
    """Without seats: a session leaving at T and one arriving at T never hold 9 GPUs on 8-GPU hosts."""
    t = tmp_path / "same.jsonl"
    lines = [{"session": "a%d" % k, "arrival_s": 0, "tail_s": 10, "cells": []} for k in range(8)]
    lines.append({"session": "b", "arrival_s": 10, "cells": []})
    _write(t, lines)
    doc = json.loads(_run(["simulate", "--json", "--designs", "pinned", str(t)]).stdout)
    assert doc["pinned"]["peak_gpus"] == 8


def test_generated_day_pinned_peak_is_the_session_count(trace, tmp_path):
    """`looseleaf trace --duration`: seats run sessions back to back; pinned's peak is the seat count (issue 26: it
    was 32 for 24 seats), its packed bound never above it."""
    env = dict(os.environ, XDG_CACHE_HOME=str(trace.parent / "cache"))
    nb = os.path.join(REPO, "examples", "looseleaf_torch_training.ipynb")
    day = tmp_path / "day.jsonl"
    r = _run(["trace", "--sessions", "16", "--seed", "3", "--duration", "7200", "--gpu-busy", "0.19", nb], env=env)
    assert r.returncode == 0, r.stderr
    day.write_text(r.stdout)
    seats = {json.loads(l)["seat"] for l in r.stdout.splitlines() if '"session"' in l}
    assert seats == set(range(16))
    doc = json.loads(_run(["simulate", "--json", "--designs", "pinned,pinned_packed", str(day)]).stdout)
    assert doc["pinned"]["peak_gpus"] == 16 and doc["pinned_packed"]["peak_gpus"] == 16
    assert doc["pinned_packed"]["gpu_hours"] <= doc["pinned"]["gpu_hours"]


def _ablation_trace(path):
    """Sessions whose state is large (a 20 GB namespace, a 100 MB closure), importing torch: the first GPU cell's
    edit window too short for a prefetch (its cold start shows), the others long; the fourth comes after a pause
    longer than warm_idle_s (its worker left; a prefetch prepares another while the user edits).  Every mechanism
    LooseLeaf adds has something to do."""
    lines = [{"trace": "looseleaf-fleet", "version": 1, "import_s": {"torch": 1.5}}]
    for k in range(4):
        cells = []
        for i in range(6):
            cells.append({"label": "gpu", "exec_s": 5, "edit_s": 0.5 if i == 0 else 10,
                          "gap_s": 400 if i == 3 else 30, "closure_bytes": 1e8, "written_bytes": 1e8,
                          "namespace_bytes": 2e10, "imports": ["torch"]})
            cells.append({"label": "cpu", "exec_s": 1, "edit_s": 2, "gap_s": 2, "written_bytes": 1e6})
        lines.append({"session": "s%d" % k, "arrival_s": 3 * k, "cells": cells})
    _write(path, lines)


def test_ablations_each_mechanism_moves_its_metric(tmp_path):
    """`simulate --ablations`: each mechanism off costs what it should, on a trace that exercises it."""
    t = tmp_path / "abl.jsonl"
    _ablation_trace(t)
    r = _run(["simulate", "--ablations", str(t)])
    assert r.returncode == 0 and "looseleaf_nowarm" in r.stdout and "<=50ms" in r.stdout
    doc = json.loads(_run(["simulate", "--json", "--ablations", str(t)]).stdout)
    assert list(doc) == ["naive", "looseleaf_noprefetch", "looseleaf_noclosure", "looseleaf_fullsave",
                         "looseleaf_noimportcache", "looseleaf_nowarm", "looseleaf"]
    ll = doc["looseleaf"]
    # Closures off: a cold worker restores 20 GB (2.8 s at h2d_bw), not 100 MB; slots are held longer preparing.
    assert doc["looseleaf_noclosure"]["latency_max_s"] > ll["latency_max_s"] + 2.0
    assert doc["looseleaf_noclosure"]["working_gpu_hours"] > ll["working_gpu_hours"]
    # Incremental save off: 20 GB saved after every cell (GPUs held longer), not 100 MB.
    assert doc["looseleaf_fullsave"]["working_gpu_hours"] > ll["working_gpu_hours"] * 1.2
    # Import cache off: a cold worker imports torch (1.5 s) in a fresh interpreter.
    assert doc["looseleaf_noimportcache"]["latency_max_s"] > ll["latency_max_s"] + 1.0
    # Warm cache off: no warm hits, fewer cells within 50 ms.
    assert doc["looseleaf_nowarm"]["warm_hit_rate"] == 0 and ll["warm_hit_rate"] > 0.8
    assert doc["looseleaf_nowarm"]["share_within_50ms"] < ll["share_within_50ms"]
    # Prefetch off: the first cell of each session (and any after an idle worker left) waits.
    assert doc["looseleaf_noprefetch"]["share_within_50ms"] < ll["share_within_50ms"]
    # Naive serverless: every cell cold, the whole namespace in and out.
    assert doc["naive"]["share_within_1s"] == 0 and doc["naive"]["latency_p95_s"] > ll["latency_p95_s"]
    assert _run(["simulate", "--ablations", "--designs", "pinned", str(t)]).returncode == 2


sys.path.insert(0, os.path.join(REPO, "sim"))
import experiments  # noqa: E402


def test_confidence_interval_known_values():
    """sim/experiments.py: mean and the t-based 95% half-width on inputs worked by hand."""
    m, h = experiments.mean_ci([1, 2, 3, 4, 5])  # s = sqrt(2.5), t(0.975, 4) = 2.7764
    assert m == 3 and h == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)
    m, h = experiments.mean_ci([10, 12])  # s = sqrt(2), t(0.975, 1) = 12.7062
    assert m == 11 and h == pytest.approx(12.7062 * math.sqrt(2) / math.sqrt(2), rel=1e-6)
    assert experiments.mean_ci([7, 7, 7]) == (7, 0)
    assert experiments.mean_ci([4.2]) == (4.2, None)
    with pytest.raises(ValueError):
        experiments.mean_ci([])
    # Beyond the table: within 1e-3 of the exact quantiles (t(0.975, 40) = 2.0211, t(0.975, 120) = 1.9799).
    assert experiments.t975(40) == pytest.approx(2.0211, abs=1e-3)
    assert experiments.t975(120) == pytest.approx(1.9799, abs=1e-3)
    try:
        from scipy import stats
    except ImportError:
        return
    for df in (1, 2, 3, 7, 15, 30, 31, 60, 1000):
        assert experiments.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
    assert experiments.fmt([1, 2, 3, 4, 5]) == "3.0 ± 2.0"


def test_experiments_ablation_table(trace, tmp_path):
    """`sim/experiments.py ablations`: one command, every mechanism's row, figures with their intervals, a CSV."""
    env = dict(os.environ, XDG_CACHE_HOME=str(trace.parent / "cache"))
    nb = os.path.join(REPO, "examples", "looseleaf_torch_training.ipynb")
    r = subprocess.run([sys.executable, os.path.join(REPO, "sim", "experiments.py"), "ablations", "--seeds", "2",
                        "--sessions", "4", "--duration", "1800", "--notebooks", nb, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    for what in ("LooseLeaf", "closures off", "incremental save off", "prefetch off", "import cache off",
                 "warm worker cache off", "naive serverless"):
        assert "| " + what in r.stdout, what
    assert "t-based 95% CI" in r.stdout and " ± " in r.stdout
    rows = list(csv.reader(open(tmp_path / "ablations_4.csv")))
    assert rows[0][:2] == ["design", "GPU-h"] and len(rows) == 8


def test_experiments_state_scale():
    """--state-scale multiplies every state size of a trace, in notebook lines and inline cells, nothing else."""
    text = "\n".join([json.dumps({"trace": "looseleaf-fleet", "version": 1}),
                      json.dumps({"notebook": "nb0", "cells": [{"label": "gpu", "exec_s": 1, "closure_bytes": 10,
                                                               "written_bytes": 2, "namespace_bytes": 30}]}),
                      json.dumps({"session": "s0", "seat": 0, "arrival_s": 0, "notebook": "nb0",
                                  "cells": [{"cell": 0, "gap_s": 3}, {"label": "cpu", "exec_s": 2,
                                                                      "written_bytes": 5}]})]) + "\n"
    lines = [json.loads(l) for l in experiments.scale_state(text, 1000).splitlines()]
    assert lines[0] == {"trace": "looseleaf-fleet", "version": 1}
    assert lines[1]["cells"][0] == {"label": "gpu", "exec_s": 1, "closure_bytes": 10000, "written_bytes": 2000,
                                    "namespace_bytes": 30000}
    assert lines[2]["cells"] == [{"cell": 0, "gap_s": 3}, {"label": "cpu", "exec_s": 2, "written_bytes": 5000}]
    assert experiments.scale_state(text, 1) == text


@pytest.mark.skipif(not os.path.exists("/usr/bin/valgrind"), reason="needs valgrind")
def test_no_session_leaks(tmp_path):
    """Sessions are freed, whichever design held them last: a keep-alive idle timer still pending when the run
    closed held its session forever (every session of a run leaked), and a session waiting for its seat when a
    bad line cuts the run short is freed with the simulator."""
    t = tmp_path / "seats.jsonl"
    _seated(t, 8)
    vg = ["/usr/bin/valgrind", "-q", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=9",
          LOOSELEAF, "simulate", "--threads", "1"]
    r = subprocess.run(vg + [str(t)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(t, "a") as f:
        f.write("not json\n")
    r = subprocess.run(vg + [str(t)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "definitely lost" not in r.stderr, r.stderr[-3000:]


def test_pinned_packed_is_the_floor(tmp_path):
    """16 sessions fill two hosts (best fit: the first 8 on one); four leave each host at 10 s.  Best-fit pinned
    keeps both hosts to 100 s (200 host-seconds); the ideally packed bound needs one from 10 s (110)."""
    t = tmp_path / "packed.jsonl"
    _write(t, [{"session": "s%d" % k, "arrival_s": 0, "tail_s": 10 if k % 8 < 4 else 100, "cells": []}
               for k in range(16)])
    doc = json.loads(_run(["simulate", "--json", "--designs", "pinned,pinned_packed", str(t)]).stdout)
    assert doc["pinned"]["gpu_hours"] == pytest.approx(200 * 8 / 3600, rel=1e-6)
    assert doc["pinned_packed"]["gpu_hours"] == pytest.approx(110 * 8 / 3600, rel=1e-6)
    assert doc["pinned"]["peak_gpus"] == doc["pinned_packed"]["peak_gpus"] == 16


def _sparse_trace(path, sessions=12):
    """SESSIONS sessions, each with a few GPU cells minutes to an hour apart and a 2 GB namespace (a cold start
    reloads it): sparse GPU use, as in the paper's workload, over a few hours."""
    lines = [{"trace": "looseleaf-fleet", "version": 1, "import_s": {"torch": 1.5}}]
    for k in range(sessions):
        cells = []
        for i in range(4):
            cells.append({"label": "gpu", "exec_s": 120 + 30 * ((k + i) % 5), "edit_s": 10,
                          "gap_s": 300 + 600 * ((k * 7 + i) % 6), "namespace_bytes": 2e9, "closure_bytes": 1e8,
                          "written_bytes": 1e7, "imports": ["torch"]})
            cells.append({"label": "cpu", "exec_s": 1, "edit_s": 5, "gap_s": 5, "written_bytes": 1e6})
        lines.append({"session": "s%d" % k, "arrival_s": 200 * k, "tail_s": 60, "cells": cells})
    _write(path, lines)


@pytest.mark.parametrize("shared", [0, 1])
def test_keepalive_and_naive_same_fleet_rules(tmp_path, shared):
    """Issue 26: keep-alive whose container goes the moment its cell ends (keepalive_idle_s=0) holds GPUs
    exactly as naive serverless does when pickling back costs nothing: the same trace must then cost the same
    GPU-hours.  It did not: keep-alive had its own hosts, ready at once and off when empty, while naive (and
    LooseLeaf) paid for boots, headroom, a kept host and a drain delay (48 seats of the paper's workload: 399
    against 732 GPU-hours for identical holding).  Now both run on the elastic fleet (fleet_shared=0) or both on
    shared capacity (fleet_shared=1)."""
    t = tmp_path / "sparse.jsonl"
    _sparse_trace(t)
    sets = ["--set", "keepalive_idle_s=0", "--set", "pickle_dump_bw=1e300", "--set", "fleet_shared=%d" % shared]
    r = _run(["simulate", "--json", "--designs", "keepalive,naive"] + sets + [str(t)])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ka, nv = doc["keepalive"], doc["naive"]
    assert ka["held_gpu_hours"] == pytest.approx(nv["held_gpu_hours"], rel=1e-9)
    assert ka["gpu_hours"] == pytest.approx(nv["gpu_hours"], rel=1e-9), (ka["gpu_hours"], nv["gpu_hours"])
    assert ka["peak_gpus"] == nv["peak_gpus"]
    assert ka["latency_p99_s"] == pytest.approx(nv["latency_p99_s"], rel=1e-9)


def test_fleet_shared_powers_hosts_only_while_they_hold(tmp_path):
    """fleet_shared=1: a host is powered exactly while it holds a container or a cell.  One session at a time
    (arrivals hours apart), so one 8-GPU host at most: powered GPU-hours are 8 x held GPU-hours, for keep-alive
    and naive alike; on the elastic fleet (the default) the kept host and the drain delay cost more."""
    t = tmp_path / "one.jsonl"
    _sparse_trace(t, sessions=1)
    for design in ("keepalive", "naive"):
        doc = json.loads(_run(["simulate", "--json", "--designs", design, "--set", "fleet_shared=1",
                               str(t)]).stdout)[design]
        assert doc["peak_gpus"] == 8
        assert doc["gpu_hours"] == pytest.approx(8 * doc["held_gpu_hours"], rel=1e-6), design
        elastic = json.loads(_run(["simulate", "--json", "--designs", design, str(t)]).stdout)[design]
        assert elastic["gpu_hours"] > doc["gpu_hours"] * 1.05, design
    bad = _run(["simulate", "--set", "fleet_shared=2", str(t)])
    assert bad.returncode != 0 and "fleet_shared" in bad.stderr

"""sim/workload.py, the paper's workload (issue 26, item 1): the sessions it draws follow sim/workload.json.

Over 1,500 sessions drawn with a fixed seed: the session mix within 4 standard errors of the file's shares; every
model in its category's list, its state as the file's formula gives it (parameters x bytes, Adam's moments for
what is trained) and within the paper's bounds (at most 15 GB, at most 14 B parameters), from a small CNN to a
multi-billion-parameter LLM; what each kind of cell reads and writes; the median share of GPU cells near the
paper's 20%; GPU cells' durations and sessions' lengths at the Adobe tables' quantiles.  The CLI: a trace is
the same for the same seed and another for another, `looseleaf simulate` takes it, bad parameters are refused.
The notebooks are analysed, not run (--no-measure): labels and imports come from the analysis either way.
"""
import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOSELEAF = os.path.join(REPO, "build", "looseleaf")
WORKLOAD = os.path.join(REPO, "sim", "workload.py")
sys.path.insert(0, os.path.join(REPO, "sim"))

import workload  # noqa: E402

N = 1500


@pytest.fixture(scope="module")
def params():
    return workload.load_params()


@pytest.fixture(scope="module")
def pools(params):
    cpu, gpu, _ = workload.tree_cells(params, measure=False)
    return cpu, gpu


@pytest.fixture(scope="module")
def sessions(params, pools):
    return workload.sample_sessions(params, N, 3, pools)


def _q(values, q):
    return workload.quantile(values, q)


def _table_q(table, q):
    """The quantile Q of a file's table (linear between its points, as the generator draws)."""
    ps, xs = table["p"], table["x"]
    for i in range(1, len(ps)):
        if q <= ps[i]:
            f = (q - ps[i - 1]) / (ps[i] - ps[i - 1])
            return xs[i - 1] + f * (xs[i] - xs[i - 1])
    return xs[-1]


def test_session_mix_follows_the_shares(params, sessions):
    cats = params["categories"]
    for name, cat in cats.items():
        share = workload.val(cat["share"])
        got = sum(f["category"] == name for f, _, _ in sessions) / N
        se = math.sqrt(share * (1 - share) / N)
        assert abs(got - share) <= 4 * se, (name, got, share)
        models = {e["model"] for e in cat["models"]}
        assert all(f["model"] in models for f, _, _ in sessions if f["category"] == name)


def test_state_sizes_from_the_models(params, sessions):
    cats, models = params["categories"], params["models"]
    adam = workload.val(params["state"]["adam_bytes_per_param"])
    lora = workload.val(params["state"]["lora_fraction"]) * (
        workload.val(params["state"]["lora_weight_bytes"]) + adam)
    sizes = []
    for facts, cells, _ in sessions:
        cat = cats[facts["category"]]
        entry = next(e for e in cat["models"] if e["model"] == facts["model"])
        n = workload.val(models[facts["model"]]["params"])
        weights = n * workload.val(entry["weight_bytes"])
        want = {"full": weights + n * adam, "lora": weights + n * lora, "weights": weights}[cat["state"]]
        assert facts["model_bytes"] == pytest.approx(want, rel=1e-9)
        assert n <= 14e9 and facts["model_bytes"] <= 15e9, facts  # the paper's bounds
        sizes.append(facts["model_bytes"])
        gpu = [c for c in cells if c["label"] == "gpu"]
        for i, c in enumerate(gpu):
            assert c["closure_bytes"] <= c["namespace_bytes"] + want + 1
            if i == 0:  # builds the model: writes all its state
                assert c["written_bytes"] == pytest.approx(want)
            elif c["kind"] == "train":  # every weight and its moments change
                assert c["written_bytes"] == pytest.approx(want)
                assert c["closure_bytes"] >= want
            elif c["kind"] == "peft":  # only the adapter and its moments
                assert c["written_bytes"] == pytest.approx(n * lora)
                assert c["written_bytes"] < 0.2 * want
            else:  # inference reads the weights, not the optimizer
                assert c["kind"] == "infer"
                assert c["closure_bytes"] >= weights and c["closure_bytes"] < weights + facts["data_bytes"] + 1
        for c in cells[cells.index(gpu[0]) + 1:] if gpu else []:
            assert c["namespace_bytes"] >= want  # the model stays in the namespace once built
    # From a small CNN to a multi-billion-parameter LLM, as the paper's sessions.
    assert min(sizes) < 100e6 and max(sizes) > 10e9


def test_gpu_cell_share_and_times(params, sessions):
    share = [sum(c["label"] == "gpu" for c in cells) / len(cells) for _, cells, _ in sessions]
    target = workload.val(params["cells"]["gpu_cell_share_target"])
    assert abs(_q(share, 0.5) - target) <= 0.03, _q(share, 0.5)
    a = params["adobe"]
    gpu_min = [c["exec_s"] / 60 for _, cells, _ in sessions for c in cells if c["label"] == "gpu"]
    for q in (0.25, 0.5, 0.75):
        want = _table_q(a["gpu_task_minutes"], q)
        assert abs(_q(gpu_min, q) / want - 1) <= 0.15, (q, _q(gpu_min, q), want)
    lengths = [(sum(c["gap_s"] + c["edit_s"] + c["exec_s"] for c in cells) + tail) / 60
               for _, cells, tail in sessions]
    want = _table_q(a["session_minutes"], 0.5)
    assert abs(_q(lengths, 0.5) / want - 1) <= 0.2, (_q(lengths, 0.5), want)
    for _, cells, tail in sessions:
        assert tail >= 0 and all(c["gap_s"] >= 0 and c["edit_s"] >= 0 and c["exec_s"] >= 0 for c in cells)
        assert cells[0]["label"] == "cpu"  # a session opens with its setup cell


def _gen(*args):
    return subprocess.run([sys.executable, WORKLOAD, "--no-measure"] + list(args), capture_output=True, text=True,
                          timeout=120)


def test_trace_is_deterministic_and_simulates(tmp_path):
    a = _gen("--sessions", "6", "--seed", "5", "--duration", "86400")
    assert a.returncode == 0, a.stderr
    assert _gen("--sessions", "6", "--seed", "5", "--duration", "86400").stdout == a.stdout
    assert _gen("--sessions", "6", "--seed", "6", "--duration", "86400").stdout != a.stdout
    lines = [json.loads(x) for x in a.stdout.splitlines()]
    assert lines[0]["trace"] == "looseleaf-fleet" and lines[0]["workload"] == "paper"
    arrivals = [x["arrival_s"] for x in lines[1:]]
    assert arrivals == sorted(arrivals) and {x["seat"] for x in lines[1:]} == set(range(6))
    path = tmp_path / "paper.jsonl"
    path.write_text(a.stdout)
    r = subprocess.run([LOOSELEAF, "simulate", "--json", "--gpus-per-host", "1", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    gpu_cells = sum(c["label"] == "gpu" for x in lines[1:] for c in x["cells"])
    assert doc["looseleaf"]["gpu_cells"] == gpu_cells > 0
    assert doc["pinned"]["peak_gpus"] == 6  # six seats, never more sessions at once (one GPU a host)


def test_set_and_bad_parameters():
    one = ["--set", "categories.training.share=1", "--set", "categories.training_inference.share=0",
           "--set", "categories.peft.share=0", "--set", "categories.inference.share=0"]
    r = _gen("--sessions", "20", "--seed", "2", *one)
    assert r.returncode == 0, r.stderr
    assert {json.loads(x)["category"] for x in r.stdout.splitlines()[1:]} == {"training"}
    bad = _gen("--set", "categories.training.share=0.9")
    assert bad.returncode != 0 and "sum to 1" in bad.stderr
    bad = _gen("--set", "categories.nosuch.share=0.1")
    assert bad.returncode != 0 and "no such parameter" in bad.stderr


def test_looseleaf_trace_workload_option():
    """`looseleaf trace --workload paper` is sim/workload.py; `tree` is the notebooks' trace; others refused."""
    args = ["--sessions", "3", "--seed", "9", "--no-measure"]
    r = subprocess.run([LOOSELEAF, "trace", "--workload", "paper"] + args, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == _gen("--sessions", "3", "--seed", "9").stdout
    nb = os.path.join(REPO, "examples", "looseleaf_cpu_basics.ipynb")
    tree = subprocess.run([LOOSELEAF, "trace", "--workload", "tree", "--no-run", nb], capture_output=True,
                          text=True, timeout=120)
    assert tree.returncode == 0 and json.loads(tree.stdout.splitlines()[0])["generator"] == "looseleaf trace"
    bad = subprocess.run([LOOSELEAF, "trace", "--workload", "nosuch", nb], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "tree or paper" in bad.stderr

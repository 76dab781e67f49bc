"""Table-driven corpus of cells with hand-checked expectations (issue 3).

tests/analysis/corpus.txt holds sessions of cells.  Each session becomes a
notebook that `build/looseleaf analyze --json -`
analyses in order, so every cell's closures are computed against the cells
before it in its session.  Format:

    === session name            [env NAME=VALUE ...]
    --- cell
    <cell source, verbatim>
    >>> field: value

Fields (each optional, a missing field is not checked): defs, reads,
mutates, deletes, imports, effective, state, writes (comma-separated sets,
`-` for empty), stmts (import statements, `;`-separated), funcs (`f: a, b; C: c`),
label (cpu/gpu), opaque (yes/no), kernel (yes/no: uses comm machinery, so
runs in the kernel), error (yes/no).
"""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ANALYZE = [str(ROOT / "build" / "looseleaf"), "analyze"]
CORPUS = pathlib.Path(__file__).with_name("corpus.txt")

SET_FIELDS = {
    "defs": ("facts", "defs"),
    "reads": ("facts", "reads"),
    "mutates": ("facts", "mutates"),
    "deletes": ("facts", "deletes"),
    "imports": ("closure", "import_closure"),
    "effective": ("closure", "effective_imports"),
    "state": ("closure", "state_closure"),
    "writes": ("closure", "writes"),
}


def parse_corpus(text):
    sessions = []
    cell = None
    for lineno, line in enumerate(text.splitlines(keepends=True), 1):
        if line.startswith("=== "):
            head = line[4:].strip()
            env = {}
            if "[env " in head:
                head, _, spec = head.partition("[env ")
                for item in spec.rstrip("]").split():
                    key, _, value = item.partition("=")
                    env[key] = value
            sessions.append({"name": head.strip(), "env": env, "cells": []})
            cell = None
        elif line.startswith("--- cell"):
            cell = {"code": "", "expect": {}, "line": lineno}
            sessions[-1]["cells"].append(cell)
        elif line.startswith(">>> "):
            key, _, value = line[4:].partition(":")
            cell["expect"][key.strip()] = value.strip()
        elif cell is not None:
            if cell["expect"] and not line.strip():
                continue  # blank lines between cells
            if cell["expect"]:
                raise ValueError(f"corpus.txt:{lineno}: code after expectations")
            cell["code"] += line
    return sessions


SESSIONS = parse_corpus(CORPUS.read_text())


def notebook(cells):
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {},
             "outputs": [], "source": c["code"]}
            for c in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def analyze(cells, env=None):
    full_env = dict(os.environ)
    full_env.pop("LOOSELEAF_GPU_PACKAGES", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [*ANALYZE, "--json", "-"], input=json.dumps(notebook(cells)),
        capture_output=True, text=True, env=full_env, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def as_set(value, sep=","):
    value = value.strip()
    if value == "-":
        return set()
    return {v.strip() for v in value.split(sep) if v.strip()}


def check_cell(cell, got):
    """Mismatches between one cell's expectations and the CLI's answer."""
    problems = []
    facts = got["facts"]
    closure = got.get("closure", {})
    for key, want in cell["expect"].items():
        if key == "error":
            has = facts.get("error") is not None
            if has != (want == "yes"):
                problems.append(f"error: want {want}, got {facts.get('error')!r}")
        elif facts.get("error") is not None:
            problems.append(f"unexpected error {facts['error']!r}")
            break
        elif key in SET_FIELDS:
            where, name = SET_FIELDS[key]
            have = set((facts if where == "facts" else closure)[name])
            if have != as_set(want):
                problems.append(f"{key}: want {sorted(as_set(want))}, got {sorted(have)}")
        elif key == "stmts":
            have = set(closure["import_statements"])
            if have != as_set(want, ";"):
                problems.append(f"stmts: want {sorted(as_set(want, ';'))}, got {sorted(have)}")
        elif key == "funcs":
            wanted = {}
            for part in want.split(";"):
                fname, _, globs = part.partition(":")
                wanted[fname.strip()] = as_set(globs)
            have = {f["name"]: set(f["globals"]) for f in facts["functions"]}
            if have != wanted:
                problems.append(f"funcs: want {wanted}, got {have}")
        elif key == "label":
            if closure.get("label") != want:
                problems.append(f"label: want {want}, got {closure.get('label')}")
        elif key == "opaque":
            if closure.get("opaque") != (want == "yes"):
                problems.append(f"opaque: want {want}, got {closure.get('opaque')}")
        elif key == "kernel":
            if closure.get("kernel_bound") != (want == "yes"):
                problems.append(f"kernel: want {want}, got {closure.get('kernel_bound')}")
        else:
            problems.append(f"unknown field {key!r}")
    return problems


def test_corpus_is_large_enough():
    cells = [c for s in SESSIONS for c in s["cells"]]
    assert len(cells) >= 150
    assert all(c["expect"] for c in cells), "every cell states expectations"


@pytest.mark.parametrize("session", SESSIONS, ids=[s["name"] for s in SESSIONS])
def test_session(session):
    result = analyze(session["cells"], session["env"])
    assert len(result["cells"]) == len(session["cells"])
    failures = []
    for cell, got in zip(session["cells"], result["cells"]):
        for problem in check_cell(cell, got):
            first = cell["code"].splitlines()[0] if cell["code"] else ""
            failures.append(f"corpus.txt:{cell['line']} ({first!r}): {problem}")
    assert not failures, "\n".join(failures)


def test_cli_text_output_and_summary():
    """The human-readable form carries the same facts and the corpus figures."""
    cells = next(s for s in SESSIONS if s["name"].startswith("paper"))["cells"]
    proc = subprocess.run([*ANALYZE, "-"], input=json.dumps(notebook(cells)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "code cell 5): GPU" in out
    assert "state (7/10):" in out
    assert "summary: 5 code cells, 5 analysed, 0 with errors" in out
    assert "median" in out


def test_cli_syntax_error_reported_and_rest_analysed():
    cells = [{"code": "x = 1\n"}, {"code": "def broken(:\n"}, {"code": "y = x\n"}]
    result = analyze(cells)
    errs = [c["facts"]["error"] for c in result["cells"]]
    assert errs[0] is None and errs[2] is None
    assert errs[1].startswith("SyntaxError") and "line 1" in errs[1]
    assert result["cells"][2]["closure"]["state_closure"] == ["x"]
    assert result["summary"]["errors"] == 1
    proc = subprocess.run([*ANALYZE, "-"], input=json.dumps(notebook(cells)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "error: SyntaxError" in proc.stdout


def test_cli_bad_usage_and_bad_notebooks(tmp_path):
    assert subprocess.run(ANALYZE, capture_output=True).returncode == 2
    missing = subprocess.run([*ANALYZE, str(tmp_path / "nope.ipynb")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "not a JSON notebook" in missing.stderr
    for text in ["{", "[]", '{"cells": 3}', "\x00\x01"]:
        proc = subprocess.run([*ANALYZE, "-"], input=text.encode(),
                              capture_output=True, timeout=60)
        assert proc.returncode == 2, text
    # non-code cells and odd cell entries are skipped, not fatal
    nb = {"cells": [{"cell_type": "markdown", "source": "# hi"}, 7,
                    {"cell_type": "code", "source": ["a = 1\n", "b = a\n"]},
                    {"cell_type": "code"}]}
    proc = subprocess.run([*ANALYZE, "--json", "-"], input=json.dumps(nb),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["code_cells"] == 2
    assert doc["cells"][0]["facts"]["defs"] == ["a", "b"]


def test_python_baseline_agrees_with_c():
    """`make bench` compares the C analysis with tests/analysis/pyoracle.py;
    that comparison is only fair if both compute the same thing.  On every
    corpus session without IPython syntax (the baseline leaves magics out),
    both must give the same reads, state closure, import closure and import
    statements for every cell."""
    import pyoracle as py

    checked, failures = 0, []
    for session in SESSIONS:
        if session["env"] or any(ch in c["code"] for c in session["cells"] for ch in "%!?"):
            continue
        result = analyze(session["cells"])
        baseline = py.Session()
        for cell, got in zip(session["cells"], result["cells"]):
            pc = py.Cell(cell["code"])
            if pc.error or got["facts"]["error"]:
                assert bool(pc.error) == bool(got["facts"]["error"]), cell["code"]
                continue
            want = baseline.closure(pc)
            have = got["closure"]
            pairs = [(sorted(pc.reads - py.BUILTINS), sorted(got["facts"]["reads"])),
                     (want["state"], have["state_closure"]),
                     (want["imports"], have["import_closure"]),
                     (want["stmts"], have["import_statements"]),
                     (want["opaque"], have["opaque"])]
            if any(a != b for a, b in pairs):
                failures.append(f"corpus.txt:{cell['line']}: python {pairs}")
            baseline.record(pc)
            checked += 1
    assert checked >= 100
    assert not failures, "\n".join(failures)


def test_cli_ignores_python_environment_variables():
    """The CLI embeds Debian's Python; PYTHONHOME/PYTHONPATH of another
    interpreter (a pyenv on PATH) must not break it."""
    env = dict(os.environ, PYTHONHOME="/nonexistent", PYTHONPATH="/nonexistent/lib",
               PYTHONSTARTUP="/nonexistent/startup.py")
    cells = [{"code": "%time x = 1\n"}, {"code": "y = x\n"}]
    proc = subprocess.run([*ANALYZE, "--json", "-"], input=json.dumps(notebook(cells)),
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["cells"][0]["facts"]["defs"] == ["x"]  # IPython found and used
    assert doc["cells"][1]["closure"]["state_closure"] == ["x"]

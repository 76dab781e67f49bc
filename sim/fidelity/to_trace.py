#!/usr/bin/python3
"""to_trace: a recorded bench_prefetch run (sim/fidelity/record_prefetch.py) as a trace for `looseleaf simulate`,
and the figures the simulator must predict from it.

  /usr/bin/python3 sim/fidelity/to_trace.py RECORDING.json PASS TRACE.jsonl   (PASS: hints | nohints)

Each recorded session becomes a session line: it connects when its kernel was ready, and every cell keeps its
recorded route (label), edit window, and the time from the previous output to the start of its edit (gap).  A
GPU cell's execution is the worker's exec_ms; a CPU cell's, Run to reply in the kernel.  A GPU cell's closure is
what its worker held (held_bytes: the bench's cells read the model, the optimiser and the data), its writes what
it saved.  With hints, the frontend's draft hint (the whole cell, halfway through the edit window, as
bench_prefetch sends it; the first hint, half a cell, does not parse) is the cell's one hint; without, none.
`figures(recording, pass)` gives the measured figures the test compares with.
"""
import json
import statistics
import sys


def _pass(doc, name):
    want = name == "hints"
    for p in doc["passes"]:
        if p["hints"] == want:
            return p
    raise KeyError(name)


def trace_lines(doc, name):
    p = _pass(doc, name)
    yield {"trace": "looseleaf-fleet", "version": 1, "generator": "sim/fidelity/to_trace.py",
           "recorded": doc.get("recorded"), "pass": name, "import_s": {}}
    sessions = sorted(p["sessions"], key=lambda s: s["t_connected"])
    for s in sessions:
        cells, prev = [], s["t_connected"]
        for c in s["cells"]:
            ll = c.get("looseleaf", {})
            gpu = c["route"] == "gpu"
            cell = {"label": "gpu" if gpu else "cpu",
                    "exec_s": ll["exec_ms"] / 1000.0 if gpu else c["t_reply"] - c["t_run"],
                    "edit_s": c["edit_s"], "gap_s": max(0.0, c["t_edit"] - prev),
                    "hints_s": [0.0, c["edit_s"] / 2] if name == "hints" else []}
            if gpu:
                cell.update(closure_bytes=ll.get("held_bytes", 0), written_bytes=ll.get("bytes_saved", 0),
                            namespace_bytes=ll.get("held_bytes", 0))
            cells.append(cell)
            prev = c["t_reply"]
        yield {"session": "s%d" % s["session"], "arrival_s": s["t_connected"],
               "tail_s": max(0.0, s["t_closed"] - prev), "cells": cells}


def _pct(sorted_vals, q):
    """bench_prefetch's percentile: the value at rank round(q * n + 0.5)."""
    n = len(sorted_vals)
    return sorted_vals[min(n - 1, int(round(q * n + 0.5)) - 1)]


def figures(doc, name):
    """The measured figures: GPU cells' visible wait (s), warm-hit rate, GPU held over connected time."""
    p = _pass(doc, name)
    cells = [c["looseleaf"] for s in p["sessions"] for c in s["cells"] if c["route"] == "gpu"]
    waits = sorted(c["visible_wait_ms"] / 1000.0 for c in cells)
    bills = p.get("pool_bills")
    if bills:  # the first bill is the warm-up kernel's, which ended before the timed sessions
        held, conn = sum(b[0] for b in bills[1:]), sum(b[1] for b in bills[1:])
    else:
        held, conn = p["gpu_held_s"], p["connected_s"]
    return {"gpu_cells": len(cells), "latency_p50_s": statistics.median(waits),
            "latency_p95_s": _pct(waits, 0.95), "warm_hit_rate": sum(1 for c in cells if c.get("warm_hit")) / len(cells),
            "session_held_share": held / conn}


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    with open(sys.argv[3], "w") as out:
        for line in trace_lines(doc, sys.argv[2]):
            out.write(json.dumps(line) + "\n")
    print(json.dumps(figures(doc, sys.argv[2])))


if __name__ == "__main__":
    main()

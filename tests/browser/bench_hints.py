"""Edit-time hints from JupyterLab itself, measured in the browser (issue 14): a simulated user types each GPU
cell of a real notebook (../shared/notebooks/mrdbourke_01_pytorch_workflow.ipynb, 38 GPU cells of 40) key by
key at human speed in JupyterLab and runs it with Shift+Enter (the notebook's CPU cells are pasted), once with
LooseLeaf's JupyterLab extension (hints on: the page sends the cell being edited on a looseleaf.prefetch comm,
gateway/ll_labext.js) and once installed with --no-hints.  For every cell run on a worker, the share whose
execution started within 50 ms and within 1 s of Run, from `execute_reply.metadata.looseleaf.visible_wait_ms`,
read from the page's websocket traffic (page.on("websocket")); also how many hint messages (comm_msg) and
complete/inspect requests the page sent.

Runs in its own process (not in BENCHES: the first 16 code cells take ~16 minutes on a loaded 2-core machine,
the whole notebook about an hour):
    .venv/bin/python tests/browser/bench_hints.py [--delay-ms 40] [--notebook PATH] [--cells N]
It starts its own Jupyter servers, pool and chromium (browserutil.py) and stops them.
"""
import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/: conftest's private Jupyter environment and pool

import conftest  # noqa: E402  (sets JUPYTER_*/IPYTHONDIR/LOOSELEAF_POOL_DIR to private temp dirs)
from browserutil import REPO, LOOSELEAF_BIN, Server, launch_chromium  # noqa: E402
from pageutil import LabNotebook, Traffic, expect  # noqa: E402

from playwright.sync_api import sync_playwright  # noqa: E402
import subprocess  # noqa: E402

# ../shared beside the main checkout; a worktree (/work/wt/NAME) finds it two levels up.
NOTEBOOK = next((p for p in (os.path.join(d, "shared", "notebooks", "mrdbourke_01_pytorch_workflow.ipynb")
                             for d in (os.path.dirname(REPO), os.path.dirname(os.path.dirname(REPO))))
                 if os.path.exists(p)),
                os.path.join(os.path.dirname(REPO), "shared", "notebooks", "mrdbourke_01_pytorch_workflow.ipynb"))
LAB_USER_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                     '{"fetchNews": "false", "checkForUpdates": false}'}


def code_cells(path, limit=None):
    nb = json.load(open(path))
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    labels = analyze_labels(path)
    pairs = list(zip(cells, labels))
    return pairs[:limit] if limit else pairs


def analyze_labels(path):
    out = subprocess.run([LOOSELEAF_BIN, "analyze", "--json", path], check=True, capture_output=True, text=True)
    return [c["closure"]["label"] for c in json.loads(out.stdout)["cells"]]


def session(hints, cells, delay_ms, shots):
    root = tempfile.mkdtemp(prefix="ll-bench-hints-")
    for rel, text in LAB_USER_SETTINGS.items():
        p = Path(root) / "lab-user-settings" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    srv = Server(root, kind="lab", hints=hints)
    srv.write_notebook("bench.ipynb", cells=[""])
    rows = []
    typing_s = [0.0, 0]  # seconds spent typing GPU cells, characters typed
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            traffic = Traffic(page)
            page.goto(srv.page_url("/lab/tree/bench.ipynb"))
            expect(page.locator(".jp-StatusBar-Widget", has_text="LooseLeaf (GPU) | Idle").first).to_be_visible(
                timeout=120_000)
            nb = LabNotebook(page, Path(shots))
            for i, (code, label) in enumerate(cells):
                cell = nb.cell(nb.n)
                cell.locator(".cm-content").click()
                if label == "gpu":
                    t_type = time.monotonic()
                    nb.type_cell(code, delay_ms=delay_ms)
                    typing_s[0] += time.monotonic() - t_type
                    typing_s[1] += len(code)
                else:
                    page.keyboard.insert_text(code)  # pasted
                # An open completer would take the Shift+Enter: close it as a person would.
                if nb.completer_open():
                    page.keyboard.press("Escape")
                page.keyboard.press("Shift+Enter")
                nb.n += 1
                nb.wait_done(cell, timeout=300_000)
                deadline = time.monotonic() + 30
                while len(traffic.replies) < nb.n and time.monotonic() < deadline:
                    page.wait_for_timeout(20)  # the reply's frame event is delivered during this call
                reply = traffic.replies[nb.n - 1]
                md = reply.get("metadata", {}).get("looseleaf", {})
                rows.append({"cell": i + 1, "label": label, "route": md.get("route"),
                             "status": reply["content"].get("status"),
                             "visible_wait_ms": md.get("visible_wait_ms"), "warm_hit": md.get("warm_hit"),
                             "prepared_by_prefetch": md.get("prepared_by_prefetch")})
                print("  hints %s cell %2d %s/%s wait %s ms%s" % (
                    "on " if hints else "off", i + 1, label, md.get("route"), md.get("visible_wait_ms"),
                    " prefetched" if md.get("prepared_by_prefetch") else ""), flush=True)
            nb.shot("bench-hints-%s" % ("on" if hints else "off"))
            sent = dict(traffic.sent)
            sent["typing"] = "%d characters in %.0f s (%.1f keys/s)" % (
                typing_s[1], typing_s[0], typing_s[1] / typing_s[0] if typing_s[0] else 0)
            browser.close()
    finally:
        srv.stop()
    return rows, sent


def summarize(rows):
    waits = [r["visible_wait_ms"] for r in rows if r["route"] == "gpu" and r["visible_wait_ms"] is not None]
    if not waits:
        return None
    return {"gpu_cells": len(waits),
            "within_50ms": sum(w <= 50 for w in waits) / len(waits),
            "within_1s": sum(w <= 1000 for w in waits) / len(waits),
            "median_ms": statistics.median(waits),
            "p95_ms": sorted(waits)[min(len(waits) - 1, int(0.95 * len(waits)))],
            "max_ms": max(waits),
            "prefetched": sum(bool(r["prepared_by_prefetch"]) for r in rows if r["route"] == "gpu")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebook", default=NOTEBOOK)
    ap.add_argument("--delay-ms", type=int, default=40, help="between keys (40: 25 keys/s, a fast typist)")
    ap.add_argument("--cells", type=int, default=None, help="only the first N code cells")
    ap.add_argument("--only", choices=("on", "off"), default=None)
    args = ap.parse_args()
    # Stopped with SIGTERM, still stop the servers, kernels and pool it started (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cells = code_cells(args.notebook, args.cells)
    shots = tempfile.mkdtemp(prefix="ll-bench-hints-shots-")
    print("notebook %s: %d code cells, %d GPU by analysis, %d characters typed; key delay %d ms" % (
        os.path.basename(args.notebook), len(cells), sum(l == "gpu" for _, l in cells),
        sum(len(c) for c, l in cells if l == "gpu"), args.delay_ms), flush=True)
    results = {}
    try:
        for hints in (True, False):
            if args.only and args.only != ("on" if hints else "off"):
                continue
            t0 = time.monotonic()
            rows, sent = session(hints, cells, args.delay_ms, shots)
            s = summarize(rows)
            results["on" if hints else "off"] = s
            failed = [r["cell"] for r in rows if r["status"] != "ok"]
            print("hints %s: %s; sent: comm_msg %d, complete %d, inspect %d; typed %s; cells failed: %s; %.0f s" % (
                "on" if hints else "off", json.dumps(s), sent.get("comm_msg", 0), sent.get("complete_request", 0),
                sent.get("inspect_request", 0), sent["typing"], failed or "none", time.monotonic() - t0),
                flush=True)
    finally:
        conftest.pytest_sessionfinish(None, 0)
    print("screenshots: %s" % shots)
    for k, s in results.items():
        if s:
            print("RESULT hints %s: %d GPU cells, %.0f%% within 50 ms, %.0f%% within 1 s (median %.1f ms, p95 %.1f ms,"
                  " max %.1f ms, %d prepared by prefetch)" % (k, s["gpu_cells"], 100 * s["within_50ms"],
                                                             100 * s["within_1s"], s["median_ms"], s["p95_ms"],
                                                             s["max_ms"], s["prefetched"]))


if __name__ == "__main__":
    main()

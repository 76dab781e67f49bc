"""How smoothly a cell's flushed output appears in JupyterLab (issue 29, item 4), measured in the page.

The cell prints a line every 20 ms with flush=True, 50 times, once as a CPU cell and once as a GPU cell (the
same loop after `import torch`), on LooseLeaf as `make run` installs it (hints on) and on ipykernel.  In the
page, a MutationObserver on the cell's output area notes (performance.now()) every change of its text, and
the browser's websocket frame events (as this process receives them) tell when each stream message reached
the page.  Reported per kernel and route:
updates of the output's text, and the gaps between them (median, p90, max).  The README promises a flushed
line within 50 ms; tests/bench/bench_stream_pace.py measures the same at a jupyter_client client.

Runs in its own process (not in BENCHES: it starts JupyterLab and chromium; ~2 minutes):
    .venv/bin/python tests/browser/bench_stream_pace.py [--rounds 2]
It starts its own Jupyter server, pool and chromium (browserutil.py) and stops them.
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
from browserutil import Server, launch_chromium  # noqa: E402
from pageutil import LabNotebook, decode_frame, expect  # noqa: E402

from playwright.sync_api import sync_playwright  # noqa: E402

LOOP = "import time\nfor i in range(50):\n    print(i, flush=True)\n    time.sleep(0.02)\n"
WARM = "import torch\n_ = torch.zeros(1)\n"
GPU_LOOP = "import torch\n" + LOOP

LAB_USER_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                     '{"fetchNews": "false", "checkForUpdates": false}'}


# Records every change of the output area's text in the page: [performance.now() ms, lines shown].  The
# websocket's frames are noted from the browser's own frame events (StreamFrames), delivered to this process.
OBSERVE = """cell => {
    const rec = [];
    let last = null;
    const look = () => {
        const t = cell.querySelector('.jp-OutputArea') ? cell.querySelector('.jp-OutputArea').innerText : '';
        if (t !== last) { last = t; rec.push([performance.now(), (t.match(/\\n/g) || []).length]); }
    };
    new MutationObserver(look).observe(cell, {subtree: true, childList: true, characterData: true});
    window.__llPace = rec;
}"""


class StreamFrames:
    """Arrival (monotonic s, in this process) of each stdout stream frame the page's websocket received."""

    def __init__(self, page):
        self.times = []
        page.on("websocket", self._socket)

    def _socket(self, ws):
        if "/api/kernels/" in ws.url:
            ws.on("framereceived", self._received)

    def _received(self, payload):
        try:
            _, msg = decode_frame(payload)
        except (ValueError, KeyError, UnicodeDecodeError):
            return
        if msg.get("header", {}).get("msg_type") == "stream":
            self.times.append(time.monotonic())


def session(kernel, display, rounds, shots, typed=False):
    root = tempfile.mkdtemp(prefix="ll-bench-pace-")
    for rel, text in LAB_USER_SETTINGS.items():
        p = Path(root) / "lab-user-settings" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    srv = Server(root, kind="lab", hints=True)
    cells = [WARM] + [c for _ in range(rounds) for c in (LOOP, GPU_LOOP)]
    # TYPED: the loop cells are typed key by key (hints on: the kernel prepares while the user types).
    srv.write_notebook("pace.ipynb", kernel=kernel, cells=[c if not typed or i == 0 else ""
                                                            for i, c in enumerate(cells)])
    out = {"cpu": {"dom": [], "ws": []}, "gpu": {"dom": [], "ws": []}}
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            frames = StreamFrames(page)
            page.goto(srv.page_url("/lab/tree/pace.ipynb"))
            expect(page.locator(".jp-StatusBar-Widget", has_text="%s | Idle" % display).first).to_be_visible(
                timeout=120_000)
            nb = LabNotebook(page, Path(shots), kernel_display=display)
            for i, code in enumerate(cells):
                cell = nb.cell(i)
                cell.locator(".jp-InputArea-editor").click()
                if typed and i > 0:
                    nb.n = i
                    nb.type_cell(code, delay_ms=40)
                    if page.locator(".jp-Completer").is_visible():
                        page.keyboard.press("Escape")
                cell.evaluate(OBSERVE)
                n0 = len(frames.times)
                page.keyboard.press("Shift+Enter")
                nb.wait_done(cell, timeout=300_000)
                if i == 0:
                    continue  # the warm-up
                expect(nb.output(cell).first).to_contain_text("49")
                page.wait_for_timeout(300)  # the last frame's event reaches this process
                dom = page.evaluate("window.__llPace")
                route = "gpu" if code == GPU_LOOP else "cpu"
                # DOM: from the first line shown to the last (JupyterLab renders at most once a frame).
                shown = [t / 1e3 for t, lines in dom if lines > 0]
                out[route]["dom"].append(shown)
                out[route]["ws"].append(frames.times[n0:])
            nb.shot("pace-%s" % kernel)
            browser.close()
    finally:
        srv.stop()
    return out


def summarize(runs):
    allg = sorted(b - a for r in runs for a, b in zip(r, r[1:]))
    p90 = allg[min(len(allg) - 1, int(round(0.9 * (len(allg) - 1))))] if allg else float("nan")
    return {"updates": statistics.median(len(r) for r in runs),
            "gap_median_ms": statistics.median(allg) * 1e3 if allg else float("nan"),
            "gap_p90_ms": p90 * 1e3, "gap_max_ms": allg[-1] * 1e3 if allg else float("nan")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=("looseleaf", "python3"), default=None)
    ap.add_argument("--typed", action="store_true", help="type the loop cells key by key (40 ms a key)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shots = tempfile.mkdtemp(prefix="ll-bench-pace-shots-")
    results = {}
    try:
        for kernel, display in (("looseleaf", "LooseLeaf (GPU)"), ("python3", "Python 3 (ipykernel)")):
            if args.only and args.only != kernel:
                continue
            got = session(kernel, display, args.rounds, shots, typed=args.typed)
            for route in ("cpu", "gpu"):
                for what in ("dom", "ws"):
                    results["%s %s %s" % (kernel, route, what)] = summarize(got[route][what])
    finally:
        conftest.pytest_sessionfinish(None, 0)
    print("a cell printing a flushed line every 20 ms, 50 lines, in JupyterLab (%d rounds each); dom: changes of "
          "the output's text, ws: stream messages received by the page" % args.rounds)
    for k, s in results.items():
        print("  %-22s %4.1f updates, gap median %6.1f ms, p90 %6.1f ms, max %6.1f ms" % (
            k, s["updates"], s["gap_median_ms"], s["gap_p90_ms"], s["gap_max_ms"]))
    print("RESULT " + json.dumps(results))
    print("screenshots: %s" % shots)
    return 0


if __name__ == "__main__":
    sys.exit(main())

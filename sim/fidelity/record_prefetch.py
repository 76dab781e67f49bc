#!/usr/bin/python3
"""record_prefetch: one run of bench_prefetch's editing sessions, recorded cell by cell, for the simulator's
fidelity check (tests/sim/test_sim.py replays the recording; `looseleaf simulate` must predict its figures).

Runs the same sessions as tests/bench/bench_prefetch.py (its SESSION script, edit windows from its seeds, 3
kernels sharing one host pool of 2 slots, the same hints), both passes (with hints, without), and writes one
JSON document: for every cell of every session its route, edit window, Run and reply times (s since the pass
started), and the kernel's execute_reply.metadata.looseleaf for GPU cells; per pass the GPU-seconds held and
connected from the pool's per-session lines.  bench_prefetch itself only prints aggregates.

Usage (after `make all`; about 3 minutes on 2 cores): /usr/bin/python3 sim/fidelity/record_prefetch.py OUT.json
"""
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time

from jupyter_client import KernelManager

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "tests", "bench"), os.path.join(REPO, "tests")]

import bench_prefetch as bp  # noqa: E402

KEEP = ("visible_wait_ms", "warm_hit", "prepared_by_prefetch", "staged", "exec_ms", "save_ms", "restore_ms",
        "fork_ms", "import_ms", "wait_ms", "bytes_restored", "bytes_saved", "held_bytes", "kernel_save_ms",
        "stays_warm")


def _session(k, env, hints, t0, out, errors):
    """bench_prefetch._session, recording every cell."""
    cells = []
    try:
        km = KernelManager(kernel_name="looseleaf")
        km.start_kernel(env=env)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        t_conn = time.perf_counter() - t0
        try:
            for i, (code, window) in enumerate(zip(bp.SESSION, bp._windows(1000 + k))):
                code = code.replace("SEED", str(k))
                t_edit = time.perf_counter() - t0
                if hints:
                    for part in (code[: len(code) // 2], code):
                        kc.inspect(part, len(part))
                        time.sleep(window / 2)
                else:
                    time.sleep(window)
                t_run = time.perf_counter() - t0
                r = kc.execute_interactive(code, timeout=300, output_hook=lambda m: None)
                t_reply = time.perf_counter() - t0
                assert r["content"]["status"] == "ok", r["content"]
                ll = r["metadata"].get("looseleaf", {})
                cells.append({"cell": i, "route": ll.get("route", "cpu"), "edit_s": window, "t_edit": t_edit,
                              "t_run": t_run, "t_reply": t_reply,
                              "looseleaf": {key: ll[key] for key in KEEP if key in ll}})
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=False)
        out.append({"session": k, "t_connected": t_conn, "t_closed": time.perf_counter() - t0, "cells": cells})
    except BaseException as e:  # noqa: BLE001 - reported by the caller
        errors.append("session %d: %s: %s" % (k, type(e).__name__, e))


def run_pass(tmp, hints):
    pool_dir = os.path.join(tmp, "pool-%s" % ("hints" if hints else "nohints"))
    env = dict(os.environ, JUPYTER_PATH=os.path.join(tmp, "share"), IPYTHONDIR=os.path.join(tmp, "ipy"),
               LOOSELEAF_POOL_DIR=pool_dir, LL_POOL_SLOTS=str(bp.SLOTS))
    env.pop("PYTEST_CURRENT_TEST", None)
    bp._session_warmup(env, [])
    out, errors = [], []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_session, args=(k, env, hints, t0, out, errors))
               for k in range(bp.SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held, connected, nlines = bp._held(pool_dir)
    bills = _bills(pool_dir)
    bp._stop_pool(pool_dir)
    if errors:
        raise SystemExit("record_prefetch: " + "; ".join(errors))
    return {"hints": hints, "sessions": sorted(out, key=lambda s: s["session"]), "gpu_held_s": held,
            "connected_s": connected, "pool_session_lines": nlines, "pool_bills": bills}


def _bills(pool_dir):
    """The pool's per-session bill lines, in order: [held s, connected s] (the first is the warm-up kernel's)."""
    pat = re.compile(r"session (\S+): GPU held ([0-9.]+) s of ([0-9.]+) s connected")
    with open(os.path.join(pool_dir, "pool.log"), errors="replace") as f:
        return [[float(m.group(2)), float(m.group(3))] for m in map(pat.search, f) if m]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory(prefix="ll-record-pf-") as tmp:
        bp._kernelspec(tmp)
        os.environ["JUPYTER_PATH"] = os.path.join(tmp, "share")
        doc = {"what": "bench_prefetch sessions recorded cell by cell (sim/fidelity/record_prefetch.py)",
               "recorded": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
               "cpus": os.cpu_count(), "sessions": bp.SESSIONS, "slots": bp.SLOTS, "edit_median_s": bp.EDIT_S,
               "rounds": bp.ROUNDS, "script": bp.SESSION,
               "passes": [run_pass(tmp, hints=True), run_pass(tmp, hints=False)]}
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

"""%looseleaf: where the session's variables live (values only a worker holds, and values lost with one,
included), its warm GPU workers, and the GPU time it held.

Runs in the kernel's interpreter (the cell analysis knows the magic touches no variable, so a cell holding
only it is a CPU cell).  The pool's state comes from the gateway (`_looseleaf_kernel.pool_stats()`, which
asks the host pool over the kernel's own connection); the variables' state from coherence.py.

`%looseleaf` prints a report; `%looseleaf --json` returns the same as a dict.
"""
import json

import _looseleaf_kernel as _lk


def _fmt_bytes(n):
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%.0f %s" % (n, unit) if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1024
    return "%.1f GiB" % n


def report(kernel):
    """The state %looseleaf shows, as a dict."""
    coh = kernel.coherence
    out = {"session": coh.session, "store_dir": coh.dir, "variables": {}, "workers": [], "gpu": None}
    try:
        stats = json.loads(_lk.pool_stats() or "null")
    except ValueError:
        stats = None
    if isinstance(stats, dict):
        for se in stats.get("sessions") or []:
            if se.get("session") == coh.session:
                out["gpu"] = {k: se.get(k) for k in ("gpu_held_s", "connected_s", "held_share")}
        out["workers"] = [w for w in stats.get("workers") or [] if w.get("session") == coh.session]
        out["slots"] = stats.get("slots")
    ns = kernel.shell.user_ns
    visible = coh._visible()
    committed = {}
    held = {}
    if coh.cp is not None:
        try:
            committed = coh.cp.versions()
            held = coh.cp.held()
        except Exception as e:  # noqa: BLE001 - shown, not raised
            out["store_error"] = "%s: %s" % (type(e).__name__, e)
    from looseleaf_store import procstate
    for name in sorted(set(visible) | set(committed) | set(coh.home) | set(coh.lost)):
        if name == procstate.NAME or name.startswith("__") or (name.startswith("_") and name[1:].isdigit()):
            continue
        v = committed.get(name)
        h = coh.home.get(name)
        if name in coh.lost:
            where = "lost: %s" % coh.lost[name]
        elif h is not None and h.get("kind") == "held":
            where = "worker %s (%s), only there: cells reading it run there" % (h.get("pid"), h.get("what"))
        elif h is not None:
            where = "worker %s (%s; the store has its value): cells reading it run there" % (
                h.get("pid"), "its autograd graph" if h.get("kind") == "graph" else h.get("what"))
        elif name in coh.dirty or (name in ns and v is None):
            where = "kernel (newer than the store)" if v is not None else "kernel only (not in the store yet)"
        elif name not in ns:
            where = "store only (made by a GPU cell)"
        elif held.get(name) == v:
            where = "store and kernel (same version)"
        else:
            where = "store (the kernel's copy is older: refreshed when a CPU cell reads it)"
        out["variables"][name] = {"where": where, "version": v}
    return out


def looseleaf_magic(kernel, line):
    rep = report(kernel)
    if line.strip() == "--json":
        return rep
    lines = ["LooseLeaf session %s" % (rep["session"] or "(no GPU cell yet: everything lives in the kernel)")]
    gpu = rep["gpu"]
    if gpu and gpu.get("connected_s"):
        lines.append("GPU held %.1f s of %.1f s connected (%.1f%%); a pinned session would have held %.1f s"
                     % (gpu["gpu_held_s"], gpu["connected_s"], 100.0 * (gpu.get("held_share") or 0),
                        gpu["connected_s"]))
    if rep["workers"]:
        lines.append("Warm workers:")
        for w in rep["workers"]:
            lines.append("  pid %s  %s  holds %s  cells %s  idle %.1f s" % (
                w.get("pid"), w.get("state"), _fmt_bytes(w.get("bytes")), w.get("cells"),
                float(w.get("idle_s") or 0)))
    elif rep["session"]:
        lines.append("No warm worker holds a GPU slot for this session now.")
    if rep.get("store_error"):
        lines.append("Store: %s" % rep["store_error"])
    if rep["variables"]:
        width = max(len(n) for n in rep["variables"])
        lines.append("Variables:")
        for name, v in rep["variables"].items():
            ver = " v%d" % v["version"] if v["version"] is not None else ""
            lines.append("  %-*s  %s%s" % (width, name, v["where"], ver))
    print("\n".join(lines))
    return None


def install(kernel):
    kernel.shell.register_magic_function(lambda line="": looseleaf_magic(kernel, line), "line", "looseleaf")

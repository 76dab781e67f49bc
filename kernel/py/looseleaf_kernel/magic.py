"""%looseleaf: where the session's variables live (values only a worker holds, and values lost with one,
included), its warm GPU workers, and the GPU time it held.

Runs in the kernel's interpreter (the cell analysis knows the magic touches no variable, so a cell holding
only it is a CPU cell).  The pool's state comes from the gateway (`_looseleaf_kernel.pool_stats()`, which
asks the host pool over the kernel's own connection); the variables' state from coherence.py.

`%looseleaf` prints a report; `%looseleaf --json` returns the same as a dict.  Time travel:
`%looseleaf history NAME` lists NAME's kept versions, one line each starting NAME@N (the cell, the time, the
size); `%looseleaf checkout NAME@N [as OTHER]` binds that version in the kernel (looseleaf_store.history).
"""
import json

from IPython.core.error import UsageError

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
    from .coherence import at_risk
    out["at_risk"] = at_risk(coh, committed)
    return out


_USAGE = ("usage: %looseleaf [--json] | %looseleaf history NAME | %looseleaf checkout NAME@N [as OTHER] | "
          "%looseleaf restore")


def _cell_label(cell):
    """The cell a commit came from, as a user reads it: "In[7]" (a commit's id starts with it), else the id."""
    first = (cell or "").split(" ", 1)[0]
    return first if first.startswith("In[") else (cell or "?")


def history_lines(kernel, name):
    """The lines `%looseleaf history NAME` prints: one per kept version, oldest first, each starting NAME@N."""
    import time
    from looseleaf_store import history
    coh = kernel.coherence
    if not name.isidentifier():
        raise ValueError("%r is not a variable name; " % name + _USAGE)
    if coh.cp is None:
        return ["%s has no committed versions: the session's store opens with its first GPU cell "
                "(what CPU cells change is committed from then on)" % name]
    kept, dropped = history.versions(coh.store, name)
    if not kept and not dropped:
        return ["%s has no committed versions%s" % (
            name, " (it lives only in the kernel so far)" if name in kernel.shell.user_ns else "")]
    out = []
    for v in kept:
        note = ""
        if v.current:
            note = "  (current%s)" % ("; the kernel's copy is newer, not committed yet" if name in coh.dirty else "")
        out.append("%s@%d  %-8s %s  %s%s" % (name, v.version, _cell_label(v.cell),
                                            time.strftime("%H:%M:%S", time.localtime(v.time)),
                                            _fmt_bytes(v.nbytes), note))
    # Dropped versions, by why (the budget; a save into a full pool or at the user's cap): one line each.
    for why in ("budget", "pool", "cap"):
        ds = [d for d in dropped if d[3] == why]
        if not ds:
            continue
        if why == "budget":
            because = "to keep the history within its budget of %s" % _fmt_bytes(history.budget_bytes(coh.store))
        elif why == "pool":
            because = "to make room for a save in the session's full pool"
        else:
            because = "to make room for a save at your store cap"
        out.append("(%d older version%s dropped %s: %s)" % (
            len(ds), "" if len(ds) == 1 else "s", because,
            ", ".join("%s@%d" % (name, d[0]) for d in ds[-5:]) + (", ..." if len(ds) > 5 else "")))
    return out


def checkout(kernel, spec, target=None):
    """Bind the value NAME had at version N (SPEC "NAME@N") as TARGET (default NAME) in the kernel; it is
    committed as the newest version like any value a CPU cell binds.  Returns the line to print."""
    from looseleaf_store import history
    coh = kernel.coherence
    name, at, num = spec.partition("@")
    if not at or not name.isidentifier() or not num.isdigit():
        raise ValueError("%r is not NAME@N (a version number from %%looseleaf history NAME); %s" % (spec, _USAGE))
    target = target or name
    import keyword
    if not target.isidentifier() or keyword.iskeyword(target):
        raise ValueError("%r is not a variable name to bind" % target)
    if coh.cp is None:
        raise history.HistoryError("%s has no committed versions: the session's store opens with its first "
                                   "GPU cell" % name)
    ns = kernel.shell.user_ns
    if target in coh.dirty and target in ns:
        # The kernel's value of TARGET is newer than anything committed: commit it first, so that the
        # checkout never loses it (it becomes a version of its own, in the history).
        rep = coh._push([target], modules=False)
        if rep.error or target in rep.failed:
            raise history.HistoryError(
                "the kernel's current %s could not be committed first (%s), and a checkout would lose it: "
                "check out under another name, e.g. %%looseleaf checkout %s as %s_%s"
                % (target, rep.error or rep.failed.get(target), spec, name, num))
        coh.dirty.difference_update(rep.saved)
        coh.dirty.difference_update(rep.unchanged)
    value, rep = history.load(coh.cp, name, int(num))
    ns[target] = value
    coh._rebound_here([target])
    coh._mark_dirty([target])
    line = "%s@%s checked out as %s (it is committed as the newest version of %s when the kernel is idle " \
        "or a GPU cell reads it)" % (name, num, target, target)
    for w in rep.warnings:
        line += "\n  " + w
    return line


def looseleaf_magic(kernel, line):
    words = line.split()
    if words == ["restore"]:
        from . import keep
        res = keep.restore(kernel.coherence)
        if "error" in res:
            raise UsageError(keep.summary(res))
        print(keep.summary(res))
        return None
    if words and words[0] in ("history", "checkout"):
        from looseleaf_store.history import HistoryError
        try:
            if words[0] == "history" and len(words) == 2:
                print("\n".join(history_lines(kernel, words[1])))
            elif words[0] == "checkout" and len(words) in (2, 4) and (len(words) == 2 or words[2] == "as"):
                print(checkout(kernel, words[1], words[3] if len(words) == 4 else None))
            else:
                raise ValueError(_USAGE)
        except (HistoryError, ValueError) as e:
            # One clear line and the cell fails (a "Run all" stops), no traceback: the kernel and its
            # variables are as they were.
            raise UsageError("LooseLeaf: %s" % e) from None
        return None
    if words and words != ["--json"]:
        raise UsageError("LooseLeaf: " + _USAGE)
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
    whys = set(rep["at_risk"].values())
    if len(whys) == 1 and len(rep["at_risk"]) > 1 and not rep["at_risk"].keys() - rep["variables"].keys():
        lines.append("Would not survive a crash of the kernel right now: any variable (%s)" % whys.pop())
    elif rep["at_risk"]:
        lines.append("Would not survive a crash of the kernel right now:")
        for name, why in rep["at_risk"].items():
            lines.append("  - %s: %s" % (name, why))
    elif rep["variables"]:
        lines.append("Every variable would survive a crash of the kernel (its last committed version).")
    print("\n".join(lines))
    return None


def install(kernel):
    kernel.shell.register_magic_function(lambda line="": looseleaf_magic(kernel, line), "line", "looseleaf")

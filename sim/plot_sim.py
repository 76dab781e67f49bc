#!/usr/bin/python3
"""plot_sim: the PNG plots of `looseleaf simulate --out DIR` (the simulator itself is C; this only draws).

  /usr/bin/python3 sim/plot_sim.py DIR                 plots of one run, into DIR
  /usr/bin/python3 sim/plot_sim.py --frontier OUT.png DIR...   GPU-hours against the share of GPU cells missing
                                                       1 s, one point per design and run (the paper's Fig. 1)

One run's plots: provisioned_gpus.png (GPUs powered over time per design, and the GPUs running cells),
frontier.png (its designs on the GPU-hours / missing-1-s plane), latency_cdf.png (start latencies).
Reads summary.csv, timeline.csv and cdf.csv, as `looseleaf simulate --out` writes them.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["pinned", "pinned_packed", "keepalive", "notebookos", "naive", "looseleaf_noprefetch",
         "looseleaf_noclosure", "looseleaf_fullsave", "looseleaf_noimportcache", "looseleaf_nowarm", "looseleaf"]
LABEL = {"pinned": "session-pinned", "pinned_packed": "pinned, ideally packed", "keepalive": "keep-alive 10 min",
         "notebookos": "NotebookOS", "naive": "naive serverless", "looseleaf_noprefetch": "LooseLeaf, no prefetch",
         "looseleaf_noclosure": "LooseLeaf, no closures", "looseleaf_fullsave": "LooseLeaf, full saves",
         "looseleaf_noimportcache": "LooseLeaf, no import cache", "looseleaf_nowarm": "LooseLeaf, no warm workers",
         "looseleaf": "LooseLeaf"}
MARK = {"pinned": "s", "pinned_packed": "P", "keepalive": "^", "notebookos": "D", "naive": "x",
        "looseleaf_noprefetch": "o", "looseleaf_noclosure": "v", "looseleaf_fullsave": "<",
        "looseleaf_noimportcache": ">", "looseleaf_nowarm": "h", "looseleaf": "*"}


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _summary(d):
    return {r["design"]: r for r in _rows(os.path.join(d, "summary.csv"))}


def timeline(d):
    rows = _rows(os.path.join(d, "timeline.csv"))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    busy_drawn = False
    for name in ORDER:
        pts = [r for r in rows if r["design"] == name]
        if not pts:
            continue
        t = [float(r["t_s"]) / 3600 for r in pts]
        ax.step(t, [float(r["provisioned_gpus"]) for r in pts], where="post", label=LABEL[name], lw=1.2)
        if name == "looseleaf" and not busy_drawn:
            ax.plot(t, [float(r["busy_gpus"]) for r in pts], color="grey", lw=0.8, ls=":",
                    label="LooseLeaf: GPUs holding a job")
            busy_drawn = True
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("provisioned GPUs (whole hosts)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "provisioned_gpus.png"), dpi=110)
    plt.close(fig)


def cdf(d):
    rows = _rows(os.path.join(d, "cdf.csv"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in ORDER:
        pts = [r for r in rows if r["design"] == name]
        if pts:
            ax.step([float(r["latency_s"]) for r in pts], [float(r["share"]) for r in pts], where="post",
                    label=LABEL[name])
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlim(1e-4, 1e3)
    ax.set_xlabel("GPU cell start latency, Run to execution (s)")
    ax.set_ylabel("share of GPU cells")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "latency_cdf.png"), dpi=110)
    plt.close(fig)


def frontier(out, dirs, labels=None):
    """GPU-hours (relative to pinned in the same run) against the share of GPU cells missing 1 s."""
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for k, d in enumerate(dirs):
        s = _summary(d)
        pin = float(s["pinned"]["gpu_hours"]) if "pinned" in s else None
        tag = labels[k] if labels else os.path.basename(os.path.normpath(d))
        for name in ORDER:
            if name not in s:
                continue
            gh = float(s[name]["gpu_hours"])
            y = gh / pin if pin else gh
            x = 100 * (1 - float(s[name]["share_within_1s"]))
            ax.scatter([max(x, 0.05)], [y], marker=MARK[name], s=60 if name == "looseleaf" else 35,
                       color="C%d" % ORDER.index(name), label=LABEL[name] if k == 0 else None)
            if name in ("looseleaf", "notebookos"):
                ax.annotate(tag, (max(x, 0.05), y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("GPU cells missing 1 s to start (%; none plotted at 0.05)")
    ax.set_ylabel("GPU-hours relative to session-pinned")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "--frontier":
        frontier(args[1], args[2:])
        return
    if len(args) != 1:
        raise SystemExit(__doc__)
    d = args[0]
    timeline(d)
    cdf(d)
    frontier(os.path.join(d, "frontier.png"), [d])
    print("plots: %s/{provisioned_gpus,latency_cdf,frontier}.png" % d)


if __name__ == "__main__":
    main()

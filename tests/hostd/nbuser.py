"""One test user's side of the hostd notebook test (test_hostd.py, test_notebooks_of_three_users): run as that
user (setpriv), in the user's own Jupyter dirs and pool dir, it starts the kernels a spec file names (two
LooseLeaf kernels and an ipykernel reference) through jupyter_client and runs their cells in lockstep: cell i
is sent to every kernel at once, then each one's reply and iopub messages through idle are collected.  It
writes, per kernel and cell, the reply's content and metadata and the iopub messages (type and content) as
JSON; the test compares them.

Usage: nbuser.py SPEC OUT.  SPEC: {"kernels": [{"name": kernelspec, "cells": [code, ...]}, ...]}, every
kernel with as many cells.  Uses the routing tests' helpers (tests/routing/routehelp.py: the Kernel of
tests/integration, execute requests, the GPU cells' timeout), so a kernel is driven as every notebook test
drives it.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "routing"))

from routehelp import GPU_TIMEOUT, Kernel, send_execute  # noqa: E402


def main(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    kernels = []
    t0 = time.monotonic()
    try:
        for k in spec["kernels"]:
            kernels.append(Kernel(k["name"]))
        out = [[] for _ in kernels]
        for i in range(len(spec["kernels"][0]["cells"])):
            ids = [send_execute(k, ks["cells"][i]) for k, ks in zip(kernels, spec["kernels"])]
            for n, (k, msg_id) in enumerate(zip(kernels, ids)):
                reply = k.reply(msg_id, timeout=GPU_TIMEOUT)
                msgs = k.iopub_until_idle(msg_id, GPU_TIMEOUT)
                # (progress, for the test's message when something fails)
                c = reply["content"]
                print("%.1f cell %d kernel %d: %s %s %s" % (time.monotonic() - t0, i, n, c["status"],
                                                            reply["metadata"].get("looseleaf", {}).get("route"),
                                                            c.get("evalue", "")[:200]), flush=True)
                out[n].append({"reply": {"content": reply["content"], "metadata": reply["metadata"]},
                               "msgs": [{"msg_type": m["msg_type"], "content": m["content"]} for m in msgs]})
    finally:
        for k in kernels:
            k.stop()
    with open(out_path, "w") as f:
        json.dump(out, f, default=str)  # (a date in metadata, if any, as text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

#!/usr/bin/env python3
"""GPU cells as responsive as CPU cells (`make bench`; issue 13, items 6 and 7), measured against ipykernel in
the same run, with the same raw client as bench_kernel.py:

  first output   a warm GPU cell that prints with flush=True at its start: Run (the client sends the
                 execute_request) to the first stdout message on iopub, less the kernel's own visible wait
                 (execute_reply.metadata.looseleaf.visible_wait_ms: Run to the worker starting the cell).
                 Target: median <= 5 ms.  Beside it the same cell's Run to first output on ipykernel and on
                 LooseLeaf's CPU route.
  CPU after GPU  a trivial CPU cell (`z = 1`) right after a GPU cell, Run to idle, against ipykernel's round
                 trip of the same pair.  Target: median and p95 <= 1.5x ipykernel's.

Runs on the Python that runs it (`make bench` uses the project's venv): the reference ipykernel is that
Python's, and the LooseLeaf kernel runs in the same environment.  Exit status 0 when every measurement was
taken (whatever the ratios), 1 when a kernel failed.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernel as bk  # noqa: E402

ROUNDS = int(os.environ.get("LL_BENCH_ROUNDS", "30"))
GPU_PRINT = "import torch\nprint('tick', flush=True)\n_ = torch.zeros(1)"
CPU_PRINT = "print('tick', flush=True)"


def first_output(client, code):
    """(seconds from send to the first stdout message, the execute_reply)."""
    first = []

    def on_msg(msg):
        if not first and msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            first.append(time.perf_counter())

    t0 = time.perf_counter()
    msg_id = client.send("execute_request", bk.execute_content(code))
    client.until_idle(msg_id, on_msg=on_msg)
    reply = client.shell_reply(msg_id)
    if reply["content"]["status"] != "ok" or not first:
        raise bk.BenchError("%r: %s" % (code, reply["content"]))
    return first[0] - t0, reply


def run_to_idle(client, code):
    t0 = time.perf_counter()
    msg_id = client.send("execute_request", bk.execute_content(code))
    client.until_idle(msg_id)
    elapsed = time.perf_counter() - t0
    if client.shell_reply(msg_id)["content"]["status"] != "ok":
        raise bk.BenchError("%r failed" % code)
    return elapsed


def p95(values):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))]


def main():
    try:
        with bk.kernels_on_a_private_pool("ll-bench-resp-pool-") as clients:
            ll, ref = clients["looseleaf"], clients["ipykernel"]
            for client in (ll, ref):  # warm: torch imported, the worker forked
                run_to_idle(client, "import torch\nx = torch.ones(4)\nx.sum()")
                run_to_idle(client, GPU_PRINT)
            late, ll_first, ll_cpu_first, ref_first = [], [], [], []
            after_ll, after_ref = [], []
            for _ in range(ROUNDS):
                t, reply = first_output(ll, GPU_PRINT)
                md = reply["metadata"].get("looseleaf", {})
                if md.get("route") != "gpu" or "visible_wait_ms" not in md:
                    raise bk.BenchError("the GPU cell did not run on a worker: %s" % md)
                ll_first.append(t)
                late.append(t - md["visible_wait_ms"] / 1e3)
                ref_first.append(first_output(ref, GPU_PRINT)[0])
                ll_cpu_first.append(first_output(ll, CPU_PRINT)[0])
                run_to_idle(ll, GPU_PRINT)
                after_ll.append(run_to_idle(ll, "z = 1"))
                run_to_idle(ref, GPU_PRINT)
                after_ref.append(run_to_idle(ref, "z = 1"))
            ms = lambda v: v * 1e3  # noqa: E731
            med_late = statistics.median(late)
            print("warm GPU cell, Run to first flushed output (median of %d):" % ROUNDS)
            print("  looseleaf GPU %7.2f ms (visible wait excluded: %5.2f ms, target <= 5 ms: %s)"
                  % (ms(statistics.median(ll_first)), ms(med_late), "met" if med_late <= 0.005 else "MISSED"))
            print("  looseleaf CPU %7.2f ms   ipykernel %7.2f ms"
                  % (ms(statistics.median(ll_cpu_first)), ms(statistics.median(ref_first))))
            r50 = statistics.median(after_ll) / statistics.median(after_ref)
            r95 = p95(after_ll) / p95(after_ref)
            print("trivial CPU cell after a GPU cell, Run to idle: looseleaf median %.2f ms p95 %.2f ms, ipykernel "
                  "median %.2f ms p95 %.2f ms: ratio %.2f / %.2f (target <= 1.5: %s)"
                  % (ms(statistics.median(after_ll)), ms(p95(after_ll)), ms(statistics.median(after_ref)),
                     ms(p95(after_ref)), r50, r95, "met" if max(r50, r95) <= 1.5 else "MISSED"))
            print('{"bench": "responsive", "first_output_late_ms_median": %.3f, "cpu_after_gpu_ratio": %.3f, '
                  '"cpu_after_gpu_ratio_p95": %.3f}' % (ms(med_late), r50, r95))
            return 0
    except bk.BenchError as e:
        print("bench_responsive: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

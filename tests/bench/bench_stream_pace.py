#!/usr/bin/env python3
"""How smoothly a cell's flushed output reaches the client (`make bench`; issue 29, item 4).

The cell prints a line every 20 ms with flush=True, 50 times:
    for i in range(50): print(i, flush=True); time.sleep(0.02)
(and once more without flush=True, where the coalescers' intervals show), and the client (raw ZeroMQ,
bench_kernel.RawClient) notes when each stream message arrives.  Reported per kernel and route: stream
messages, and the gaps between consecutive arrivals (median, p90, max).  A cell whose output is relayed as it
is flushed shows ~50 messages about 20 ms apart; batching shows fewer messages and gaps of the batching
interval.  The README promises a flushed line within 50 ms: target p90 gap <= 50 ms on both LooseLeaf routes
(ipykernel, for reference, in the same run).

Runs on the Python that runs it (`make bench` uses the project's venv).  Exit status 0 when every measurement
was taken, 1 when a kernel failed.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kernel as bk  # noqa: E402

ROUNDS = int(os.environ.get("LL_BENCH_ROUNDS", "3"))
LOOP = "import time\nfor i in range(50):\n    print(i, flush=True)\n    time.sleep(0.02)\n"
# The same without flush=True: then the coalescers decide (the kernel's every 50 ms; a worker's every 20 ms,
# relayed at once by the kernel), ipykernel's every 200 ms.
UNFLUSHED = LOOP.replace(", flush=True", "")
GPU = "import torch\n_ = torch.zeros(1)\n"


def arrivals(client, code):
    """(arrival times of the cell's stdout messages, the execute_reply)."""
    times, text = [], []

    def on_msg(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            times.append(time.perf_counter())
            text.append(msg["content"]["text"])

    msg_id = client.send("execute_request", bk.execute_content(code))
    client.until_idle(msg_id, on_msg=on_msg)
    reply = client.shell_reply(msg_id)
    if reply["content"]["status"] != "ok" or "".join(text) != "".join("%d\n" % i for i in range(50)):
        raise bk.BenchError("%r: %s %r" % (code, reply["content"], "".join(text)[:200]))
    return times, reply


def summary(runs):
    gaps = [b - a for times in runs for a, b in zip(times, times[1:])]
    gaps.sort()
    p90 = gaps[min(len(gaps) - 1, int(round(0.9 * (len(gaps) - 1))))]
    return {"messages": statistics.median(len(t) for t in runs), "gap_median_ms": statistics.median(gaps) * 1e3,
            "gap_p90_ms": p90 * 1e3, "gap_max_ms": gaps[-1] * 1e3}


def main():
    try:
        with bk.kernels_on_a_private_pool("ll-bench-pace-pool-") as clients:
            results = {}
            for name, client in clients.items():
                arrivals(client, GPU + LOOP)  # warm: torch imported, a worker forked
                for route, code in (("cpu", LOOP), ("gpu", GPU + LOOP)):
                    for loop, what in ((LOOP, "flushed"), (UNFLUSHED, "unflushed")):
                        runs = []
                        for _ in range(ROUNDS):
                            times, reply = arrivals(client, code.replace(LOOP, loop))
                            got = reply["metadata"].get("looseleaf", {}).get("route")
                            if name == "looseleaf" and got != route:
                                raise bk.BenchError("the %s cell ran on %s" % (route, got))
                            runs.append(times)
                        results[(name, route, what)] = summary(runs)
            print("a cell printing a flushed line every 20 ms, 50 lines (%d rounds): stream messages at the client"
                  % ROUNDS)
            for (name, route, what), s in results.items():
                line = "  %-9s %s %-9s: %4.1f messages, gap median %6.1f ms, p90 %6.1f ms, max %6.1f ms" % (
                    name, route, what, s["messages"], s["gap_median_ms"], s["gap_p90_ms"], s["gap_max_ms"])
                if name == "looseleaf" and what == "flushed":
                    line += " (target p90 <= 50 ms: %s)" % ("met" if s["gap_p90_ms"] <= 50 else "MISSED")
                print(line)
            ll_cpu, ll_gpu = results[("looseleaf", "cpu", "flushed")], results[("looseleaf", "gpu", "flushed")]
            print('{"bench": "stream_pace", "cpu_gap_p90_ms": %.1f, "gpu_gap_p90_ms": %.1f, "cpu_messages": %.1f, '
                  '"gpu_messages": %.1f}' % (ll_cpu["gap_p90_ms"], ll_gpu["gap_p90_ms"], ll_cpu["messages"],
                                             ll_gpu["messages"]))
            return 0
    except bk.BenchError as e:
        print("bench_stream_pace: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

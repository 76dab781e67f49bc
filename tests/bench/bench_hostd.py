#!/usr/bin/env python3
"""bench_hostd: three users sharing a host's 2 GPU slots through `looseleaf hostd` (issue 17).

Run by `make bench` (after `make all`), as root (it makes three test users with useradd and removes them;
elsewhere it says so and exits 0).  A broker of 2 slots; per user a private store and host pool run as that
user, and two sessions (clients of the user's pool, as kernels would be), each running LL_BENCH_CELLS (6) GPU
cells of 0.3 s with 1.0 s of think time between them, all six sessions at once.

Prints:
  per user: GPU-seconds held and busy (the broker's count), against what the same sessions would hold pinned
  (one slot each for the whole run), and the share of cells that started on a warm worker;
  cell start latency (submit to `started`, as a kernel sees it) over all cells: median, p95, max, and the
  slot wait (`wait_ms`) the pools report.
No targets yet: the numbers show what fair sharing costs in start latency against what it saves in GPU time.
"""
import os
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "hostd"))

import hdhelp  # noqa: E402

CELLS = int(os.environ.get("LL_BENCH_CELLS", "6"))
THINK_S = 1.0
CELL_S = 0.3


def session(client, out):
    """CELLS GPU cells on CLIENT with think time between; (latency s, wait_ms, warm_hit) per cell into OUT."""
    ev = client.run("def", "x = 1")
    assert hdhelp.reply_ok(ev), ev
    for i in range(CELLS):
        time.sleep(THINK_S)
        t0 = time.monotonic()
        client.submit("c%d" % i, "import time; time.sleep(%s); x += 1" % CELL_S, state_closure=["x"])
        ev = client.collect("c%d" % i)
        assert hdhelp.reply_ok(ev), ev
        st = hdhelp.started(ev)
        out.append((st["_t"] - t0, st.get("wait_ms", 0.0), bool(st.get("warm_hit"))))


def main():
    if not hdhelp.usable():
        print("bench_hostd: needs root, useradd and setpriv (real OS users): skipped")
        return 0
    bins = hdhelp.Binaries()
    hostd = hdhelp.Hostd(bins, nslots=2)
    users = []
    try:
        tag = "%05d" % (os.getpid() % 100000)
        users = [hdhelp.User("llbh%s%s" % (tag, c), bins, hostd.socket) for c in "abc"]
        clients = {u.name: [u.client("%s-s%d" % (u.name, k)) for k in range(2)] for u in users}
        results = {name: [] for name in clients}
        t0 = time.monotonic()
        threads = [threading.Thread(target=session, args=(c, results[name]))
                   for name, cs in clients.items() for c in cs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        st = hostd.stats()
        print("3 users x 2 sessions, %d GPU cells of %.1f s each per session, %.1f s think time, 2 slots; "
              "run %.1f s" % (CELLS, CELL_S, THINK_S, wall))
        print("%-12s %10s %10s %12s %9s" % ("user", "held s", "busy s", "pinned s", "warm hits"))
        for u in users:
            us = hdhelp.user_stats(st, u)
            hits = sum(1 for r in results[u.name] if r[2])
            print("%-12s %10.1f %10.1f %12.1f %6d/%d" % (u.name, us["gpu_held_s"], us["gpu_busy_s"], 2 * wall,
                                                          hits, len(results[u.name])))
        lat = sorted(r[0] * 1000 for rs in results.values() for r in rs)
        waits = sorted(r[1] for rs in results.values() for r in rs)
        print("cell start latency ms: median %.0f, p95 %.0f, max %.0f; slot wait ms: median %.0f, max %.0f"
              % (statistics.median(lat), lat[int(0.95 * (len(lat) - 1))], lat[-1], statistics.median(waits),
                 waits[-1]))
    finally:
        for u in users:
            u.close()
        hostd.close()
        bins.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

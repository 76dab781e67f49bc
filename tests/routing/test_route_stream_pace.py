"""A GPU cell's flushed output is as fine-grained as a CPU cell's (issue 29, item 4): every print(...,
flush=True) is a stream message of its own at the client, on both routes, however close together the prints
come: the worker sends a flushed chunk at once (its coalescer's flush, not its 20 ms timer) and the kernel
publishes each chunk a worker sends at once (ll_route), so nothing is batched on the way.  Counted, not
timed; tests/bench/bench_stream_pace.py (client) and tests/browser/bench_stream_pace.py (page) measure the
pace.
"""
from routehelp import run_route

LINES = 40
LOOP = "for i in range(%d):\n    print(i, flush=True)\n" % LINES


def stdout_chunks(msgs):
    return [m["content"]["text"] for m in msgs if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"]


def test_each_flushed_print_is_one_message_on_both_routes(ll):
    want = ["%d\n" % i for i in range(LINES)]
    _, cpu = run_route(ll, LOOP, "cpu")
    _, gpu = run_route(ll, "import torch\n_ = torch.zeros(1)\n" + LOOP, "gpu")
    assert stdout_chunks(cpu) == want
    assert stdout_chunks(gpu) == want


def test_flushed_prints_between_unflushed_ones_cut_the_stream_where_flushed(ll):
    # Unflushed text waits for the coalescer (it may join the next flushed line); a flush never leaves text
    # behind: each message ends with a flushed line.
    code = "for i in range(10):\n    print('a', i)\n    print('b', i, flush=True)\n"
    for route, prefix in (("cpu", ""), ("gpu", "import torch\n_ = torch.zeros(1)\n")):
        _, msgs = run_route(ll, prefix + code, route)
        chunks = stdout_chunks(msgs)
        assert "".join(chunks) == "".join("a %d\nb %d\n" % (i, i) for i in range(10)), route
        assert all(c.endswith("\n") and c.splitlines()[-1].startswith("b ") for c in chunks), (route, chunks)
        assert len(chunks) == 10, (route, chunks)

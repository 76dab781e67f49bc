"""Time travel over a training loop's checkpoints (issue 28): GPU cells update a tensor across cells, every
committed version stays in the session's history (store/ll_history.c), `%looseleaf history NAME` lists them
one line each starting NAME@N, `%looseleaf checkout NAME@N [as OTHER]` brings one back, and a budget drops the
oldest first, which a checkout of a dropped one says."""
import re

from routehelp import Kernel, _error_text, execute, run_route, stream_text

N = 700_000  # float32: 2.8 MB, two pool regions


def _history(k, name):
    reply, msgs = execute(k, "%%looseleaf history %s" % name)
    assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
    return [ln for ln in stream_text(msgs).splitlines() if ln]


def _versions(lines, name):
    return [int(m.group(1)) for m in (re.match(r"%s@(\d+)\s" % name, ln) for ln in lines) if m]


def test_history_and_checkout_over_a_training_loop(jupyter_env):
    k = Kernel("looseleaf", env={"LL_HISTORY_BYTES": "auto"})
    try:
        run_route(k, "import torch\nhw = torch.zeros(%d)\nhlr = 0.5" % N, "gpu")
        for step in range(3):
            run_route(k, "hw += hlr * 2\nhloss = float(hw.sum())", "gpu")
        lines = _history(k, "hw")
        vers = _versions(lines, "hw")
        assert len(vers) == 4 and vers == sorted(vers), lines
        assert all(ln.startswith("hw@") for ln in lines), lines
        assert "(current" in lines[-1] and all("current" not in ln for ln in lines[:-1]), lines
        # The cells the versions came from, their sizes.
        assert [re.search(r"In\[(\d+)\]", ln).group(1) for ln in lines] == ["1", "2", "3", "4"], lines
        assert all("2.7 MiB" in ln for ln in lines), lines
        # An earlier checkpoint under a new name: the current one stays.
        reply, msgs = execute(k, "%%looseleaf checkout hw@%d as hw1" % vers[1])
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        assert "hw@%d checked out as hw1" % vers[1] in stream_text(msgs)
        reply, msgs = run_route(k, "print(float(hw1[0]), float(hw[0]), hw1.shape == hw.shape)", "gpu")
        assert stream_text(msgs) == "1.0 3.0 True\n", stream_text(msgs)
        # Back in place: the next GPU cells train on from the first checkpoint.
        reply, msgs = execute(k, "%%looseleaf checkout hw@%d" % vers[0])
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        reply, msgs = run_route(k, "hw += hlr * 2\nprint(float(hw[0]), float(hw.sum()))", "gpu")
        assert stream_text(msgs) == "1.0 %.1f\n" % float(N), stream_text(msgs)
        # The versions checked out from stay listed; the newest is current.
        lines = _history(k, "hw")
        assert set(vers) <= set(_versions(lines, "hw")) and "(current" in lines[-1], lines
        # Bad requests: one clear line, the cell fails, the kernel and its variables stay.
        for bad, why in (("%looseleaf checkout hw@999999", "is not a version of hw"),
                         ("%looseleaf checkout hw", "is not NAME@N"),
                         ("%looseleaf checkout hw@1 as 9x", "is not a variable name"),
                         ("%looseleaf history", "usage")):
            reply, msgs = execute(k, bad)
            assert reply["content"]["status"] == "error" and why in _error_text(reply, msgs), \
                (bad, _error_text(reply, msgs))
        reply, msgs = run_route(k, "print(float(hw1[0]))", "gpu")
        assert stream_text(msgs) == "1.0\n"
    finally:
        k.stop()


def test_budget_drops_oldest_and_checkout_says_so(jupyter_env):
    # Room for one superseded version of 2 regions (not two).
    k = Kernel("looseleaf", env={"LL_HISTORY_BYTES": "5M"})
    try:
        run_route(k, "import torch\nbw = torch.zeros(%d)" % N, "gpu")
        for step in range(3):
            run_route(k, "bw += 1", "gpu")
        # The budget is kept right after each GPU cell's commit.
        lines = _history(k, "bw")
        kept = _versions(lines, "bw")
        assert "2 older versions dropped" in lines[-1], lines
        m = re.search(r"bw@(\d+), bw@(\d+)\)", lines[-1])
        first = int(m.group(1))
        assert first < kept[0]
        reply, msgs = execute(k, "%%looseleaf checkout bw@%d" % first)
        err = _error_text(reply, msgs)
        assert reply["content"]["status"] == "error" and "was dropped from the history" in err \
            and "LL_HISTORY_BYTES" in err, err
        reply, msgs = execute(k, "%%looseleaf checkout bw@%d as bw_prev" % kept[0])
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        reply, msgs = run_route(k, "print(float(bw_prev[0]), float(bw[0]))", "gpu")
        assert stream_text(msgs) == "2.0 3.0\n", stream_text(msgs)
    finally:
        k.stop()


def test_checkout_of_an_optimizer_shares_the_current_model(jupyter_env):
    """A version that shares objects with another variable (an optimizer's parameters are the model's) comes
    back sharing them with that variable as it is now: the model is brought into the kernel first."""
    k = Kernel("looseleaf", env={"LL_HISTORY_BYTES": "auto"})
    try:
        run_route(k, "import torch\nhm = torch.nn.Linear(2, 2)\nhopt = torch.optim.SGD(hm.parameters(), lr=0.1)",
                  "gpu")
        run_route(k, "hopt.param_groups[0]['lr'] = 0.5", "gpu")
        first = _versions(_history(k, "hopt"), "hopt")[0]
        reply, msgs = execute(k, "%%looseleaf checkout hopt@%d as hopt0" % first)
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        reply, msgs = run_route(k, "print(hopt0.param_groups[0]['params'][0] is hm.weight, "
                                   "hopt0.param_groups[0]['lr'], hopt.param_groups[0]['lr'])", "gpu")
        assert stream_text(msgs) == "True 0.1 0.5\n", stream_text(msgs)
    finally:
        k.stop()

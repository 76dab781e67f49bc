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


# ---- a real training loop: one GPU cell per epoch ---------------------------------------------------------
# The model's weight is 700x1024 float32 (2.7 MiB: two pool regions).  Each epoch cell trains on, then
# rebinds the checkpoints a user keeps (a clone of the weights, a cloned state_dict, the loss list) and writes
# the same values to EPOCHS/epoch<K>.pt with torch.save: what a checkout of epoch K must equal, bit for bit.
_SETUP = """import torch
torch.manual_seed(0)
tx = torch.randn(64, 1024)
ty = tx[:, :700] * 0.5
tmodel = torch.nn.Linear(1024, 700)
topt = torch.optim.SGD(tmodel.parameters(), lr=0.01)
tlosses = []
tw = tmodel.weight.detach().clone()
tsd = {k: v.detach().clone() for k, v in tmodel.state_dict().items()}
torch.save({'w': tw, 'sd': tsd, 'losses': tlosses}, %r + '/epoch0.pt')
"""
_EPOCH = """for _ in range(3):
    topt.zero_grad()
    loss = ((tmodel(tx) - ty) ** 2).mean()
    loss.backward()
    topt.step()
tlosses = tlosses + [loss.item()]
tw = tmodel.weight.detach().clone()
tsd = {k: v.detach().clone() for k, v in tmodel.state_dict().items()}
torch.save({'w': tw, 'sd': tsd, 'losses': tlosses}, %r + '/epoch%%d.pt' %% len(tlosses))
"""
_EPOCHS = 4


def _train(k, where):
    """The setup cell (In[1]) and _EPOCHS epoch cells (In[2]...); the reference files go to WHERE."""
    run_route(k, _SETUP % str(where), "gpu")
    for _ in range(_EPOCHS):
        run_route(k, _EPOCH % str(where), "gpu")


def _same_as_epoch(k, where, epoch, exprs):
    """Run a GPU cell asserting that each of EXPRS {expression: key of the epoch file} equals, exactly, what
    epoch EPOCH saved (tensors by torch.equal, state dicts key by key, lists by ==)."""
    checks = []
    for expr, key in exprs.items():
        if key == "sd":
            checks.append("sorted(%s) == sorted(_ref['sd']) and all(torch.equal(%s[n], _ref['sd'][n]) "
                          "for n in _ref['sd'])" % (expr, expr))
        elif key == "w":
            checks.append("torch.equal(%s, _ref['w'])" % expr)
        else:
            checks.append("%s == _ref['losses']" % expr)
    code = "_ref = torch.load(%r + '/epoch%d.pt')\nprint(%s)\ndel _ref" % (str(where), epoch, ", ".join(checks))
    reply, msgs = run_route(k, code, "gpu")
    assert stream_text(msgs) == " ".join(["True"] * len(checks)) + "\n", (epoch, exprs, stream_text(msgs))


def test_training_loop_history_and_exact_checkouts(jupyter_env, tmp_path):
    k = Kernel("looseleaf", env={"LL_HISTORY_BYTES": "auto"})
    try:
        _train(k, tmp_path)
        # One line per committed version: setup (epoch 0) and each epoch, from its own cell, oldest first.
        for name, size in (("tw", "2.7 MiB"), ("tsd", "2.7 MiB"), ("tlosses", "0 B")):
            lines = _history(k, name)
            assert len(lines) == _EPOCHS + 1, lines
            for i, ln in enumerate(lines):
                assert re.match(r"%s@\d+  In\[%d\]\s+\d\d:\d\d:\d\d  %s( |$)" % (name, i + 1, re.escape(size)),
                                ln), lines
            assert lines[-1].endswith("(current)") and "current" not in "".join(lines[:-1]), lines
            assert _versions(lines, name) == sorted(set(_versions(lines, name))), lines
        w = _versions(_history(k, "tw"), "tw")
        sd = _versions(_history(k, "tsd"), "tsd")
        ls = _versions(_history(k, "tlosses"), "tlosses")
        model = _versions(_history(k, "tmodel"), "tmodel")
        # As new names: exactly epoch 2's values; the current ones stay those of the last epoch.
        for spec in ("tw@%d as w2" % w[2], "tsd@%d as sd2" % sd[2], "tlosses@%d as l2" % ls[2],
                     "tmodel@%d as m2" % model[2]):
            reply, msgs = execute(k, "%looseleaf checkout " + spec)
            assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
            assert "%s checked out as %s" % tuple(spec.split(" as ")) in stream_text(msgs), stream_text(msgs)
        _same_as_epoch(k, tmp_path, 2, {"w2": "w", "sd2": "sd", "m2.state_dict()": "sd", "l2": "losses"})
        _same_as_epoch(k, tmp_path, _EPOCHS, {"tw": "w", "tsd": "sd", "tmodel.state_dict()": "sd",
                                              "tlosses": "losses"})
        # Into the kernel: tw is epoch 1's again, in the kernel (a cell there) and in the next GPU cell.
        reply, msgs = execute(k, "%%looseleaf checkout tw@%d" % w[1])
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        reply, msgs = execute(k, "print(tw.shape[0], float(tw.sum()) == float(w2.sum()))")
        assert reply["content"]["status"] == "ok" and stream_text(msgs) == "700 False\n", stream_text(msgs)
        _same_as_epoch(k, tmp_path, 1, {"tw": "w"})
        # The checkout is the newest version of tw; the epochs' versions stay listed.
        lines = _history(k, "tw")
        assert _versions(lines, "tw")[:_EPOCHS + 1] == w and len(lines) == _EPOCHS + 2, lines
        assert lines[-1].endswith("(current)"), lines
    finally:
        k.stop()


def test_training_loop_budget_drops_the_oldest_epochs(jupyter_env, tmp_path):
    # Each epoch supersedes ~11 MiB (the model, its weight clone, the state dict): room for about two.
    k = Kernel("looseleaf", env={"LL_HISTORY_BYTES": "24M"})
    try:
        _train(k, tmp_path)
        lines = _history(k, "tw")
        kept = _versions(lines, "tw")
        m = re.match(r"\((\d+) older versions? dropped to keep the history within its budget of [^:]+: (.*)\)$",
                     lines[-1])
        assert m, lines
        dropped = [int(v) for v in re.findall(r"tw@(\d+)", m.group(2))]
        assert int(m.group(1)) == len(dropped) >= 1 and len(kept) >= 2, lines
        assert max(dropped) < min(kept) and len(kept) + len(dropped) == _EPOCHS + 1, lines
        assert all(ln.startswith("tw@") for ln in lines[:-1]), lines
        # The oldest (epoch 0) went first: a checkout says it was dropped and why, the kernel untouched.
        reply, msgs = execute(k, "%%looseleaf checkout tw@%d as w0" % dropped[0])
        err = _error_text(reply, msgs)
        assert reply["content"]["status"] == "error" and "was dropped from the history" in err \
            and "LL_HISTORY_BYTES" in err, err
        # The oldest kept one is exactly its epoch's.
        epoch = len(dropped)
        reply, msgs = execute(k, "%%looseleaf checkout tw@%d as wk" % kept[0])
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        _same_as_epoch(k, tmp_path, epoch, {"wk": "w"})
        _same_as_epoch(k, tmp_path, _EPOCHS, {"tw": "w", "tlosses": "losses"})
    finally:
        k.stop()

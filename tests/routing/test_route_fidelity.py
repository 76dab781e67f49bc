"""GPU cells indistinguishable from ipykernel (issue 13, items 1-4), cell by cell against ipykernel:

1. nothing a cell made is lost: a torch.Generator goes through its state; a generator or an iterator over a
   DataLoader made on a worker lives on there, and every later cell reading it runs there whatever its label
   (a CPU cell included); when that worker goes, a cell reading it gets LostVariable naming it and why;
2. autograd across cells: gradients accumulate across GPU cells, a loss computed in one cell is
   back-propagated in a later one, requires_grad / is_leaf / .grad / retain_grad / hooks hold;
3. memory shared between names stays shared across the CPU/GPU boundary (torch.from_numpy, Tensor.numpy,
   views, np.frombuffer): an in-place change through one name is seen through the other;
4. the user's own modules keep their globals across routes, and importlib.reload / %autoreload of an edited
   module reach the other side.

As test_route_semantics.py, the comparisons run twice, on a pool of their own each time: "cold"
(LL_POOL_WARM_IDLE_S=0: a GPU cell forks a fresh worker and restores from the store, unless the session has a
home worker, which stays) and "warm" (the session's worker stays).  Losing a home (its worker killed, or
evicted for another session on a one-slot pool) runs on kernels of its own.
"""
import os
import re
import signal

from routehelp import (Kernel, cold_warm_fixtures, execute, ll_md, run_route, stop_pool, stream_text,
                       wait_for)

GPU, CPU = "gpu", "cpu"


pool_mode, ll, ref = cold_warm_fixtures("fid-")


def _home_cell(pair, code):
    """CODE, CPU-labelled, reads a name whose value lives in the session's worker: it runs there."""
    reply, _ = pair.cell(code, GPU)
    md = ll_md(reply)
    assert md["label"] == CPU and md.get("to_home"), md
    return md


# ---- 1. nothing a cell made is lost -------------------------------------------------------------------------

def test_torch_generator_object_is_kept(pair):
    pair.cells([
        ("import torch\ngen_g = torch.Generator().manual_seed(7)\nprint(torch.rand(2, generator=gen_g))", GPU),
        ("print(torch.rand(2, generator=gen_g))", GPU),
        ("gen_draws = torch.rand(3, generator=gen_g).tolist()", GPU),
        ("print([round(x, 4) for x in gen_draws])", None),
    ])


def test_generator_made_on_a_worker_lives_there(pair):
    pair.cells([
        ("def squares(n):\n    for i in range(n):\n        yield i * i", CPU),
        ("import torch\nsq = squares(6)\nprint(torch.tensor(next(sq)))", GPU),
        ("sq_seen = []", CPU),
    ])
    md = _home_cell(pair, "sq_seen.append(next(sq))\nprint(sq_seen, next(sq))")
    assert md["home"]["sq"]["kind"] == "held" and md["home"]["sq"]["what"] == "a generator", md
    pair.cells([
        ("print(torch.tensor(next(sq)), sq_seen)", GPU),
        ("sq = 'rebound on the cpu'", CPU),
        ("print(sq)", CPU),
    ])
    reply, _ = pair.cell("print(sq, torch.ones(1))", GPU)
    assert "sq" not in ll_md(reply).get("home", {}), ll_md(reply)


def test_dataloader_iterator_and_what_it_shares(pair):
    pair.cells([
        ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
         "dl_data = TensorDataset(torch.arange(12.).reshape(6, 2))\ndl = DataLoader(dl_data, batch_size=2)", GPU),
        ("batches = iter(dl)\nprint(next(batches))", GPU),
        ("dl_count = 0", CPU),
        ("print(next(batches))\ndl_count += 1", GPU),
        ("print(dl_count)", CPU),
        ("print(next(batches), len(dl))\nprint(next(batches, 'done'))", GPU),
    ])
    reply, msgs = execute(pair.ll, "%looseleaf")
    out = stream_text(msgs)
    assert re.search(r"batches\s+worker \d+ \(an iterator over a DataLoader\), only there", out), out
    reply, _ = pair.cell("del batches", GPU)  # (the session has no home after it: cold stays cold)
    assert ll_md(reply)["home"] == {}, ll_md(reply)


# ---- 2. autograd across cells --------------------------------------------------------------------------------

def test_gradients_accumulate_and_losses_backpropagate_later(pair):
    pair.cells([
        ("import torch\ntorch.manual_seed(0)\nag_net = torch.nn.Linear(3, 1)\nag_x = torch.randn(4, 3)", GPU),
        ("ag_net(ag_x).pow(2).mean().backward()\nprint(ag_net.weight.grad)", GPU),
        ("ag_net(ag_x).pow(2).mean().backward()\nprint(ag_net.weight.grad)", GPU),  # accumulates
        ("ag_loss = ag_net(ag_x).sum()\nprint(ag_loss.requires_grad, ag_loss.is_leaf)", GPU),
        ("ag_note = 'a cpu cell between'", CPU),
        ("ag_loss.backward()\nprint(ag_net.weight.grad, ag_net.bias.grad)", GPU),
        ("ag_grads = ag_net.weight.grad.tolist()", GPU),
        ("print([[round(v, 4) for v in row] for row in ag_grads])", None),
        ("ag_mid = ag_net(ag_x)\nag_mid.retain_grad()\nag_mid.sum().backward()\nprint(ag_mid.grad.flatten())", GPU),
        ("print(ag_mid.retains_grad, ag_mid.grad.flatten(), ag_mid.grad_fn is not None)", GPU),
        ("ag_w = torch.ones(2, requires_grad=True)\nag_h = ag_w.register_hook(lambda g: g * 10)", GPU),
        ("(ag_w * 2).sum().backward()\nprint(ag_w.grad)", GPU),
        ("ag_h.remove()\n(ag_w * 2).sum().backward()\nprint(ag_w.grad, ag_w.is_leaf, ag_w.requires_grad)", GPU),
        ("ag_opt = torch.optim.SGD(ag_net.parameters(), lr=0.1)\nag_opt.step()\n"
         "print(ag_net.weight.data, ag_opt.param_groups[0]['params'][0] is ag_net.weight)", GPU),
        ("print(ag_loss)\ndel ag_loss, ag_mid", GPU),
    ])


def test_autograd_state_restored_in_the_kernel(pair):
    """The kernel's route: a GPU cell reading a value made in the kernel that no store holds (a lock) runs in
    the kernel, which restores the tensors from the store: requires_grad, .grad and the hook hold there."""
    pair.cells([
        ("import torch\nkr_w = torch.ones(2, requires_grad=True)\nkr_h = kr_w.register_hook(lambda g: g * 3)\n"
         "(kr_w * 2).sum().backward()", GPU),
        ("import threading\nkr_lock = threading.Lock()", CPU),
    ])
    code = "with kr_lock:\n    (kr_w * 2).sum().backward()\n    print(kr_w.grad, kr_w.requires_grad, kr_w.is_leaf)"
    r_ref, m_ref = execute(pair.ref, code)
    r_ll, m_ll = execute(pair.ll, code)
    md = ll_md(r_ll)
    assert md["route"] == CPU and "kr_lock" in md["fallback"], md
    assert r_ll["content"]["status"] == "ok" and stream_text(m_ll) == stream_text(m_ref) == \
        "tensor([12., 12.]) True True\n", (stream_text(m_ll), stream_text(m_ref))
    pair.cells([("del kr_lock", CPU), ("kr_h.remove()\n(kr_w * 2).sum().backward()\nprint(kr_w.grad)", GPU)])


# ---- 3. shared memory across the CPU/GPU boundary --------------------------------------------------------

def test_memory_shared_between_kernel_and_worker_names(pair):
    pair.cells([
        ("import numpy as np\nsh_a = np.zeros(4)\nsh_v = sh_a[1:3]", CPU),
        ("import torch\nsh_t = torch.from_numpy(sh_a)\nsh_t.add_(1)\nprint(sh_t)", GPU),
        ("print(sh_a, sh_v)", CPU),
        ("sh_a *= 3\nsh_v[0] = -1", CPU),
        ("print(sh_t)\nsh_t.mul_(2)", GPU),
        ("print(sh_a, sh_v)", CPU),
        ("sh_u = torch.zeros(3)\nsh_b = sh_u.numpy()\nsh_s = sh_u.as_strided((2,), (2,))", GPU),
        ("sh_b[1] = 7\nsh_b[2] = 9", None),
        ("print(sh_u, sh_s)\nsh_s.add_(100)", GPU),
        ("print(sh_b)", None),
        ("sh_buf = bytearray(b'abcdef')\nsh_f = np.frombuffer(sh_buf, dtype=np.uint8)[2:]", CPU),
        ("sh_buf[3] = 0\nprint(sh_f, torch.ones(1))", GPU),
        ("print(sh_f, bytes(sh_buf))", CPU),
    ])


# ---- 4. user modules are session state ---------------------------------------------------------------------

_MOD_V1 = "count = 0\n\ndef bump(k=1):\n    global count\n    count += k\n    return count\n"
_MOD_V2 = "count = 0\n\ndef bump(k=1):\n    global count\n    count += 10 * k\n    return ('v2', count)\n"
_MOD_V3 = "count = 0\n\ndef bump(k=1):\n    global count\n    count += 100 * k\n    return ('third', count)\n"


def test_user_module_globals_follow_the_session(pair, tmp_path, pool_mode):
    d = tmp_path / "mods"
    d.mkdir()
    name = "um_%s" % pool_mode
    path = d / (name + ".py")
    path.write_text(_MOD_V1)
    pair.cells([
        ("import sys\nsys.path.insert(0, %r)\nimport %s as um" % (str(d), name), CPU),
        ("import torch\num.bump()\nprint(um.count, torch.ones(1))", GPU),
        ("print(um.count)", CPU),
        ("um.bump(2)\num.note = 'set on the cpu'", CPU),
        ("print(um.count, um.note, torch.ones(1))\num.bump()\num.seen = [um.count]", GPU),
        ("print(um.count, um.seen, um.note)", CPU),
    ])
    path.write_text(_MOD_V2)
    pair.cells([
        ("import importlib\num = importlib.reload(um)\nprint(um.count, um.bump())", CPU),
        ("print(um.bump(), torch.ones(1))", GPU),
        ("print(um.count)", CPU),
    ])
    pair.cell("%load_ext autoreload\n%autoreload 2", CPU)
    path.write_text(_MOD_V3)
    pair.cells([
        ("print(um.bump(), torch.ones(1))", GPU),
        ("print(um.bump())", CPU),
        ("%autoreload 0", CPU),
    ])
    path.write_text(_MOD_V1)
    pair.cells([
        ("um = importlib.reload(um)\nprint(um.bump(), torch.ones(1))", GPU),  # reloaded on the worker
        ("print(um.bump(), um.count)", CPU),
    ])


# ---- 1. a lost home: LostVariable, never a bare NameError -------------------------------------------------

def _kill_and_wait(pid):
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists("/proc/%d" % pid) or
             open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0] == "Z", 30, "worker %d to die" % pid)


def test_home_worker_killed_then_lost_variable(jupyter_env, tmp_path):
    pool_dir = str(tmp_path / "pool")
    k = Kernel("looseleaf", env={"LOOSELEAF_POOL_DIR": pool_dir, "LL_POOL_WARM_IDLE_S": "0"})
    try:
        run_route(k, "def lv_gen():\n    yield 1\n    yield 2", CPU)
        reply, _ = run_route(k, "import torch\nlv_it = lv_gen()\nlv_t = torch.ones(2, requires_grad=True)\n"
                                "lv_loss = (lv_t * 3).sum()\nlv_keep = [1, 2]", GPU)
        md = ll_md(reply)
        home = md["home"]
        assert home["lv_it"]["kind"] == "held" and home["lv_loss"]["kind"] == "graph", home
        assert home["lv_t"]["kind"] == "tied" and "lv_keep" not in home, home
        pid = md["worker_pid"]
        assert md["stays_warm"] is True  # a home stays, warm workers or not
        _kill_and_wait(pid)
        reply, msgs = execute(k, "print('before')\nprint(next(lv_it))")
        c = reply["content"]
        assert c["status"] == "error" and c["ename"] == "LostVariable", c
        assert re.match(r"'lv_it' lived only in worker %d \(a generator\), which died \(killed by signal 9\) "
                        r"at \d\d:\d\d:\d\d$" % pid, c["evalue"]), c["evalue"]
        assert stream_text(msgs) == "before\n"
        # A graph's value survives without the graph, and the next cell reading it is told; what it shared
        # comes back from the store.
        reply, msgs = execute(k, "print(lv_loss.item(), lv_t.tolist(), lv_keep)")
        assert reply["content"]["status"] == "ok", reply["content"]
        assert stream_text(msgs) == "6.0 [1.0, 1.0] [1, 2]\n"
        err = stream_text(msgs, "stderr")
        assert "'lv_loss' lost its autograd graph: it lived in worker %d, which died" % pid in err, err
        # Catching NameError still works, and binding the name again ends the loss.
        _, msgs = execute(k, "try:\n    lv_it\nexcept NameError as e:\n    print(type(e).__name__)")
        assert stream_text(msgs) == "NameError\n"  # (LostVariable is what a traceback shows)
        run_route(k, "lv_it = iter([5])", CPU)
        _, msgs = run_route(k, "print(next(lv_it))", CPU)
        assert stream_text(msgs) == "5\n"
    finally:
        k.stop()
        stop_pool(pool_dir)


def test_home_gone_with_the_pool(jupyter_env, tmp_path):
    pool_dir = str(tmp_path / "pool")
    k = Kernel("looseleaf", env={"LOOSELEAF_POOL_DIR": pool_dir})
    try:
        run_route(k, "def pg_gen():\n    yield 1", CPU)
        reply, _ = run_route(k, "import torch\npg_it = pg_gen()\npg_t = torch.ones(1)", GPU)
        pid = ll_md(reply)["worker_pid"]
        stop_pool(pool_dir)
        reply, _ = execute(k, "print(next(pg_it))")
        c = reply["content"]
        assert c["ename"] == "LostVariable" and re.match(
            r"'pg_it' lived only in worker %d \(a generator\), which went with the GPU pool at \d\d:\d\d:\d\d$"
            % pid, c["evalue"]), c
        _, msgs = run_route(k, "print(pg_t)", GPU)  # the rest comes back from the store, on a new pool
        assert stream_text(msgs) == "tensor([1.])\n"
    finally:
        k.stop()
        stop_pool(pool_dir)


def test_home_evicted_for_another_session(jupyter_env, tmp_path):
    """One slot: another session's cell evicts the home (the only warm worker); the home's session hears it,
    and its next cell reading the value gets LostVariable saying so.  Before that, a warm worker that is no
    home is evicted first."""
    pool_dir = str(tmp_path / "pool")
    env = {"LOOSELEAF_POOL_DIR": pool_dir, "LL_POOL_SLOTS": "1", "LL_POOL_WARM_IDLE_S": "300"}
    a, b = Kernel("looseleaf", env=env), Kernel("looseleaf", env=env)
    try:
        reply, _ = run_route(a, "import torch\nev_it = (t for t in [torch.ones(1), torch.zeros(1)])\n"
                                "print(next(ev_it))", GPU)
        pid = ll_md(reply)["worker_pid"]
        assert ll_md(reply)["home"]["ev_it"]["kind"] == "held"
        reply, _ = run_route(b, "import torch\nev_b = torch.ones(1)", GPU)
        assert ll_md(reply)["worker_pid"] != pid
        wait_for(lambda: not os.path.exists("/proc/%d" % pid) or
                 open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0] == "Z", 60, "the home to go")
        reply, _ = execute(a, "print(next(ev_it))")
        c = reply["content"]
        assert c["ename"] == "LostVariable" and re.match(
            r"'ev_it' lived only in worker %d \(a generator\), evicted for another session at \d\d:\d\d:\d\d$"
            % pid, c["evalue"]), c
        reply, msgs = execute(a, "%looseleaf")
        assert "ev_it" in stream_text(msgs) and "lost" in stream_text(msgs), stream_text(msgs)
    finally:
        a.stop()
        b.stop()
        stop_pool(pool_dir)

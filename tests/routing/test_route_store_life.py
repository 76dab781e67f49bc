"""The kernel's checkpoint store over its life (coherence.py): opened at the first GPU cell in a private 0700
directory with its own redis-server, deleted at shutdown; when its kernel dies without shutting down, the
redis-server dies with it and the next kernel sweeps the directory.  And the rule that a value a GPU cell binds
that no store can hold (a generator, an open file) lives on in the worker that made it, the session's home for
it, where later cells reading it run."""
import os
import signal

from routehelp import Kernel, execute, ll_md, redis_processes, run_route, store_dirs_of, stream_text, wait_for


def test_store_opens_at_first_gpu_cell_and_goes_at_shutdown(jupyter_env):
    k = Kernel("looseleaf")
    try:
        run_route(k, "sl_x = 1", "cpu")
        assert store_dirs_of(k.pid) == [], "a store before any GPU cell"
        run_route(k, "import torch\nsl_t = torch.ones(2)", "gpu")
        dirs = store_dirs_of(k.pid)
        assert len(dirs) == 1 and os.stat(dirs[0]).st_mode & 0o777 == 0o700, dirs
        assert redis_processes(dirs[0]), "no redis-server for %s" % dirs[0]
    finally:
        k.stop()
    wait_for(lambda: not os.path.exists(dirs[0]), 30, "the store dir to go at shutdown")
    wait_for(lambda: not redis_processes(dirs[0]), 30, "the store's redis-server to stop")


def test_next_kernel_sweeps_the_store_of_a_killed_kernel(jupyter_env):
    """A killed kernel's redis-server dies with it (parent-death signal, issue 16); its store dir (with the
    append-only file) stays until the next kernel that opens a store sweeps it."""
    k1 = Kernel("looseleaf")
    run_route(k1, "import torch\nsw_t = torch.ones(2)", "gpu")
    dirs = store_dirs_of(k1.pid)
    assert len(dirs) == 1
    os.kill(k1.pid, signal.SIGKILL)
    wait_for(lambda: not k1.km.is_alive(), 30, "the kernel to die")
    wait_for(lambda: not redis_processes(dirs[0]), 10, "the dead kernel's redis-server to go")
    assert os.path.exists(dirs[0]), "SIGKILL left no store dir behind?"
    k2 = Kernel("looseleaf")
    try:
        run_route(k2, "import torch\nsw_u = torch.ones(2)", "gpu")  # opens its store: sweeps
        wait_for(lambda: not os.path.exists(dirs[0]), 30, "the dead kernel's store dir to be swept")
        wait_for(lambda: not redis_processes(dirs[0]), 30, "the dead kernel's redis-server to stop")
    finally:
        k2.stop()
        k1.stop()


def test_gpu_cell_binding_a_generator_keeps_it_on_its_worker(jupyter_env):
    k = Kernel("looseleaf")
    try:
        run_route(k, "import torch\ngx = torch.arange(8.)", "gpu")
        reply, msgs = run_route(k, "gen = (gx[i:i + 2] for i in range(0, 8, 2))\nprint(next(gen).tolist())", "gpu")
        md = ll_md(reply)
        home = md["worker_pid"]
        assert md["home"]["gen"] == {"pid": home, "kind": "held", "what": "a generator"}, md
        assert md["stays_warm"] is True and "save_failed" not in md, md
        assert stream_text(msgs, "stderr") == "" and stream_text(msgs) == "[0.0, 1.0]\n"
        # Later cells needing it run where it lives, and it kept its position.
        reply, msgs = run_route(k, "print(next(gen).tolist(), gx.sum().item())", "gpu")
        assert ll_md(reply)["worker_pid"] == home and stream_text(msgs) == "[2.0, 3.0] 28.0\n"
        # A GPU cell that does not need it runs on the session's worker too (it is warm).
        reply, msgs = run_route(k, "gy = gx * 2\nprint(gy[1].item())", "gpu")
        assert ll_md(reply)["worker_pid"] == home and stream_text(msgs) == "2.0\n"
    finally:
        k.stop()

"""A GPU cell's globals are the user's, as in ipykernel: the worker's own set-up (its zygote's sys.path, the
store's and the debugger's imports) binds no name in the user's namespace, where `globals()`, `dir()`, the
debugger's variables panel and `%who` would show it."""
from routehelp import Kernel, _error_text, execute, run_route, stream_text

CELL = ("import torch\nt = torch.zeros(2)\n"
        "print(sorted(k for k in globals() if not k.startswith('_')))")


def test_a_gpu_cell_sees_only_the_users_globals(jupyter_env):
    ref = Kernel("python3")
    try:
        reply, msgs = execute(ref, CELL)
        assert reply["content"]["status"] == "ok", _error_text(reply, msgs)
        want = stream_text(msgs)
    finally:
        ref.stop()
    k = Kernel("looseleaf")
    try:
        _, msgs = run_route(k, CELL, "gpu")
        assert stream_text(msgs) == want
        # A CPU cell after it sees the same names (what the GPU cell bound, nothing of the worker's).
        reply, msgs = execute(k, "print(sorted(k for k in globals() if not k.startswith('_')))")
        assert stream_text(msgs) == want, _error_text(reply, msgs)
    finally:
        k.stop()

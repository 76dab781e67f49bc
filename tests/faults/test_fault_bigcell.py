"""A cell too big to analyse (issue 16, item 5): the gateway does not hand it to the analysis (whose AST and
session facts cost ~10x a cell's size, and stayed), it runs in the kernel with a plan that assumes the worst,
and the session stays correct: what it defined, even a function whose body later cells reach, is there for
later GPU cells, which from then on restore every variable.  The limit is LOOSELEAF_ANALYSIS_MAX_BYTES (64 KiB
here, 1 MiB by default)."""
import pytest

from faulthelp import execute, gpu_kernel, ll_md, run_route, stream_text


@pytest.fixture(scope="module")
def bk():
    with gpu_kernel("import torch\nbc_t = torch.ones(3)",
                    env={"LOOSELEAF_ANALYSIS_MAX_BYTES": str(64 << 10)}) as k:
        yield k


def test_a_cell_over_the_limit_runs_unanalysed_and_the_session_stays_right(bk):
    pad = "bc_pad = %r\n" % ("x" * (80 << 10))
    code = pad + "def bc_f():\n    return bc_t * 2 + bc_n\nbc_n = 5\nbc_t.add_(1)\nprint(len(bc_pad))"
    reply, msgs = execute(bk, code)
    assert reply["content"]["status"] == "ok", reply["content"]
    md = ll_md(reply)
    assert md["route"] == "cpu" and "over the analysis limit" in md.get("analysis_skipped", ""), md
    assert "cell" not in md and "closure" not in md, md
    assert stream_text(msgs) == "%d\n" % (80 << 10)
    # A GPU cell reaching what the unanalysed cell defined (through bc_f's body) sees all of it.
    _, msgs = run_route(bk, "%%gpu\nprint(bc_f().tolist())", "gpu")
    assert stream_text(msgs) == "[9.0, 9.0, 9.0]\n"
    # ... and what a GPU cell changes comes back to the kernel.
    run_route(bk, "%%gpu\nbc_n = bc_n + 1", "gpu")
    _, msgs = run_route(bk, "%%cpu\nprint(bc_f().tolist())", "cpu")
    assert stream_text(msgs) == "[10.0, 10.0, 10.0]\n"


def _vm_hwm_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for %d" % pid)


def test_a_huge_cell_of_statements_runs_in_bounded_memory():
    """Issue 23, part 3, item 6: IPython parses a cell into Python objects at ~450 bytes per byte of short
    statements (8 MB of `x = 1` lines: ~3.7 GB in ipykernel and, before, here; 100 MB reached the OOM killer).
    A cell over LOOSELEAF_HUGE_CELL_BYTES (1 MiB) is transformed and compiled piece by piece: it runs, with
    ipykernel's result (an IPython transformation in it, its last expression's value shown), the kernel staying
    under 1.5 GB; a syntax error near its end still stops it before anything ran (such a cell takes IPython's
own path)."""
    from faulthelp import FaultKernel
    lines = (8 << 20) // len("hc_x = 1\n")
    code = "hc_echo = !echo hi\nhc_n = 0\n" + "hc_x = 1\nhc_n += hc_x\n" * (lines // 2) + "hc_n, hc_echo"
    k = FaultKernel(env={"LOOSELEAF_GPU_ROUTING": "0"})
    try:
        execute(k, "1")
        before = _vm_hwm_kb(k.pid)
        reply, msgs = execute(k, code, timeout=900)
        assert reply["content"]["status"] == "ok", reply["content"]
        results = [m["content"]["data"]["text/plain"] for m in msgs if m["msg_type"] == "execute_result"]
        assert results == ["(%d, ['hi'])" % (lines // 2)], results
        grew = _vm_hwm_kb(k.pid) - before
        assert grew < 1536 << 10, "the kernel grew by %d MB" % (grew >> 10)
        # A syntax error at the end: nothing of the cell ran.
        reply, _ = execute(k, "hc_y = 1\n" * ((3 << 19) // 9) + "hc_z = (\n", timeout=900)
        assert reply["content"]["ename"] == "SyntaxError", reply["content"]
        reply, msgs = execute(k, "print('hc_y' in globals())")
        assert stream_text(msgs) == "False\n"
    finally:
        k.stop()

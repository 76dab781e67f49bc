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

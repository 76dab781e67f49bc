"""Many variables made at once (issue 23, part 3, item 3): 200k names made by one exec made every later GPU
cell fail after 14-19 s with "StoreUnavailable ... (WATCH)".  A commit checked its writes pairwise for
duplicates (a loop over every earlier write, for every write): seconds for 100k names, spent before the
commit's first Redis call, which then found the store's deadline gone.  Nothing was committed, the names stayed
dirty, and the next GPU cell tried again.  The kernel also commits many names in batches now, so that no
single Redis transaction grows with what one cell made.

Here 100k names, once made by a cell on a worker, once by a cell in the kernel, with a 4 s store timeout: the
GPU cells after them run and see them, and so does a CPU cell."""
import pytest

from faulthelp import GPU_TIMEOUT, execute, gpu_kernel, ll_md, new_pool_dir, run_route, stream_text

N = 100000


@pytest.fixture(scope="module")
def nk():
    with gpu_kernel("import torch\nnm_t = torch.ones(2)", new_pool_dir(), env={"LL_STORE_TIMEOUT_S": "4"}) as k:
        yield k


@pytest.mark.parametrize("where", ["gpu", "cpu"])
def test_many_names_made_at_once_do_not_break_later_gpu_cells(nk, where):
    p = "nm%s_" % where
    reply, _ = execute(nk, "%%%%%s\nexec('\\n'.join('%s%%d = %%d' %% (i, i) for i in range(%d)))" % (where, p, N),
                       timeout=GPU_TIMEOUT * 2)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert ll_md(reply)["route"] == where
    want = "tensor([%d., %d.])\n" % (N + 6, N + 6)
    for code, out in (("print(nm_t * %s7 + %s%d)" % (p, p, N - 1), want), ("print(nm_t.sum())", "tensor(2.)\n")):
        _, msgs = run_route(nk, "%%gpu\n" + code, "gpu", timeout=GPU_TIMEOUT * 2)
        assert stream_text(msgs) == out
    _, msgs = run_route(nk, "%%%%cpu\nprint(%s123 + 1, len([k for k in globals() if k.startswith('%s')]))" % (p, p),
                        "cpu")
    assert stream_text(msgs) == "124 %d\n" % N

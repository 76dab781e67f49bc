"""Completing names of a package the kernel has not imported never imports it there (issue 29, item 3).

jedi and IPython's import completer used to import torch into the kernel for `import torch\\ntorch.ar` (3-4 s
each time on these machines), and the GPU cell run meanwhile waited behind that completion.  Now the kernel
answers from an index of the package's names (written by the zygote that imported it, or by a throwaway
process), and its interpreter never imports torch for a completion.  The answers contain ipykernel's (which
imports torch to give them); an answer asked before the index exists may be empty, so the first comparison
polls until the index is there.
"""
import time

from routehelp import GPU_TIMEOUT, execute, ll_md, send_execute

PROBE = "import sys\nprint('torch' in sys.modules)\n"
# Whether jedi's parser cache in the kernel holds any file of torch (and, not to be vacuous, any file).
PARSED = ("import sys\npc = sys.modules.get('parso.cache')\n"
          "paths = [str(p) for g in (pc.parser_cache.values() if pc else []) for p in g]\n"
          "print(any('/torch/' in p for p in paths), bool(paths))\n")
GPU_CELL = "import torch\nprint(torch.ones(2).sum().item())\n"


def complete(k, code, cursor=None):
    msg_id = k.kc.complete(code, len(code) if cursor is None else cursor)
    return k.reply(msg_id, timeout=GPU_TIMEOUT)["content"]


def torch_in_kernel(ll):
    reply, msgs = execute(ll, PROBE)
    assert ll_md(reply).get("route") == "cpu"
    text = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    assert text in ("True\n", "False\n"), text
    return text == "True\n"


def test_completion_of_an_unimported_package_matches_ipykernel_without_importing_it(pair):
    ll, ref = pair.ll, pair.ref
    assert not torch_in_kernel(ll)
    drafts = ["import torch\ntorch.ar", "import torch as T\nT.ar", "from torch import ar",
              "import torch\ntorch.nn.Lin", "import torch\nx = 1\ntorch.a"]
    want = {d: complete(ref, d) for d in drafts}
    assert all(want[d]["matches"] for d in drafts), want  # not vacuous: ipykernel has names for each
    deadline = time.monotonic() + GPU_TIMEOUT
    while True:  # the index may be written while we ask
        got = complete(ll, drafts[0])
        if set(want[drafts[0]]["matches"]) <= set(got["matches"]) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for d in drafts:
        got = complete(ll, d)
        assert got["status"] == "ok"
        assert set(want[d]["matches"]) <= set(got["matches"]), (d, want[d]["matches"], got["matches"])
        assert (got["cursor_start"], got["cursor_end"]) == (want[d]["cursor_start"], want[d]["cursor_end"]), d
    # Inference through the package is not attempted: jedi would read torch's sources (~2.5 s the first
    # time, the same hold-up as the import); nothing of torch is parsed in the kernel.
    got = complete(ll, "import torch\nx = torch.zeros(3)\nx.res")
    assert got["status"] == "ok"
    reply, msgs = execute(ll, PARSED)
    assert "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream") == "False True\n"
    # Module names after `import` come from the file system, as ipykernel lists them.
    d = "import torch.n"
    assert set(complete(ll, d)["matches"]) == set(complete(ref, d)["matches"])
    assert not torch_in_kernel(ll)


def test_a_gpu_cell_sent_behind_completions_runs_and_torch_stays_out_of_the_kernel(pair):
    ll = pair.ll
    # As JupyterLab does while the user types `torch.a...` and then presses Run: completions, then the cell.
    ids = [ll.kc.complete(c, len(c)) for c in ("import torch\ntorch.a", "import torch\ntorch.ar",
                                                "from torch import ar")]
    run = send_execute(ll, GPU_CELL)
    for i in ids:
        assert ll.reply(i, timeout=GPU_TIMEOUT)["content"]["status"] == "ok"
    reply = ll.reply(run, timeout=GPU_TIMEOUT)
    msgs = ll.iopub_until_idle(run, GPU_TIMEOUT)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert ll_md(reply).get("route") == "gpu"
    assert "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream") == "2.0\n"
    assert not torch_in_kernel(ll)
    # Completion of `torch.` in a draft that imports nothing new, after the GPU cell bound torch: still the
    # names, still not imported here.
    got = complete(ll, "torch.ar")
    assert "arange" in got["matches"], got
    assert not torch_in_kernel(ll)

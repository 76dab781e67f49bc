"""GPU cells as responsive as CPU cells, compared with ipykernel (issue 13, items 5, 6 and 7):

- completion and inspection see variables that GPU cells made or changed (`t.resha<Tab>`), as do %who and
  %whos;
- a GPU cell's flushed output reaches the frontend while the cell still runs (no second coalescing in the
  kernel);
- a CPU cell after GPU cells pays only for its own closure: the kernel does not import torch to apply the
  session's torch generator state or to file a GPU cell's result in the output history (that happens in idle
  time, or before a cell that reads the history), and the history stays as ipykernel keeps it.

Latency itself is measured by `make bench` (tests/bench/bench_responsive.py), not here.
"""
import os
import tempfile
import time

import pytest

from routehelp import Kernel, execute, ll_md, run_route, send_execute, stream_text

GPU, CPU = "gpu", "cpu"


@pytest.fixture(scope="module")
def fresh(jupyter_env):
    """A looseleaf kernel of this module's own, that no other test gave torch, and without the idle commit
    (which files a GPU cell's result in the output history in idle time, importing torch for a tensor: what a
    CPU cell does not wait for, but what would make the check below depend on timing)."""
    k = Kernel("looseleaf", env={"LOOSELEAF_IDLE_COMMIT_MS": "0"})
    yield k
    k.stop()


def _request(k, msg_type, content):
    msg = k.kc.session.msg(msg_type, content)
    k.kc.shell_channel.send(msg)
    return k.reply(msg["header"]["msg_id"])["content"]


def test_a_cpu_cell_after_a_gpu_cell_does_not_import_torch_in_the_kernel(fresh, ref):
    seed = "import torch\ntorch.manual_seed(3)\nr_t = torch.rand(2)\nr_t * 2"
    run_route(fresh, seed, GPU)
    execute(ref, seed)
    _, msgs = run_route(fresh, "import sys\nprint('torch' in sys.modules)", CPU)
    assert stream_text(msgs) == "False\n"
    # torch's state waited: imported now, its generator continues the session's, as in one process.
    draw = "import torch\nprint(torch.rand(3))"
    _, mine = run_route(fresh, "%%cpu\n" + draw, CPU)
    _, theirs = execute(ref, draw)
    assert stream_text(mine) == stream_text(theirs)


def test_output_history_of_gpu_cells_is_ipykernels(pair):
    pair.cells([
        ("import torch\nho_t = torch.ones(2)\nho_t * 3", GPU),
        ("7", CPU),
        ("ho_t.sum()", GPU),
        ("8", CPU),
        ("print(_, __, ___)", CPU),
    ])
    for k in (pair.ll, pair.ref):
        _, msgs = execute(k, "print([type(v).__name__ for v in Out.values()][-4:])")
        assert stream_text(msgs) == "['Tensor', 'int', 'Tensor', 'int']\n", (k.name, stream_text(msgs))


def test_completion_and_inspection_see_a_gpu_made_tensor(pair):
    run_route(pair.ll, "import torch\ncomp_t = torch.zeros(2, 3)", GPU)
    execute(pair.ref, "import torch\ncomp_t = torch.zeros(2, 3)")
    content = {"code": "comp_t.resha", "cursor_pos": 12}
    mine, theirs = _request(pair.ll, "complete_request", content), _request(pair.ref, "complete_request", content)
    assert {"comp_t.reshape", "comp_t.reshape_as"} <= set(mine["matches"]) or \
        {"reshape", "reshape_as"} <= set(mine["matches"]), mine["matches"]
    assert mine["matches"] == theirs["matches"]
    assert (mine["cursor_start"], mine["cursor_end"]) == (theirs["cursor_start"], theirs["cursor_end"])
    content = {"code": "comp_t.reshape", "cursor_pos": 14, "detail_level": 0}
    mine, theirs = _request(pair.ll, "inspect_request", content), _request(pair.ref, "inspect_request", content)
    assert mine["found"] and theirs["found"]
    assert mine["data"]["text/plain"] == theirs["data"]["text/plain"]


@pytest.fixture(scope="module")
def bare(jupyter_env):
    """A looseleaf kernel of this module's own that never imports torch itself (no idle commit either)."""
    k = Kernel("looseleaf", env={"LOOSELEAF_IDLE_COMMIT_MS": "0"})
    yield k
    k.stop()


def test_completion_on_gpu_values_does_not_wait_for_their_framework(bare, ref):
    """`t.resha<Tab>` on a tensor a GPU cell made is answered from its worker's account of it (type and dir())
    while restoring it would import torch into the kernel (0.5 s and more; JupyterLab drops completion
    replies slower than 1 s): ipykernel's matches, torch still not imported.  The same for an instance of a
    cell's class that holds a tensor.  A CPU cell reading them then gets the values themselves."""
    cell = ("import torch\nsc_t = torch.zeros(2, 3)\nclass SC:\n    def __init__(self):\n"
            "        self.weight = torch.ones(1)\nsc_o = SC()")
    run_route(bare, cell, GPU)
    execute(ref, cell)
    for code in ("sc_t.resha", "sc_o.wei"):
        content = {"code": code, "cursor_pos": len(code)}
        mine, theirs = _request(bare, "complete_request", content), _request(ref, "complete_request", content)
        assert mine["matches"] and mine["matches"] == theirs["matches"], (mine["matches"], theirs["matches"])
        assert (mine["cursor_start"], mine["cursor_end"]) == (theirs["cursor_start"], theirs["cursor_end"])
    _, msgs = run_route(bare, "import sys\nprint('torch' in sys.modules)", CPU)
    assert stream_text(msgs) == "False\n"
    read = "print(sc_t.shape, sc_o.weight, type(sc_o).__name__)"
    _, mine = run_route(bare, "%%cpu\n" + read, CPU)
    _, theirs = execute(ref, read)
    assert stream_text(mine) == stream_text(theirs)


def test_gpu_cells_have_the_threads_of_a_process_of_their_own(pair):
    """The zygotes run their libraries on one thread; a worker gives torch back the thread count a process of
    the session's own has (ipykernel's), on its first cell and on later ones as a warm worker (which skips
    looking again while nothing changed)."""
    pair.cells([
        ("import torch\nprint(torch.get_num_threads())", GPU),
        ("th_t = torch.ones(3)\nprint(torch.get_num_threads(), th_t.sum())", GPU),
        ("import numpy as np\nth_a = np.ones((64, 64)) @ np.ones((64, 64))\n"
         "print(torch.get_num_threads(), th_a[0, 0])", GPU),
    ])


def test_who_and_whos_list_gpu_made_variables(pair):
    pair.cells([
        ("import torch\nwho_a = torch.ones(1)\nwho_b = 5j", GPU),
        ("%who complex", None),
        ("%who_ls complex", None),
    ])


def test_a_gpu_cells_flushed_output_arrives_while_it_runs(ll):
    """The cell prints, then waits for a file that the test creates only once that print has reached it: the
    cell can end only if its first line was relayed while it ran."""
    flag = os.path.join(tempfile.mkdtemp(prefix="ll-flush-"), "seen")
    code = ("import os, time, torch\nprint('first', flush=True)\n_ = torch.zeros(1)\n"
            "deadline = time.monotonic() + 60\n"
            "while not os.path.exists(%r) and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
            "print('found' if os.path.exists(%r) else 'timed out')" % (flag, flag))
    msg_id = send_execute(ll, code)
    seen = []

    def on_msg(msg):
        if msg["msg_type"] == "stream" and "first" in msg["content"]["text"] and not seen:
            seen.append(time.monotonic())
            open(flag, "w").close()

    msgs = ll.iopub_until_idle(msg_id, 120, on_msg=on_msg)
    reply = ll.reply(msg_id, timeout=120)
    assert ll_md(reply)["route"] == GPU
    assert seen and stream_text(msgs) == "first\nfound\n"

"""Variables made where the analysis cannot see them move between processes like any other (issue 23, part 3,
item 3): `exec`, `%run`, `globals()[...] = `, `globals().update(...)` and `setattr(sys.modules['__main__'],
...)`, in a CPU cell or a GPU cell, then read by a cell on the other side, cell by cell against ipykernel.

The static analysis does not know such a name, so no closure would name it: the kernel and the worker diff the
namespace after every cell and the session learns what the cell bound (and what it deleted) from that diff.
The module runs twice, "cold" (every GPU cell a fresh worker restoring from the store: what a warm worker's
eviction leaves) and "warm".  Many names made at once: tests/faults/test_fault_names.py.
"""
import os
import tempfile

from routehelp import cold_warm_fixtures, execute, ll_md, run_route, stream_text

GPU, CPU = "gpu", "cpu"

pool_mode, ll, ref = cold_warm_fixtures("dyn-")


def test_exec_in_a_cpu_cell_reaches_gpu_cells(pair):
    pair.cells([
        ("import torch\nexec('dy_acc = 0.93')", None),
        ("print(torch.tensor([dy_acc]) * 2)", GPU),
        ("dy_acc", CPU),
    ])


def test_exec_in_a_gpu_cell_reaches_cpu_cells_and_later_workers(pair):
    pair.cells([
        ("import torch\nexec('dy_g = torch.arange(3.)')\nexec('dy_n = 5')\nprint(dy_g.sum())", GPU),
        ("print(dy_n + 1, dy_g.tolist())", None),
        ("print(dy_g * dy_n)", GPU),
    ])


def test_globals_item_and_update(pair):
    pair.cells([
        ("import torch\nglobals()['dy_a'] = 1", None),
        ("print(torch.ones(2) * dy_a)\nglobals().update(dy_b=2, dy_c=torch.zeros(2))", GPU),
        ("print(dy_a, dy_b, dy_c)", None),
        ("print(dy_c + dy_b + dy_a)", GPU),
    ])


def test_setattr_on_main(pair):
    pair.cells([
        ("import sys, torch\nsetattr(sys.modules['__main__'], 'dy_s', 7)", CPU),
        ("print(torch.tensor(dy_s))\nsetattr(sys.modules['__main__'], 'dy_w', torch.ones(1) * 3)", GPU),
        ("print(dy_s, dy_w)", None),
    ])


def test_run_a_script(pair):
    d = tempfile.mkdtemp(prefix="dyn-run-")
    path = os.path.join(d, "setup_dy.py")
    with open(path, "w") as f:
        f.write("dy_run_v = 11\n\ndef dy_run_f():\n    return dy_run_v * 2\n")
    pair.cells([
        ("%run " + path, None),
        ("import torch\nprint(torch.tensor(dy_run_f()), dy_run_v)", GPU),
        ("dy_run_v = 12", CPU),
        ("print(torch.tensor(dy_run_f()))", GPU),
    ])


def test_dynamic_deletion(pair):
    pair.cells([
        ("import torch\ndy_del = torch.ones(1)\nprint(dy_del)", GPU),
        ("del globals()['dy_del']", None),
        ("print(torch.ones(1))\nprint(dy_del)", GPU),
        ("exec('dy_del2 = 3')", GPU),
        ("exec('del dy_del2')", GPU),
        ("print(dy_del2)", None),
    ])


def test_a_name_the_store_lists_is_restorable(pair):
    pair.cells([
        ("import torch\nexec('dy_listed = torch.full((2,), 4.)')", GPU),
        ("print(torch.tensor(1.))", GPU),
    ])
    _, msgs = execute(pair.ll, "%looseleaf")
    assert "dy_listed" in stream_text(msgs)
    pair.cells([("print(dy_listed * 2)", GPU), ("print(dy_listed)", None)])
    # In the kernel too (the kernel's namespace never held it: a worker made it).
    _, msgs = run_route(pair.ll, "%%cpu\nprint(dy_listed)", CPU)
    assert stream_text(msgs) == "tensor([4., 4.])\n"

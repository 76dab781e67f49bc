"""A GPU cell streams exactly like a CPU cell: the worker coalesces its output with the kernel's own stream code
(base/ll_stream), so text written by print(), by C code or by a child process to fd 1 reaches the frontend with
the same characters whichever route the cell took, also when pipe reads cut a multi-byte character in two and
the text is far beyond one coalesced chunk (64 KiB in the worker).  Compared with ipykernel cell by cell where
ipykernel can take the output, else with the same text on LooseLeaf's CPU route.
"""
from routehelp import run_route, stream_text

# 3-byte characters: a 64 KiB pipe read (or any power of two) always ends inside one of them somewhere.
EURO = "\u20ac" * 100000
WIDE = "\u00e9\u4e2d\U0001f600" * 30000 + "\n"


def test_gpu_cell_fd_output_beyond_64_kib_keeps_every_character(pair):
    # (ipykernel 6.17 hangs on a write this big to its captured fd 1: compared with our CPU route instead)
    write = "import os\nos.write(1, ('\\u20ac' * 100000 + '\\n').encode())\n"
    _, gpu = run_route(pair.ll, "import torch\n_ = torch.zeros(1)\n" + write, "gpu")
    _, cpu = run_route(pair.ll, write, "cpu")
    assert stream_text(gpu) == stream_text(cpu) == EURO + "\n"


def test_gpu_cell_print_of_mixed_width_text_matches_ipykernel(pair):
    code = ("import torch\n_ = torch.zeros(1)\n"
            "print('\\u00e9\\u4e2d\\U0001f600' * 30000)\n")
    reply, msgs = run_route(pair.ll, code, "gpu")
    assert stream_text(msgs) == WIDE
    pair.cell(code, "gpu")


def test_child_process_output_on_a_gpu_cell_matches_a_cpu_cell(pair):
    shell = "import subprocess\n_ = subprocess.run(['printf', '%s\\n', '\\u20ac' * 40000])\n"
    _, cpu = run_route(pair.ll, shell, "cpu")
    _, gpu = run_route(pair.ll, "import torch\n_ = torch.zeros(1)\n" + shell, "gpu")
    assert stream_text(gpu) == stream_text(cpu) == "\u20ac" * 40000 + "\n"

"""Progress bars look native (issue 29, item 2): libraries that draw a widget in a notebook kernel and text in a
terminal decide which by asking the shell, and LooseLeaf's shell must answer as ipykernel's does, in the kernel
(CPU cells) and in workers (GPU cells).

What they ask: tqdm >= 4.68 (tqdm.auto) whether `ipykernel.zmqshell` is in sys.modules, older tqdm and
transformers whether `'IPKernelApp' in get_ipython().config`, rich and pandas the shell's class name, plotly and
others whether `ipykernel` is loaded.  The probe cell checks each of those against ipykernel's answers; the
tqdm and rich cells compare the kinds of messages a frontend gets (a widget bar is a display_data of
application/vnd.jupyter.widget-view+json, a text bar is a stream on stderr).  tqdm and rich are not in the
project's requirements: those cells skip without them, the probe does not.
"""
import importlib.util

import pytest

from routehelp import execute, ll_md

GPU = "import torch\n_ = torch.zeros(1)\n"

PROBE = ("import sys\n"
         "print(sorted(m for m in ('ipykernel', 'ipykernel.zmqshell') if m in sys.modules),\n"
         "      'IPKernelApp' in get_ipython().config, type(get_ipython()).__name__)\n")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def kinds(msgs):
    """What a frontend shows of a cell, by kind: ordered distinct (msg_type, detail) pairs, where detail is a
    stream's name or the sorted mime types of a display, and comm messages only by type (their number
    depends on the library's update rate)."""
    out = []
    for m in msgs:
        t, c = m["msg_type"], m["content"]
        if t == "status" or t == "execute_input":
            continue
        if t == "stream":
            k = (t, c["name"])
        elif t in ("display_data", "update_display_data", "execute_result"):
            k = (t, tuple(sorted(c.get("data", {}))))
        else:
            k = (t, "")
        if k not in out:
            out.append(k)
    return out


def run_both(pair, code, route):
    """Run CODE on ipykernel and on LooseLeaf (asserting ROUTE there); returns (looseleaf msgs, ipykernel's)."""
    r_ref, m_ref = execute(pair.ref, code)
    assert r_ref["content"]["status"] == "ok", r_ref["content"]
    r_ll, m_ll = execute(pair.ll, code)
    assert r_ll["content"]["status"] == "ok", (r_ll["content"], m_ll)
    assert ll_md(r_ll).get("route") == route, ll_md(r_ll)
    return m_ll, m_ref


@pytest.mark.parametrize("route", ["cpu", "gpu"])
def test_shell_answers_notebook_probes_as_ipykernel(pair, route):
    prefix = GPU if route == "gpu" else ""
    pair.cell(prefix + PROBE, route)
    # Not vacuous: ipykernel's answer is the one every library above takes for "in a notebook".
    _, msgs = execute(pair.ref, PROBE)
    text = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    assert text == "['ipykernel', 'ipykernel.zmqshell'] True ZMQInteractiveShell\n"


def test_ipykernel_modules_import_for_real_when_used(pair):
    # Present in sys.modules before any use, yet a library that uses them gets the real ones.
    pair.cell("from ipykernel.zmqshell import ZMQInteractiveShell\nimport ipykernel, ipykernel.comm\n"
              "print(ZMQInteractiveShell.__module__, bool(ipykernel.__version__), ipykernel.comm.Comm.__name__)\n",
              "cpu")


def test_ipykernel_modules_cost_nothing_until_used(pair):
    # Their real import (~85 ms: jupyter_client, pyzmq, tornado) happens only when code uses them, not when
    # a traceback (inspect.getmodule) or the kernel's scans walk sys.modules.  On a kernel of its own: the
    # other tests import ipykernel for real.
    from itest_util import Kernel
    k = Kernel("looseleaf")
    try:
        for code in ("1/0", GPU + "t = torch.ones(2)", "print(t.sum().item())"):
            execute(k, code)
        reply, msgs = execute(k, "import sys\n"
                                 "print('ipykernel.zmqshell' in sys.modules, 'jupyter_client' in sys.modules)")
        assert "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream") == "True False\n"
    finally:
        k.stop()


def _have(mod):
    return importlib.util.find_spec(mod) is not None


TQDM_AUTO = "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass\n"
TQDM_NOTEBOOK = "from tqdm.notebook import tqdm as tqdm_nb\nfor _ in tqdm_nb(range(3)):\n    pass\n"
RICH = ("from rich.progress import Progress\n"
        "with Progress() as p:\n"
        "    t = p.add_task('work', total=3)\n"
        "    for _ in range(3):\n"
        "        p.advance(t)\n")


@pytest.mark.skipif(not _have("tqdm"), reason="tqdm is not installed (not in requirements.txt)")
@pytest.mark.parametrize("route", ["cpu", "gpu"])
@pytest.mark.parametrize("code", [TQDM_AUTO, TQDM_NOTEBOOK], ids=["auto", "notebook"])
def test_tqdm_draws_the_widget_bar(pair, route, code):
    m_ll, m_ref = run_both(pair, (GPU if route == "gpu" else "") + code, route)
    assert ("display_data", (WIDGET_VIEW, "text/plain")) in kinds(m_ref)
    assert kinds(m_ll) == kinds(m_ref)


@pytest.mark.skipif(not _have("rich") or not _have("ipywidgets"), reason="rich is not installed")
@pytest.mark.parametrize("route", ["cpu", "gpu"])
def test_rich_progress_displays_as_on_ipykernel(pair, route):
    m_ll, m_ref = run_both(pair, (GPU if route == "gpu" else "") + RICH, route)
    assert ("stream", "stderr") not in kinds(m_ref)
    assert kinds(m_ll) == kinds(m_ref)

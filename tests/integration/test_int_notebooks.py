"""Every notebook in examples/ executed by nbclient on the kernel under test
and on ipykernel: the text outputs of every cell must match.

Each notebook runs in a temp directory of its own (some write files), with
errors allowed (notebooks may fail on purpose; the errors are compared too).
"""
import glob
import os
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

from itest_util import REPO, kernel_env, norm_text, norm_varying, skip_slow_on_reference

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "examples", "*.ipynb")))
CELL_TIMEOUT = 300

# Mime types compared by content.  Images are compared by presence only: the
# text/plain beside each (e.g. "<Figure size 640x480 with 1 Axes>") already
# says what was drawn, and PNG bytes are not a kernel property.
TEXT_MIMES = ("text/plain", "text/html", "text/markdown", "text/latex", "application/json")


def _norm(text):
    """TEXT with what differs between any two runs normalised: itest_util.norm_text (addresses, prompt
    numbers, cell file names), then itest_util.VARYING (timings, file times, display ids)."""
    return norm_varying(norm_text(text))


def normalized_outputs(nb):
    """Per code cell: execution_count and its outputs in comparable form."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for o in cell.outputs:
            t = o.output_type
            if t == "stream" and o.name == "stderr" and "LooseLeaf: " in o.text:
                # LooseLeaf's one-line notices (a GPU cell that runs in the kernel, a slot wait) are its
                # documented addition to a cell's output, not a difference in what the cell did.
                o.text = "".join(l for l in o.text.splitlines(True) if not l.startswith("LooseLeaf: "))
                if not o.text:
                    continue
            if t == "stream":
                # How text is cut into stream messages depends on timing.
                if outs and outs[-1][0] == "stream" and outs[-1][1] == o.name:
                    outs[-1][2] += o.text
                else:
                    outs.append(["stream", o.name, o.text])
            elif t in ("execute_result", "display_data"):
                data = {k: (_norm(v) if isinstance(v, str) else v) if k in TEXT_MIMES else "<%s>" % k
                        for k, v in o.data.items()}
                outs.append([t, data])
            elif t == "error":
                outs.append([t, o.ename, _norm(o.evalue), [_norm(line) for line in o.traceback]])
            else:
                outs.append([t])
        cells.append([cell.execution_count] +
                     [[o[0], o[1], _norm(o[2])] if o[0] == "stream" else o for o in _by_stream(outs)])
    return cells


def _by_stream(outs):
    """OUTS with each run of stream outputs (between other outputs) as its stdout then its stderr: how the
    text of the two streams interleaves within a run depends on when each was flushed (ipykernel flushes
    each stream on its own), not on what the cell did."""
    out, run = [], []
    for o in outs + [None]:
        if o is not None and o[0] == "stream":
            run.append(o)
            continue
        for name in ("stdout", "stderr"):
            text = "".join(r[2] for r in run if r[1] == name)
            if text:
                out.append(["stream", name, text])
        run = []
        if o is not None:
            out.append(o)
    return out


def run_notebook(path, kernel_name, workdir):
    """Execute a copy of PATH in WORKDIR on KERNEL_NAME; returns the notebook."""
    os.makedirs(workdir, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=CELL_TIMEOUT, allow_errors=True,
                            resources={"metadata": {"path": workdir}})
    client.execute(env=kernel_env())
    return nb


# The reference outputs, computed once per notebook for the whole run.
_REFERENCE = {}


def reference_outputs(path, tmp_root):
    if path not in _REFERENCE:
        nb = run_notebook(path, "python3", os.path.join(tmp_root, "ref-" + os.path.basename(path)))
        _REFERENCE[path] = normalized_outputs(nb)
    return _REFERENCE[path]


def test_example_dependencies_installed():
    """The notebooks import these; without them both kernels would fail the
    same cells alike and the comparison would prove little.  (Debian
    packages: python3-scipy, python3-pandas, python3-matplotlib, python3-torch.)"""
    import importlib
    missing = []
    for mod in ("numpy", "scipy", "pandas", "matplotlib", "torch"):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    assert not missing, "examples need %s installed (make deps-test)" % missing


def test_examples_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert len(names) >= 6, names
    with open(os.path.join(REPO, "examples", "SOURCES.md")) as f:
        sources = f.read()
    for name in names:
        assert name in sources, "%s has no entry in examples/SOURCES.md" % name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p)[:-6] for p in NOTEBOOKS])
def test_notebook_matches_ipykernel(kernel_name, jupyter_env, tmp_path_factory, path):
    skip_slow_on_reference(kernel_name)
    tmp_root = str(tmp_path_factory.getbasetemp())
    expected = reference_outputs(path, tmp_root)
    nb = run_notebook(path, kernel_name, str(tmp_path_factory.mktemp("nb-" + kernel_name)))
    got = normalized_outputs(nb)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, "code cell %d of %s differs" % (i, os.path.basename(path))
    # Something ran: at least one cell produced output.
    assert any(len(c) > 1 for c in got)

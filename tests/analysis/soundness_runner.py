"""Execute a notebook with IPython, each cell with the full namespace or with
only its computed closure; write every cell's outputs as JSON (issue 3's
soundness test; run by tests/analysis/test_analysis_soundness.py, one process per
run, in a fresh working directory).

    soundness_runner.py NOTEBOOK OUT.json full
    soundness_runner.py NOTEBOOK OUT.json closure ANALYSIS.json

In `closure` mode the namespace of one interpreter is narrowed around each
cell to what `looseleaf analyze --json` says the cell needs: its state
closure plus IPython's own names, then its import statements are executed.
Everything else is moved aside while the cell runs and put back after it
(unless the cell rebound the name).  Because the dict object stays the same,
functions and methods defined by earlier cells see the narrowed namespace
too, so a global their bodies read but the closure lacks raises NameError:
exactly the failure a fresh worker would hit.  Cells the analysis could not
parse run with the full namespace.

Runs under /usr/bin/python3.  time.sleep is a no-op (outputs do not depend
on it) and random, numpy and (when the notebook mentions it) torch are seeded
the same way in both modes.
"""
import ast
import json
import random
import re
import sys
import time


def bound_by(stmt):
    """Names an import statement binds (None for a star import)."""
    node = ast.parse(stmt).body[0]
    names = []
    for alias in node.names:
        if alias.name == "*":
            return None
        if isinstance(node, ast.Import) and not alias.asname:
            names.append(alias.name.split(".")[0])
        else:
            names.append(alias.asname or alias.name)
    return names


IPYTHON_NAME = re.compile(r"^(_+|_i+|_\d+|_i\d+|__.*__)$")


def normalise(text):
    text = re.sub(r"0x[0-9a-fA-F]+", "0xADDR", text)
    text = re.sub(r"[0-9a-f]{32}", "UUID", text)
    text = re.sub(r"^.*(Wall time|CPU times|per loop|loops each).*$", "TIMING",
                  text, flags=re.M)
    text = re.sub(r"[A-Z][a-z]{2} +\d+ +\d\d:\d\d", "DATE", text)
    return text


def main():
    nb_path, out_path, mode = sys.argv[1:4]
    analysis = None
    if mode == "closure":
        with open(sys.argv[4]) as f:
            analysis = json.load(f)["cells"]
    with open(nb_path) as f:
        nb = json.load(f)
    cells = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
               for c in cells]

    time.sleep = lambda *a, **k: None
    random.seed(0)
    try:
        import numpy
        numpy.random.seed(0)
    except ImportError:
        pass
    if any("torch" in s for s in sources):
        import torch
        torch.manual_seed(0)

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    class Shell(InteractiveShell):
        def enable_gui(self, gui=None):
            pass  # as ipykernel's shell: %matplotlib inline needs no event loop

    shell = Shell.instance(colors="NoColor")
    ns = shell.user_ns

    results = []
    for index, src in enumerate(sources):
        src = re.sub(r"\A\s*%%[gc]pu[ \t]*\n", "\n", src)  # ours, not IPython's
        hidden, reimported = {}, {}
        if analysis is not None and analysis[index]["facts"]["error"] is None:
            closure = analysis[index]["closure"]
            keep = set(closure["state_closure"]) | set(shell.user_ns_hidden)
            for name in list(ns):
                if name not in keep and not IPYTHON_NAME.match(name):
                    hidden[name] = ns.pop(name)
            for stmt in closure["import_statements"]:
                before = dict(ns)
                exec(stmt, ns)
                for name, value in ns.items():
                    if before.get(name, ns) is not value:
                        reimported[name] = value
        with capture_output() as cap:
            result = shell.run_cell(src, store_history=True)
        for name, value in hidden.items():
            if name not in ns or (name in reimported and ns[name] is reimported[name]):
                ns[name] = value
        error = result.error_in_exec or result.error_before_exec
        results.append({
            "stdout": normalise(cap.stdout),
            "stderr": normalise(cap.stderr),
            "outputs": [normalise(o.data.get("text/plain", "")) for o in cap.outputs],
            "error": None if error is None else f"{type(error).__name__}: {error}",
        })
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""measure_notebook: run a notebook's code cells once and measure what the fleet simulator needs from it.

Started by `looseleaf trace` (sim/ll_trace_gen.c), which caches the answer per notebook content; not meant to be
run by hand (but it can be: `/usr/bin/python3 sim/measure_notebook.py [--imports a,b] NOTEBOOK.ipynb`).

Runs every code cell in order in one IPython shell in this process (in a scratch directory linking to what is
beside the notebook, so it finds its data files and what it writes goes away; matplotlib on the Agg backend; a
per-cell time limit), as a user running the notebook top to bottom would, and prints one JSON object:

  cells     per code cell, in order: exec_s (wall time of the cell, its packages already imported: the
            packages named by --imports are imported before the first cell, as a LooseLeaf worker finds them in
            its zygote; import times are import_s's), error (the exception's name, or null: the
            run goes on after an error, as "run all" with errors allowed would), vars (after the cell: payload
            bytes of every user variable)
  import_s  for each package named by --imports, the seconds `import PKG` takes in a fresh interpreter

A variable's bytes are what LooseLeaf's store would hold for it: the buffer of a numpy array, the storage of a
torch tensor, the parameters and buffers of a torch module, and for anything else the length of its pickle
(protocol 5; the size of the object when it does not pickle).  Tensors or arrays shared between variables are
counted in each (closures are summed per variable, as the store restores them).
"""
import argparse
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = {"In", "Out", "exit", "quit", "get_ipython", "_oh", "_ih", "_dh", "_", "__", "___"}


class CellTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CellTimeout()


def nbytes(v, depth=0):
    """Payload bytes of V as the store would hold them (see the module's docstring)."""
    mod = type(v).__module__ or ""
    try:
        if mod.startswith("numpy") and hasattr(v, "nbytes"):
            return int(v.nbytes)
        if mod.startswith("torch"):
            import torch
            if isinstance(v, torch.Tensor):
                try:
                    return int(v.untyped_storage().nbytes())
                except Exception:  # noqa: BLE001 - older torch
                    return int(v.element_size() * v.nelement())
            if isinstance(v, torch.nn.Module):
                return sum(int(t.element_size() * t.nelement())
                           for t in list(v.parameters()) + list(v.buffers()))
            if isinstance(v, torch.optim.Optimizer):
                total = 0
                for st in v.state.values():
                    for t in st.values():
                        if isinstance(t, torch.Tensor):
                            total += int(t.element_size() * t.nelement())
                return total + 256
        if isinstance(v, (list, tuple)) and depth < 2 and len(v) < 10000:
            return 64 + sum(nbytes(x, depth + 1) for x in v)
        if isinstance(v, dict) and depth < 2 and len(v) < 10000:
            return 64 + sum(nbytes(x, depth + 1) for x in v.values())
        return len(pickle.dumps(v, protocol=5))
    except Exception:  # noqa: BLE001 - anything that does not pickle
        return sys.getsizeof(v)


def user_vars(ns):
    import types
    out = {}
    for k, v in list(ns.items()):
        if k.startswith("_") or k in SKIP:
            continue
        if isinstance(v, (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType)):
            continue
        out[k] = nbytes(v)
    return out


def import_time(pkg, timeout):
    code = "import time; t = time.perf_counter(); import %s; print(time.perf_counter() - t)" % pkg
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    except Exception:  # noqa: BLE001 - not installed, or too slow
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("notebook")
    ap.add_argument("--imports", default="")
    ap.add_argument("--cell-timeout", type=float, default=60.0)
    args = ap.parse_args()
    with open(args.notebook, encoding="utf-8") as f:
        nb = json.load(f)
    os.environ["MPLBACKEND"] = "Agg"
    nbdir = os.path.dirname(os.path.abspath(args.notebook))
    # The answer goes to the original stdout; what cells write to fds 1 and 2 (`!cmd`, C code) goes nowhere.
    real_stdout = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    # The notebook runs in a scratch directory that links to everything beside it: it reads its data files,
    # and what it writes (models, logs) goes away with the scratch directory, not into the user's tree.
    scratch = tempfile.mkdtemp(prefix="ll-measure-")
    for name in os.listdir(nbdir):
        os.symlink(os.path.join(nbdir, name), os.path.join(scratch, name))
    os.chdir(scratch)
    signal.signal(signal.SIGALRM, _alarm)
    packages = [p for p in args.imports.split(",") if p]
    for pkg in packages:  # imported up front: a cell's time is its own work, not its imports
        shell.run_cell("import %s" % pkg, store_history=False, silent=True)
    for pkg in packages:  # (not as user variables)
        shell.user_ns.pop(pkg.split(".")[0], None)
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        err = None
        sys.stdout = io.StringIO()  # the cell's output is not ours to print
        sys.stderr, real_stderr = io.StringIO(), sys.stderr
        t0 = time.perf_counter()
        try:
            signal.setitimer(signal.ITIMER_REAL, args.cell_timeout)
            r = shell.run_cell(src, store_history=True, silent=False)
            signal.setitimer(signal.ITIMER_REAL, 0)
            if r.error_in_exec is not None:
                err = type(r.error_in_exec).__name__
            elif r.error_before_exec is not None:
                err = type(r.error_before_exec).__name__
        except CellTimeout:
            err = "Timeout"
        except BaseException as e:  # noqa: BLE001 - SystemExit and friends: the run goes on
            signal.setitimer(signal.ITIMER_REAL, 0)
            err = type(e).__name__
        dt = time.perf_counter() - t0
        sys.stdout, sys.stderr = real_stdout, real_stderr
        cells.append({"exec_s": dt, "error": err, "vars": user_vars(shell.user_ns)})
    imports = {}
    for pkg in packages:
        t = import_time(pkg, 120)
        if t is not None:
            imports[pkg] = t
    json.dump({"notebook": args.notebook, "python": sys.version.split()[0], "cells": cells,
               "import_s": imports}, real_stdout)
    real_stdout.write("\n")
    real_stdout.flush()
    shutil.rmtree(scratch, ignore_errors=True)
    os._exit(0)  # the notebook's threads and atexit handlers are not ours to wait for


if __name__ == "__main__":
    main()

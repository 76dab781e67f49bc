"""What zygotes and workers do in Python (called by zygote/ll_zygote.c with JSON text, returning JSON text).

Zygote (single-threaded, never touches CUDA):
  load_head(mods)   import the head, make torch single-threaded (MEASURED.md: a zygote that ran a 2-thread
                    OpenMP op makes its children hang), stop IPython's history thread (a zygote must stay
                    single-threaded), freeze the GC.
  grow(mods)        in a freshly forked child node: import more.
  prefork()         gc.freeze() right before each fork (the child's GC would touch every page otherwise).
Worker (after the fork, in the child):
  worker_prepare(job)  CUDA on the assigned device, the rest of the import closure, the import statements
                       that re-create import-bound names, restore of the state closure and of the process
                       state from the store.
  worker_finish(job)   save the cell's definitions, the state closure (in-place mutation is invisible to
                       static analysis), whatever the cell rebound or deleted, and the process state; one
                       commit.
"""
import gc
import importlib
import json
import os
import sys
import time

from . import procstate

_orig_threads = None     # torch's intra-op threads before the zygote set 1 (workers restore it)
_cp = None               # the worker's Checkpointer
_store = None            # the worker's _llstore.Store
_before = None           # {name: id(value)} of the namespace after restore
_hidden_extra = {"_", "__", "___", "_i", "_ii", "_iii", "In", "Out", "_oh", "_ih", "_dh", "exit", "quit",
                 "get_ipython", procstate.NAME}


def _import(mods):
    loaded, failed = [], {}
    for m in mods:
        try:
            importlib.import_module(m)
            loaded.append(m)
        except BaseException as e:  # noqa: BLE001 - a broken package must not kill the zygote
            failed[m] = "%s: %s" % (type(e).__name__, e)
    return loaded, failed


def _calm_torch():
    global _orig_threads
    torch = sys.modules.get("torch")
    if torch is not None:
        if _orig_threads is None:
            _orig_threads = torch.get_num_threads()
        torch.set_num_threads(1)


def _stop_history_thread():
    from looseleaf_kernel import get_kernel
    k = get_kernel()
    hm = getattr(getattr(k, "shell", None), "history_manager", None)
    t = getattr(hm, "save_thread", None)
    if t is not None:
        t.stop()
        hm.save_thread = None


def _modules_now(asked):
    tops = {name.split(".")[0] for name in sys.modules if not name.startswith("_")}
    return sorted(tops | set(asked))


def load_head(arg):
    mods = json.loads(arg)
    loaded, failed = _import(mods)
    _calm_torch()
    _stop_history_thread()
    gc.collect()
    gc.freeze()
    return json.dumps({"modules": _modules_now(loaded), "failed": failed})


def grow(arg):
    loaded, failed = _import(json.loads(arg))
    _calm_torch()
    gc.freeze()
    return json.dumps({"modules": _modules_now(loaded), "failed": failed})


def prefork(arg):
    gc.freeze()
    return "null"


def _shell():
    from looseleaf_kernel import get_kernel
    return get_kernel().shell


def _visible(shell):
    hidden = set(getattr(shell, "user_ns_hidden", {})) | _hidden_extra
    out = {}
    for k, v in shell.user_ns.items():
        if k in hidden or k.startswith("__") or (k.startswith("_i") and k[2:].isdigit()) or \
                (k.startswith("_") and k[1:].isdigit()):
            continue
        out[k] = id(v)
    return out


def _fault(job, stage):
    """Tests only: a job's "fault" names the stage at which the worker SIGKILLs itself."""
    if job.get("fault") == stage:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def _guard_interrupts(shell, fd):
    """An interrupt that reached the worker before the cell's code ran (ll_zygote.c leaves it in pipe FD)
    interrupts the cell at its start, as in ipykernel."""
    if fd is None:
        return
    run_cell = shell.run_cell

    def guarded(*a, **k):
        try:
            pending = os.read(fd, 64)
        except BlockingIOError:
            pending = b""
        if pending:
            raise KeyboardInterrupt()
        return run_cell(*a, **k)
    shell.run_cell = guarded


def worker_prepare(arg):
    global _cp, _store, _before
    job = json.loads(arg)
    t0 = time.perf_counter()
    rep = {"imported_after_fork": [], "device": job.get("device")}
    # 1. CUDA on the assigned device, only now (after the fork).
    dev = job.get("device")
    if dev is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(dev)
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                torch.cuda.init()
                torch.cuda.set_device(0)
            except Exception as e:  # noqa: BLE001 - reported; the cell then fails on its own CUDA use
                rep["cuda_error"] = "%s: %s" % (type(e).__name__, e)
    t1 = time.perf_counter()
    # 2. The rest of the import closure, and the names imports bind.
    torch = sys.modules.get("torch")
    if torch is not None and _orig_threads:
        torch.set_num_threads(_orig_threads)
    missing = [m for m in job.get("import_closure") or [] if m not in sys.modules]
    loaded, failed = _import(missing)
    rep["imported_after_fork"] = loaded
    if failed:
        rep["import_failed"] = failed
    shell = _shell()
    ns = shell.user_ns
    _guard_interrupts(shell, job.get("int_fd"))
    for stmt in job.get("import_stmts") or []:
        try:
            exec(compile(stmt, "<looseleaf import>", "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - the cell will raise the same error itself
            rep.setdefault("import_failed", {})[stmt] = "%s: %s" % (type(e).__name__, e)
    t2 = time.perf_counter()
    # 3. Restore the state closure and the process state.
    try:
        import _llstore
        from looseleaf_store import Checkpointer
        _store = _llstore.Store(job["store_dir"], job["session"], redis_url=job.get("redis_url") or None)
        _cp = Checkpointer(_store, ns)
        r = _cp.restore(list(job.get("state_closure") or []))
        prep, probs = procstate.restore(_cp)
        _fault(job, "restore")
    except Exception as e:  # noqa: BLE001 - becomes the cell's error reply
        return json.dumps({"fatal": "cannot restore the cell's variables: %s: %s" % (type(e).__name__, e)})
    failed = dict(r.failed, **prep.failed)
    if failed:
        return json.dumps({"fatal": "cannot restore %s" % "; ".join("%s: %s" % kv for kv in failed.items())})
    if probs:
        rep["procstate_problems"] = probs
    if isinstance(job.get("execution_count"), int):
        shell.execution_count = job["execution_count"]
    t3 = time.perf_counter()
    _before = _visible(shell)
    rep.update({
        "cuda_ms": (t1 - t0) * 1e3,
        "import_ms": (t2 - t1) * 1e3,
        "restore_ms": (t3 - t2) * 1e3,
        "bytes_restored": r.payload_bytes + prep.payload_bytes,
        "restored": sorted(n for n in r.restored if n != procstate.NAME),
        "missing": [n for n in r.missing if n != procstate.NAME],
    })
    rep["prep_ms"] = {"fork": job.get("fork_ms", 0.0), "import": rep["import_ms"] + rep["cuda_ms"],
                      "restore": rep["restore_ms"]}
    return json.dumps(rep)


def worker_finish(arg):
    job = json.loads(arg)
    t0 = time.perf_counter()
    shell = _shell()
    ns = shell.user_ns
    after = _visible(shell)
    names = set(job.get("defines") or []) | set(job.get("state_closure") or []) | set(job.get("deletes") or [])
    # What the cell rebound or deleted, whatever the analysis said (modules are re-imported, not saved).
    for k, ident in after.items():
        if _before.get(k) != ident and not isinstance(ns.get(k), type(sys)):
            names.add(k)
    names |= {k for k in _before if k not in after}
    names = {n for n in names if not isinstance(ns.get(n), type(sys))}
    if (job.get("fault") or "") == "save":
        # Die inside the commit: after the payloads went into the pool, just before Redis' EXEC.
        os.environ["LL_STORE_FAULT"] = "before_commit"
    rep = procstate.save_with(_cp, sorted(names), cell_id=str(job.get("id")))
    out = {
        "save_ms": (time.perf_counter() - t0) * 1e3,
        "bytes_saved": rep.bytes_written,
        "saved": sorted(n for n in rep.saved if n != procstate.NAME),
        "deleted": sorted(rep.deleted),
    }
    if rep.failed:
        out["save_failed"] = rep.failed
        sys.stderr.write("LooseLeaf: could not save %s\n" % ", ".join("%s (%s)" % kv for kv in rep.failed.items()))
    if rep.error:
        out["save_error"] = rep.error
        sys.stderr.write("LooseLeaf: the cell's variables were not saved: %s\n" % rep.error)
    try:
        _store.close()
    except Exception:  # noqa: BLE001
        pass
    return json.dumps(out)

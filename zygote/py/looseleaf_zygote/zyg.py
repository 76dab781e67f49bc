"""What zygotes and workers do in Python (called by zygote/ll_zygote.c with JSON text, returning JSON text).

Zygote (single-threaded, never touches CUDA):
  load_head(mods)   import the head, make torch single-threaded (MEASURED.md: a zygote that ran a 2-thread
                    OpenMP op makes its children hang), IPython's history in memory, without its thread (a
                    zygote must stay single-threaded; the kernel keeps the session's history), freeze the GC.
  grow(mods)        in a freshly forked child node: import more.
  prefork()         gc.freeze() right before each fork (the child's GC would touch every page otherwise).
Worker (after the fork, in the child; it stays warm for its session and prepares again for each job):
  worker_prepare(job)  the session's process state from the store first (its environment decides how CUDA
                       starts, its sys.path and cwd what imports find), then CUDA on the assigned device
                       (with the session's CUDA generator states), the rest of the import closure, the
                       import statements that re-create import-bound names, restore of the state closure.
                       A warm worker first drops every name whose held version is not the committed one
                       (the store is the truth: a CPU cell or another worker may have committed newer
                       versions, or deleted names), and what references them; the restore then loads only
                       what moved.  `state_all` (a cell too big to analyse ran in the session): every
                       committed variable is the closure.  Also a prefetch's whole work (no cell follows
                       at once).
  worker_finish(job)   save the cell's definitions, the state closure (in-place mutation is invisible to
                       static analysis), whatever the cell rebound or deleted, the user modules' globals
                       and the process state; one commit, all or nothing when the store fails (a full pool,
                       Redis unavailable, an interrupt): then `save_ename` / `save_error` say why and name
                       the variables, and the gateway makes the cell's reply that error.  The store stays
                       open: the worker stays warm.  A value that cannot be saved is committed as a HomeRef
                       (looseleaf_store.homes) and stays here: the worker is the session's home for it (and
                       for a value whose autograd graph the store cannot keep, and for what those share
                       objects with), reported as `home`, which keeps it warm and last in line for eviction.
                       First the device is checked (gpu.broken): after a sticky CUDA error nothing is saved
                       and the worker leaves (`device_broken`), its session goes on from the store.
A failed preparation answers {"fatal": why, "fatal_ename": ...}: "StoreUnavailable" when the store did not
answer, "KeyboardInterrupt" when an interrupt ended the wait (the gateway names the cell's error so).
  worker_exit(arg)     close the store (the worker leaves: evicted, idle, its client gone).
"""
import gc
import importlib
import json
import os
import sys
import time

from looseleaf_store import homes, procstate, usermods

from . import debug, gpu

_orig_threads = None     # torch's intra-op threads before the zygote set 1 (workers restore it)
_cp = None               # the worker's Checkpointer
_store = None            # the worker's _llstore.Store
_before = None           # {name: id(value)} of the namespace after restore
_store_key = None        # (store_dir, session, redis_url) _store was opened with
_orig_run_cell = None    # the shell's run_cell before _guard_interrupts wrapped it
# The session's home here (nothing a cell made is lost): values only this process holds, and what they share.
_token = None            # tells this worker from a later process with the same pid (HomeRef.token)
_home = {}               # name -> {"kind": "held" | "graph", "what": ...}: home values held here
_home_refs = {}          # name -> the HomeRef committed for it (the same object each save: an unchanged blob)
_tied = set()            # names of saved variables whose objects a home value reaches
_unsaved = {}            # name -> its committed version (None: none) when the store could not take its new
                         # value (a full pool, Redis gone): the value lives only here, a home value too
_threads_applied = None  # what _session_threads last applied the session's thread counts for
_notices = []            # lines for the next cell's stderr (a variable that lost its autograd graph)
_device_host = False     # a job of this worker said workers get devices here (a slot's, or staged to get one)


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


def _warm_torch():
    """torch >= 2 imports ~900 more modules (torch._dynamo, sympy, ...) the first time a process builds an
    optimizer: 1.3-1.5 s here, paid by every fresh worker's first `torch.optim.SGD(...)` cell.  Building a
    throwaway optimizer over a CPU parameter here does those imports once, for every worker forked below.  It
    starts no thread and asks no CUDA device count (torch 2.11, checked by hand); were that to change, the
    zygote's own checks before each fork (one thread, no CUDA driver mapped: ll_zygote.c) would refuse."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(_warm_torch, "done", False):
        return
    _warm_torch.done = True
    try:
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    except Exception:  # noqa: BLE001 - a torch without optimizers: workers import what they use themselves
        pass


def _openblas_libs():
    """The OpenBLAS libraries this process loaded (numpy's own, scipy's, the system one), as ctypes handles
    with their set/get functions, whatever the symbol prefix of the build."""
    import ctypes
    out, seen = [], set()
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return out
    for path in sorted(paths):
        if path in seen:
            continue
        seen.add(path)
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("", ""), ("scipy_", "64_"), ("scipy_", ""), ("", "64_")):
            setter = getattr(lib, prefix + "openblas_set_num_threads" + suffix, None)
            procs = getattr(lib, prefix + "openblas_get_num_procs" + suffix, None)
            if setter is not None and procs is not None:
                out.append((setter, procs))
                break
    return out


def _session_threads():
    """The thread counts the session would have in a process of its own: the zygote started its libraries
    single-threaded (ll_zygote.c); the session's environment (restored with its process state) says what
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS it wants, else each library's own default.  Done again only when
    that environment or the set of loaded modules changed since this process last did it: finding the
    libraries reads /proc/self/maps (1-1.5 ms), which a warm worker's every cell paid before its Run."""
    global _threads_applied
    env = os.environ
    key = (env.get("OPENBLAS_NUM_THREADS"), env.get("OMP_NUM_THREADS"), len(sys.modules))
    if key == _threads_applied:
        return
    _threads_applied = key
    for setter, procs in _openblas_libs():
        want = env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS")
        try:
            n = int(want) if want else int(procs())
            setter(max(1, n))
        except (ValueError, OSError):
            pass
    torch = sys.modules.get("torch")
    if torch is not None and _orig_threads:
        try:
            want = env.get("OMP_NUM_THREADS")
            torch.set_num_threads(max(1, int(want)) if want else _orig_threads)
        except ValueError:
            torch.set_num_threads(_orig_threads)


def _private_history():
    """The zygote's IPython (hence every worker's) keeps its input history in a database of its own, in memory:
    the kernel records every cell in the session's history database (coherence.after_gpu), and a worker writing
    there too would collide with it (the same session and line numbers: IPython then prints "ERROR!
    Session/line number was not unique" into the cell's output).  The history thread stops too: a zygote
    must stay single-threaded."""
    from looseleaf_kernel import get_kernel
    k = get_kernel()
    hm = getattr(getattr(k, "shell", None), "history_manager", None)
    if hm is None:
        return
    t = getattr(hm, "save_thread", None)
    if t is not None:
        t.stop()
        hm.save_thread = None
    try:
        hm.db.close()
    except Exception:  # noqa: BLE001 - a database that will not close is dropped anyway
        pass
    hm.hist_file = ":memory:"
    hm.init_db()
    hm.new_session()


def _modules_now(asked):
    tops = {name.split(".")[0] for name in sys.modules if not name.startswith("_")}
    return sorted(tops | set(asked))


def _no_cell_files():
    """Workers write the cells they compile only into a kernel's cell directory (worker_prepare, cells_dir),
    never into one of their own that nobody would remove."""
    shell_mod = sys.modules.get("looseleaf_kernel.shell")
    if shell_mod is not None:
        shell_mod.CellCompiler.stop_sharing()


def _index(loaded):
    """Write the completion index of the packages just imported (looseleaf_kernel.modindex): a kernel that
    has not imported them completes their names from it instead of importing them
    (importing torch there would take seconds and memory)."""
    try:
        from looseleaf_kernel import modindex
        modindex.write_for(sorted({m.split(".")[0] for m in loaded}), missing_only=True)
    except Exception:  # noqa: BLE001 - completion is then slower to know the names, nothing else
        pass


def load_head(arg):
    mods = json.loads(arg)
    loaded, failed = _import(mods)
    _calm_torch()
    _warm_torch()
    _private_history()
    _no_cell_files()
    usermods.user_modules()  # which modules are the user's, decided once here for every worker
    _index(loaded)
    gc.collect()
    gc.freeze()
    return json.dumps({"modules": _modules_now(loaded), "failed": failed})


def grow(arg):
    loaded, failed = _import(json.loads(arg))
    _calm_torch()
    _warm_torch()
    usermods.user_modules()
    _index(loaded)
    gc.freeze()
    return json.dumps({"modules": _modules_now(loaded), "failed": failed})


def prefork(arg):
    gc.freeze()
    return "null"


def _shell():
    from looseleaf_kernel import get_kernel
    return get_kernel().shell


def _visible(shell):
    """The session's variables and modules in the namespace (the kernel's rule: coherence.visible)."""
    from looseleaf_kernel.coherence import visible
    return visible(shell, modules=True)


def _fault(job, stage):
    """Tests only (the kernel passes a job's "fault" only under LOOSELEAF_TEST_FAULTS=1): "ACTION@STAGE"
    does ACTION when the worker reaches STAGE ("prepare": before the store is opened, "restore": after the
    restore, "save": before the save); a bare STAGE means kill.  Actions: kill (this worker), kill_once
    (this worker if it is the job's first), kill_zygote
    (its parent), kill_pool (the host pool), kill_kernel, interrupt (SIGINT to this worker), and on the
    session's redis-server kill_redis, stop_redis (SIGSTOP), wipe_redis (killed with its append-only
    file: it comes back empty)."""
    import signal
    fault = job.get("fault") or ""
    action, _, at = fault.rpartition("@")
    if at != stage:
        return
    action = action or "kill"

    def redis_pid():
        with open(os.path.join(job["store_dir"], "redis.pid")) as f:
            return int(f.read())

    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "kill_once":  # the first worker of the job only (the pool retries a restore once)
        mark = os.path.join(job["store_dir"], "fault-once-%s" % job.get("id"))
        if not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    elif action == "kill_zygote":
        os.kill(os.getppid(), signal.SIGKILL)
    elif action == "kill_pool":
        with open("/proc/%d/stat" % os.getppid()) as f:
            os.kill(int(f.read().rsplit(")", 1)[1].split()[1]), signal.SIGKILL)
    elif action == "kill_kernel" and isinstance(job.get("kernel_pid"), int):
        os.kill(job["kernel_pid"], signal.SIGKILL)
    elif action == "interrupt":
        os.kill(os.getpid(), signal.SIGINT)
    elif action in ("kill_redis", "stop_redis"):
        os.kill(redis_pid(), signal.SIGKILL if action == "kill_redis" else signal.SIGSTOP)
    elif action == "wipe_redis":
        import shutil
        pid = redis_pid()
        os.kill(pid, signal.SIGSTOP)
        shutil.rmtree(os.path.join(job["store_dir"], "redis-aof"), ignore_errors=True)
        os.kill(pid, signal.SIGKILL)


def _guard_interrupts(shell, fd, dbg=None):
    """An interrupt that reached the worker before the cell's code ran (ll_zygote.c leaves it in pipe FD)
    interrupts the cell at its start, as in ipykernel.  With DBG (the job's "debug": the session's debugger is
    on) the cell runs under the debugger (debug.py)."""
    global _orig_run_cell
    if fd is None and not dbg:
        return
    if _orig_run_cell is None:
        _orig_run_cell = shell.run_cell
    run_cell = _orig_run_cell

    def guarded(*a, **k):
        try:
            pending = os.read(fd, 64) if fd is not None else b""
        except BlockingIOError:
            pending = b""
        if pending:
            raise KeyboardInterrupt()
        while _notices:
            sys.stderr.write(_notices.pop(0))
        if not (dbg and debug.begin(dbg, shell)):
            return run_cell(*a, **k)
        try:
            return run_cell(*a, **k)
        finally:
            debug.end(shell)
    shell.run_cell = guarded


def _held_bytes():
    """Payload bytes of the variables this worker holds at their committed versions (GreedyDual's c)."""
    if _cp is None:
        return 0
    return sum(_payload_bytes(name) for name in _cp.held())


def _payload_bytes(name):
    """Payload bytes of NAME's version this worker holds (0 without a store or a version held)."""
    import _llstore
    total = 0
    for ref in _cp.payload_refs(name) if _cp is not None else ():
        try:
            total += _llstore.ref_nbytes(ref)
        except Exception:  # noqa: BLE001 - a ref we cannot size counts nothing
            pass
    return total


def _drop_stale(shell, vers):
    """A warm worker's namespace before its next job: keep only names held at their committed version (VERS,
    the store's versions) (and never what references a dropped one) and modules; every other name goes, so
    nothing stale can be read.  Returns the names dropped."""
    ns = shell.user_ns
    held = _cp.held()
    # Modules are no variables (never saved; import statements bind them): they stay.
    # (A value the store could not take stays while nothing newer was committed for its name.)
    drop = {n for n in _visible(shell) if (held.get(n) is None or vers.get(n) != held[n])
            and not isinstance(ns.get(n), type(sys)) and not (n in _unsaved and vers.get(n) == _unsaved[n])}
    grew = True
    while grew:
        grew = False
        for n in held:  # (held names are in the namespace)
            if n not in drop and set(_cp.references(n)) & drop:
                drop.add(n)
                grew = True
    for n in drop:
        ns.pop(n, None)
        _home.pop(n, None)
        _home_refs.pop(n, None)
        _unsaved.pop(n, None)
        _tied.discard(n)
    _cp.forget(sorted(drop))
    return sorted(drop)


def _forget_outputs(shell):
    """A warm worker's output cache (_, __, ___, _N, Out) holds results of its own earlier cells, which a cold
    worker would not have and which may be stale: drop it, as a cold worker starts."""
    ns = shell.user_ns
    for k in [k for k in ns if k.startswith("_") and k[1:].isdigit()]:
        del ns[k]
    for k in ("_", "__", "___"):
        if k in ns:
            ns[k] = ""
    dh = getattr(shell, "displayhook", None)
    for k in ("_", "__", "___"):
        if dh is not None and hasattr(dh, k):
            setattr(dh, k, "")
    oh = ns.get("_oh")
    if isinstance(oh, dict):
        oh.clear()


def _open_store(job):
    """The worker's store and Checkpointer, kept across the jobs of a warm worker."""
    global _cp, _store, _store_key
    key = (job["store_dir"], job["session"], job.get("redis_url") or None)
    if _cp is not None and _store_key == key:
        return False
    if _store is not None:
        # Another store (never expected: a warm worker serves one session): start from an empty namespace.
        ns = _shell().user_ns
        for n in _visible(_shell()):
            ns.pop(n, None)
        try:
            _store.close()
        except Exception:  # noqa: BLE001
            pass
    import _llstore
    from looseleaf_store import Checkpointer
    # No prefaulted reserve in workers: a warm worker holding a big model would keep as much again of pool
    # memory backed for its next save; the kernel's Store keeps the session's reserve.
    _store = _llstore.Store(key[0], key[1], redis_url=key[2], reserve_bytes=0)
    if isinstance(job.get("int_fd"), int):
        # An interrupt that comes while the store waits for Redis (restore, commit) ends the wait; the
        # pipe is only polled, its byte stays for _guard_interrupts.
        _store.set_interrupt_fd(job["int_fd"], drain=False)
    _cp = Checkpointer(_store, _shell().user_ns)
    _store_key = key
    return True


def _stand_in(name, value, why):
    """The HomeRef committed for NAME, whose VALUE cannot be saved (Checkpointer.save's stand_in)."""
    if (name.startswith("_") and name[1:].isdigit()) or usermods.is_entry(name):
        return None  # output history, a module's globals: nothing to keep a worker for
    what = homes.describe(value, why)
    ref = _home_refs.get(name)
    if ref is None or ref.what != what:
        ref = _home_refs[name] = homes.HomeRef(os.getpid(), _token, what)
    return ref


def _home_report():
    """{name: {pid, kind, what}}: the names this worker is the session's home for."""
    pid = os.getpid()
    out = {n: dict(h, pid=pid) for n, h in _home.items()}
    for n in sorted(_tied):
        out.setdefault(n, {"pid": pid, "kind": "tied", "what": "shares objects with %s" %
                           ", ".join("'%s'" % h for h in sorted(_home))})
    return out


def _restore_modules(vers, rep):
    """Bring the user modules' globals the store holds newer versions of (usermods.py).  A module whose file
    changed on disk since the session loaded it (and never reloaded it) cannot run the session's code here:
    the cell is told."""
    names = [n for n in vers if usermods.is_entry(n)]
    if not names:
        return
    r = _cp.restore(names)
    if r.failed:
        rep["module_failed"] = r.failed
    for n in r.restored:
        mod = _shell().user_ns.get(n)
        stale = getattr(mod, usermods.STALE_ATTR, None)
        if stale:
            _notices.append("LooseLeaf: module %s changed on disk since the session loaded it, and was not "
                            "reloaded; this worker runs it as it is on disk now\n" % stale)


def _resolve_homerefs(shell, names, lost, gone):
    """A HomeRef among the restored NAMES stands for a value some other worker held: that value is not here.
    The name leaves the namespace (reading it raises LostVariable, looseleaf_kernel.shell); LOST ({name:
    message}, from the kernel) or GONE ({pid: why}, from the pool: the session's home workers that went)
    says why."""
    ns = shell.user_ns
    out = {}
    for n in names:
        v = ns.get(n)
        if type(v) is homes.HomeRef and v.token != _token:
            ns.pop(n, None)
            out[n] = lost.get(n) or "'%s' lived only in worker %d (%s), %s" % (
                n, v.pid, v.what, gone.get(str(v.pid)) or "which is gone")
    return out


def _fatal(what, e):
    """The answer of a preparation that failed with E (an exception of the store or a KeyboardInterrupt)."""
    out = {"fatal": "%s: %s: %s" % (what, type(e).__name__, e)}
    if type(e).__name__ in ("StoreUnavailable", "KeyboardInterrupt"):
        out["fatal_ename"] = type(e).__name__
    return json.dumps(out)


def worker_prepare(arg):
    global _before, _token
    job = json.loads(arg)
    if _token is None:
        import uuid
        _token = uuid.uuid4().hex
    t0 = time.perf_counter()
    warm = bool(job.get("warm"))
    rep = {"imported_after_fork": [], "device": job.get("device"), "warm_hit": warm}
    gpu.assign(job)  # its slot's device alone, or none: before anything may touch CUDA
    shell = _shell()
    # The session's cell sources: tracebacks through functions of earlier cells show their lines.
    compiler = getattr(shell, "compile", None)
    if job.get("cells_dir") and hasattr(compiler, "use_dir"):
        compiler.use_dir(job["cells_dir"])
        compiler.load_index()
    ns = shell.user_ns
    _guard_interrupts(shell, job.get("int_fd"), job.get("debug"))
    # Staged on a CUDA host: no device yet, and restored variables may hold device tensors, so only the imports
    # of the closure now; the cell's run (a warm job, with its device) restores the rest.
    defer = bool(job.get("defer_restore"))
    # 1. The session's process state first: its environment decides how CUDA starts (PYTORCH_CUDA_ALLOC_CONF,
    #    CUDA_LAUNCH_BLOCKING, CUDA_MODULE_LOADING set in the notebook), its sys.path and cwd what the imports
    #    find; and on a warm worker the names whose committed version moved go.
    prep, probs, vers = None, None, {}
    if not defer:
        _fault(job, "prepare")
        try:
            _open_store(job)
            vers = _cp.versions()  # (no cell of the session commits while this one prepares)
            if warm:
                _forget_outputs(shell)
                rep["dropped_stale"] = _drop_stale(shell, vers)
            prep, probs = procstate.restore(_cp, vers)
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the cell's error reply
            return _fatal("cannot restore the session's state", e)
    t1 = time.perf_counter()
    # 2. CUDA on the assigned device, only now (after the fork, in the session's environment); a warm worker has
    #    it already, a staged one (a prefetch prepared it without a slot) gets it with its cell's run.
    gpu.start(job, rep, procstate.cuda_started)  # with the session's CUDA generators
    t2 = time.perf_counter()
    # 3. The rest of the import closure, and the names imports bind.
    _session_threads()
    missing = [m for m in job.get("import_closure") or [] if m not in sys.modules]
    loaded, failed = _import(missing)
    rep["imported_after_fork"] = loaded
    if failed:
        rep["import_failed"] = failed
    if not defer:
        # The user modules' globals before the import statements, which bind names to them.
        try:
            _restore_modules(vers, rep)
        except Exception as e:  # noqa: BLE001 - the cell runs with the modules as imported
            rep["module_failed"] = {"*": "%s: %s" % (type(e).__name__, e)}
    for stmt in job.get("import_stmts") or []:
        try:
            exec(compile(stmt, "<looseleaf import>", "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - the cell will raise the same error itself
            rep.setdefault("import_failed", {})[stmt] = "%s: %s" % (type(e).__name__, e)
    gpu.start(job, rep, procstate.cuda_started)  # torch came with the closure, not the zygote
    t3 = time.perf_counter()
    # Staged where workers get devices: an import that initialised the CUDA driver with no device visible left
    # this process a device count of 0 for good (cuInit reads CUDA_VISIBLE_DEVICES once), so it could never
    # use the slot it is staged for.  It leaves (the prefetch is answered, nothing was restored), and the
    # session's Run forks a fresh worker that imports the closure with its slot's device visible.
    global _device_host
    _device_host = _device_host or bool(job.get("defer_restore")) or job.get("device") is not None
    if job.get("prefetch") and job.get("device") is None and _device_host:
        why = gpu.driver_initialized()
        if why:
            rep["cuda_refork"] = ("an import initialised CUDA while this worker had no device (%s): it cannot "
                                  "use a slot's device, so it leaves and the cell's run forks a fresh worker"
                                  % why)
            rep["restore_deferred"] = True
            rep.update({"cuda_ms": (t2 - t1) * 1e3, "import_ms": (t3 - t2) * 1e3, "restored": [],
                        "missing": [], "held_bytes": 0, "home": {}})
            return json.dumps(rep)
    # 4. Restore the state closure.
    restored, missing_names, nbytes = [], [], 0
    if not defer:
        try:
            closure = list(job.get("state_closure") or [])
            if job.get("state_all"):
                # A cell too big to analyse ran in the session: any variable may be read.
                closure = sorted(set(closure) | (set(vers) - {procstate.NAME}))
            r = _cp.restore(closure)
            _fault(job, "restore")
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - becomes the cell's error reply
            return _fatal("cannot restore the cell's variables", e)
        failed = dict(r.failed, **prep.failed)
        if failed:
            out = {"fatal": "cannot restore %s" % "; ".join("%s: %s" % kv for kv in failed.items())}
            unavailable = [why for why in failed.values() if why.startswith("StoreUnavailable")]
            if unavailable:
                out["fatal_ename"] = "StoreUnavailable"
            return json.dumps(out)
        if probs:
            rep["procstate_problems"] = probs
        restored = sorted(n for n in r.restored if n != procstate.NAME)
        missing_names = [n for n in r.missing if n != procstate.NAME]
        lost = job.get("lost") if isinstance(job.get("lost"), dict) else {}
        gone_workers = job.get("gone_workers") if isinstance(job.get("gone_workers"), dict) else {}
        gone = _resolve_homerefs(shell, restored, lost, gone_workers)
        shell.lost_names = dict(lost, **gone)
        if gone:
            rep["lost"] = sorted(gone)
        _notices[:] = [line for line in job.get("notices") or [] if isinstance(line, str)]
        nbytes = r.payload_bytes + prep.payload_bytes
    else:
        rep["restore_deferred"] = True
    if isinstance(job.get("execution_count"), int):
        shell.execution_count = job["execution_count"]
    t4 = time.perf_counter()
    _before = _visible(shell)
    rep.update({
        "cuda_ms": (t2 - t1) * 1e3,
        "import_ms": (t3 - t2) * 1e3,
        "restore_ms": (t1 - t0) * 1e3 + (t4 - t3) * 1e3,
        "bytes_restored": nbytes,
        "restored": restored,
        "missing": missing_names,
        "held_bytes": _held_bytes(),
        "home": _home_report(),
    })
    rep["prep_ms"] = {"fork": job.get("fork_ms", 0.0), "import": rep["import_ms"] + rep["cuda_ms"],
                      "restore": rep["restore_ms"]}
    return json.dumps(rep)


def worker_finish(arg):
    job = json.loads(arg)
    t0 = time.perf_counter()
    shell = _shell()
    ns = shell.user_ns
    why = gpu.broken()
    if why:
        return _discard(why, t0)
    after = _visible(shell)
    names = set(job.get("defines") or []) | set(job.get("state_closure") or []) | set(job.get("deletes") or [])
    # What the cell rebound or deleted, whatever the analysis said (modules are re-imported, not saved).
    for k, ident in after.items():
        if _before.get(k) != ident and not isinstance(ns.get(k), type(sys)):
            names.add(k)
    names |= {k for k in _before if k not in after}
    # (a user's own module bound by an assignment, `m = importlib.reload(m)`, is saved: by reference)
    names = {n for n in names if not isinstance(ns.get(n), type(sys)) or usermods.is_user_module(ns[n])}
    # What home values share may have changed through them (a backward() into the model's parameters).
    names |= {n for n in _tied if n in ns}
    # A value the store could not take stays a home value unless this cell bound it again: saving it again
    # would fail this cell for what an earlier one made (its changes in place live here, with it).
    names -= {n for n in _unsaved if n in after and _before.get(n) == after[n]}
    # A value another worker held and lost stays recorded as lost, unless this cell bound the name again.
    lost = getattr(shell, "lost_names", None) or {}
    names -= {n for n in lost if n not in ns}
    names |= set(usermods.bind_all(ns))
    # The cell's result (_N, set by the displayhook) goes too: the kernel puts it into its Out, _, __.
    count = job.get("execution_count")
    if isinstance(count, int) and ("_%d" % count) in ns:
        names.add("_%d" % count)
    if (job.get("fault") or "") in ("save", "kill@save"):
        # Die inside the commit: after the payloads went into the pool, just before Redis' EXEC.
        os.environ["LL_STORE_FAULT"] = "before_commit"
    else:
        _fault(job, "save")
    try:
        # All or nothing when the store fails: a cell is never committed torn.
        rep = procstate.save_with(_cp, sorted(names), cell_id="In[%s] %s" % (count, job.get("id")),
                                  stand_in=_stand_in, all_or_none=True)
        _note_home(ns, rep)
        if _home and not rep.error:
            # What the home values reach is used here too; a newly reached variable is committed now, so
            # the store has it at the version this process holds.
            owner, graph = _cp.sharing()
            _tied.clear()
            _tied.update(n for n in homes.tied(owner, ns, sorted(_home), graph) if n in ns and n not in _home
                         and not usermods.is_entry(n) and n != procstate.NAME)
            extra = sorted(n for n in _tied if n not in names)
            if extra:
                rep2 = _cp.save(extra, cell_id="%s-tied" % job.get("id"), stand_in=_stand_in, all_or_none=True)
                _note_home(ns, rep2)
                rep.saved.update(rep2.saved)
                rep.failed.update(rep2.failed)
                rep.error = rep.error or rep2.error
                rep.error_kind = rep.error_kind or rep2.error_kind
        elif not _home:
            _tied.clear()
    except KeyboardInterrupt:
        from looseleaf_store.checkpoint import SaveReport
        rep = SaveReport()
        rep.error_kind = "KeyboardInterrupt"
        rep.error = "interrupted while saving"
    # _N is only output history (for the kernel's Out/_): a result that cannot be saved is no error.
    for n in [n for n in rep.failed if n.startswith("_") and n[1:].isdigit()]:
        del rep.failed[n]
    out = {
        "save_ms": (time.perf_counter() - t0) * 1e3,
        "bytes_saved": rep.bytes_written,
        "saved": sorted(n for n in rep.saved if n != procstate.NAME),
        "deleted": sorted(rep.deleted),
    }
    if rep.saved and not rep.error:
        out["committed"] = max(rep.saved.values())  # the kernel tells an emptied store by it
    if rep.error:
        # The store failed (or an interrupt came): nothing of the cell was committed.
        lost = sorted(n for n in names if n != procstate.NAME and not (n.startswith("_") and n[1:].isdigit()))
        out["save_ename"] = rep.error_kind or "StoreError"
        out["save_error"] = "the cell's results (%s) were not saved, nothing of this cell was committed: %s" % (
            ", ".join(lost) or "none", rep.error)
        out["save_failed"] = rep.failed or {n: rep.error for n in lost}
        # This process holds the only copy of what the cell made or changed: it stays as their home (the store
        # could not take them, and dropping them would lose data), and later cells reading them run here, until a
        # cell binds them again (then saved) or the worker must go (then LostVariable says why).
        held = _cp.held() if _cp is not None else {}
        for n in lost:
            if n in ns and not isinstance(ns[n], type(sys)) and not usermods.is_entry(n):
                _home[n] = {"kind": "held", "what": "not saved: %s" % out["save_ename"]}
                _unsaved[n] = held.get(n)
    elif rep.failed:
        out["save_failed"] = rep.failed
        sys.stderr.write("LooseLeaf: could not save %s\n" % ", ".join("%s (%s)" % kv for kv in rep.failed.items()))
    out["held_bytes"] = _held_bytes()
    out["home"] = _home_report()
    out["shapes"] = _shapes(ns, out["saved"])
    # Names the cell bound beyond its analysis (exec, %run, globals()[k] = v): the gateway's session learns
    # them, so later cells' closures restore them wherever they run.
    from looseleaf_kernel.coherence import namespace_diff
    dynamic = namespace_diff(ns, _before, after, job.get("defines"))
    if dynamic:
        out["dynamic"] = dynamic
    return json.dumps(out)


def _discard(why, t0):
    """The report of a cell after which the device context is broken (gpu.broken: a sticky CUDA error such as
    a device-side assert): nothing of the cell is committed (its device values are garbage, and copying them
    out fails with the same error), and `device_broken` tells ll_zygote.c that this worker must leave, even
    when it is a home (what it holds is unusable now; the pool reports it gone).  `save_error` is the one line
    the user reads: on stderr after the cell's own error, or the cell's error when its code succeeded and the
    error surfaced only here."""
    out = {
        "save_ms": (time.perf_counter() - t0) * 1e3,
        "bytes_saved": 0,
        "saved": [],
        "deleted": [],
        "device_broken": why,
        "save_ename": why.partition(":")[0] or "CUDAError",
        "save_error": "this worker's CUDA context is broken (%s), so it was discarded: nothing of this cell "
                      "was committed; the next GPU cell runs on a fresh worker from the last committed "
                      "variables" % why,
        "held_bytes": 0,
        "home": _home_report(),
    }
    return json.dumps(out)


_SHAPE_DIR_MAX = 4000  # names of one value's dir() sent at most (a tensor has ~750)


def _shapes(ns, names):
    """What the kernel needs to complete `name.<Tab>` on NAMES (saved by this cell) without restoring them:
    each one's type, dir() and payload bytes ({"names": {name: [type, dir index, bytes]}, "dirs": [[...]]},
    equal dir() lists sent once).  The kernel answers a completion from these while restoring the value would
    import its framework or map a large payload (coherence.complete_view); a value whose dir() fails is left
    out, and is restored as before."""
    dirs, index, named = [], {}, {}
    for n in names:
        if n not in ns or n.startswith("_") and n[1:].isdigit():
            continue
        v = ns[n]
        try:
            attrs = tuple(a for a in dir(v) if isinstance(a, str))[:_SHAPE_DIR_MAX]
        except Exception:  # noqa: BLE001 - a __dir__ that fails: the kernel restores the value instead
            continue
        if attrs not in index:
            index[attrs] = len(dirs)
            dirs.append(list(attrs))
        t = type(v)
        named[n] = ["%s.%s" % (getattr(t, "__module__", "builtins"), t.__qualname__), index[attrs],
                    _payload_bytes(n),
                    sorted(_value_modules(v)),
                    _explorer_value(v)]
    return {"names": named, "dirs": dirs}


_EXPLORER_VALUE_MAX = 200  # characters of a value the variable explorer shows without restoring it


def _explorer_value(v):
    """What JupyterLab's variable explorer shows for V between cells, where the kernel lists what GPU cells made
    without restoring it (looseleaf_kernel/debugger.py): a tensor's device, shape and dtype, an array's shape
    and dtype, a number's or a short string's repr; None for the rest (the explorer shows its type)."""
    try:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(v, torch.Tensor):
            from looseleaf_kernel.debugger import tensor_summary
            return tensor_summary(v)
        np = sys.modules.get("numpy")
        if np is not None and isinstance(v, np.ndarray):
            return "ndarray(shape=%s, dtype=%s)" % (v.shape, v.dtype)
        if v is None or type(v) in (bool, int, float, complex) or \
                type(v) in (str, bytes) and len(v) <= _EXPLORER_VALUE_MAX:
            text = repr(v)
            return text if len(text) <= _EXPLORER_VALUE_MAX else None
    except Exception:  # noqa: BLE001 - (an int too long for repr, a tensor subclass that fails): type only
        pass
    return None


def _value_modules(v, depth=2, out=None):
    """Top-level modules restoring V would import, as far as its types show (its classes' MROs, and those of
    a few items of its containers and attributes): the kernel restores it for a completion only when they are
    imported there already.  A module this misses costs that completion time, never a wrong answer."""
    out = set() if out is None else out
    for c in type(v).__mro__:
        m = getattr(c, "__module__", None)
        if isinstance(m, str) and m not in ("builtins", "__main__"):
            out.add(m.partition(".")[0])
    if depth > 0:
        if isinstance(v, dict):
            items = list(v.values())[:32]
        elif isinstance(v, (list, tuple, set, frozenset)):
            items = list(v)[:32]
        else:
            d = getattr(v, "__dict__", None)
            items = list(d.values())[:32] if isinstance(d, dict) else []
        for x in items:
            _value_modules(x, depth - 1, out)
    return out


def _note_home(ns, rep):
    """The home values after save REP: stand-ins (no pickle takes them) and graphs (the store keeps their data,
    this process their autograd history); names saved plainly, deleted or gone are no home values."""
    for n in rep.standins:
        _home[n] = {"kind": "held", "what": _home_refs[n].what}
    graphs = {n for n in rep.graphs if not (n.startswith("_") and n[1:].isdigit())
              and n != procstate.NAME and not usermods.is_entry(n)}
    for n in graphs:
        _home[n] = {"kind": "graph", "what": "an autograd graph"}
    for n in list(rep.saved) + list(rep.unchanged):
        if n not in rep.standins and n not in graphs:
            _home.pop(n, None)
            _home_refs.pop(n, None)
            _unsaved.pop(n, None)
    for n in list(rep.deleted) + [n for n in _home if n not in ns]:
        _home.pop(n, None)
        _home_refs.pop(n, None)
        _unsaved.pop(n, None)


def worker_exit(arg):
    global _store, _cp
    if _store is not None:
        try:
            _store.close()
        except Exception:  # noqa: BLE001 - leaving anyway; the store drops a dead reader's leases
            pass
    _store = _cp = None
    return "null"

"""JupyterLab's debugger in a GPU cell's worker (the kernel's side: looseleaf_kernel/debugger.py).

When the cell's job says the session's debugger is on (job["debug"], put there by the kernel), the worker, after
the fork and never in a zygote (zygotes stay single-threaded and free of pydevd), starts pydevd listening on
127.0.0.1 with debugpy's in-process adapter (pydevd speaks the Debug Adapter Protocol itself: no adapter process
that would outlive the worker's process group), tells the kernel where with a `looseleaf_debug_worker` iopub
message (the gateway's relay hands it to the kernel's debugger instead of the frontend), and waits before the
cell's first line until the kernel's client has attached and replayed the session's breakpoints and exception
filters (configurationDone), so a breakpoint on the cell's first lines hits.  pydevd listens once per worker: a
warm worker's next debugged cell is attached to again, on the same port.

The cell is compiled under the name the kernel's dumpCell gives it (the session's cell directory, Murmur2 of the
raw cell: zyg.worker_prepare), and its placement magic line stays as an empty line (IPython's leading_empty_lines
cleanup is taken out while the cell runs, as the kernel's debugger does), so the frames' lines and source paths
are the editor's."""

import os
import sys
import threading

ATTACH_TIMEOUT_S = 30.0  # the kernel's client configures within this, or the cell runs without the debugger

_endpoint = None  # (host, port) pydevd listens on in this worker, once started
_removed_cleanup = {}


def _publish(msg_type, content):
    from looseleaf_kernel.display import publish
    publish(msg_type, content)


def _own_paths():
    """What stepping and "pause on raised exceptions" skip here, as the kernel skips the files it imported at
    start: the installed packages and standard modules this worker holds before the cell (its zygote's head,
    torch among them: IPython's traceback of a cell's error reads every module's __file__, and torch._VF raises
    and catches AttributeError there, which would stop the cell a second time).  Top-level package directories
    and single-file modules, under the interpreter's library directories only: the session's own modules stay
    debuggable."""
    import sysconfig
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and os.path.isdir(path):
            # pydevd matches a frame's absolute path, not its real one (a venv may be a symbolic link).
            roots.update((os.path.abspath(path) + os.sep, os.path.realpath(path) + os.sep))
    out = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str):
            continue
        f = os.path.abspath(f)
        for root in roots:
            if f.startswith(root):
                out.add(root + f[len(root):].split(os.sep, 1)[0])
    return sorted(out)


def begin(dbg, shell):
    """Before the cell's code (DBG: the job's "debug"): pydevd listening, the kernel told, its client attached
    and configured; True when the cell then runs under the debugger.  A failure is one stderr line: the cell
    runs as without the debugger."""
    global _endpoint
    try:
        if _endpoint is None:
            # pydevd's warning about frozen stdlib modules would land in the cell's output; the variable is read
            # once, at import, and taken out again so the session's environment (saved after the cell) is the
            # user's.
            had = "PYDEVD_DISABLE_FILE_VALIDATION" in os.environ
            os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
            try:
                import debugpy
                debugpy.configure(subProcess=False)
                _endpoint = debugpy.listen(("127.0.0.1", 0), in_process_debug_adapter=True)
            finally:
                if not had:
                    os.environ.pop("PYDEVD_DISABLE_FILE_VALIDATION", None)
            try:
                from looseleaf_kernel.debugger import install_tensor_view
                install_tensor_view()  # device, shape, dtype in the variable explorer
            except Exception as e:  # noqa: BLE001 - tensors then show as pydevd shows any object
                sys.stderr.write("LooseLeaf: the debugger shows tensors without their summary (%s)\n" % e)
        import debugpy
        import pydevd
        host, port = _endpoint
        _publish("looseleaf_debug_worker", {"host": host, "port": port, "pid": os.getpid(),
                                            "token": dbg.get("token") if isinstance(dbg, dict) else None,
                                            "skip": _own_paths()})
        cancel = threading.Event()
        timer = threading.Timer(ATTACH_TIMEOUT_S, cancel.set)
        timer.daemon = True
        timer.is_pydev_daemon_thread = True
        timer.start()
        try:
            pydevd._wait_for_attach(cancel=cancel)
        finally:
            timer.cancel()
        if not debugpy.is_client_connected():
            raise RuntimeError("the kernel's debugger did not attach within %d s" % ATTACH_TIMEOUT_S)
        debugpy.debug_this_thread()
    except Exception as e:  # noqa: BLE001 - the cell must run, debugger or not
        sys.stderr.write("LooseLeaf: the debugger cannot run in this GPU cell's worker (%s: %s); the cell runs "
                         "without it\n" % (type(e).__name__, e))
        return False
    # Keep the cell's leading empty line (its placement magic's) so breakpoints land on the editor's lines.
    try:
        from IPython.core.inputtransformer2 import leading_empty_lines
        cleanup = shell.input_transformer_manager.cleanup_transforms
        if leading_empty_lines in cleanup:
            i = cleanup.index(leading_empty_lines)
            _removed_cleanup[i] = cleanup.pop(i)
    except (ImportError, AttributeError):
        pass
    return True


def end(shell):
    """After the cell (its reply is made after this): tracing off, IPython's cleanup back, and a thread an
    interrupt took out of a breakpoint marked running again (pydevd would park the warm worker's next debugged
    cell at its first line otherwise, as debugger.cell_ended explains for the kernel)."""
    try:
        import debugpy
        debugpy.trace_this_thread(False)
    except Exception:  # noqa: BLE001
        pass
    cleanup = getattr(getattr(shell, "input_transformer_manager", None), "cleanup_transforms", None)
    for i in sorted(_removed_cleanup):
        t = _removed_cleanup.pop(i)
        if cleanup is not None:
            cleanup.insert(i, t)
    info = getattr(threading.current_thread(), "additional_info", None)
    try:
        from _pydevd_bundle.pydevd_constants import STATE_RUN, STATE_SUSPEND
    except ImportError:
        return
    if info is not None and getattr(info, "pydev_state", None) == STATE_SUSPEND:
        info.pydev_state = STATE_RUN
        info.pydev_step_cmd = -1
        info.pydev_original_step_cmd = -1
        info.pydev_step_stop = None

"""The request handlers of the LooseLeaf interpreter: one function per
Jupyter shell/control request, called by ll_interp_handle (C) through
handle(), with JSON texts in and JSON texts out.

Runs on the interpreter thread, one request at a time.  What ipykernel does
is the reference (ipykernel/ipkernel.py, kernelbase.py): execution_count
semantics, reply shapes, metadata.  Every exception is caught here: a broken
request gets an error reply, never a dead kernel.
"""
import builtins
import contextlib
import getpass
import glob
import logging
import os
import sqlite3
import sys
import threading
import time
import traceback
import uuid
from datetime import datetime, timezone

from IPython.core.error import StdinNotImplementedError
from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult
from IPython.utils.tokenutil import line_at_cursor, token_at_cursor
from traitlets.config import Config

import _looseleaf_kernel as _lk

from . import comms, unimported
from .coherence import Coherence, namespace_diff, split_visible
from ._json import dumps, loads
from .display import flush_streams, publish
from .iostream import OutStream
from .shell import CellCompiler, ZMQInteractiveShell, connection_file

try:
    from IPython.core.completer import provisionalcompleter, rectify_completions

    _HAVE_EXPERIMENTAL_COMPLETIONS = True
except ImportError:  # pragma: no cover - older IPython
    _HAVE_EXPERIMENTAL_COMPLETIONS = False

__all__ = ["Kernel", "start", "handle", "shutdown", "get_kernel"]

__version__ = "0.1.0"
PROTOCOL_VERSION = "5.5"  # the gateway's LL_PROTOCOL_VERSION (proto/ll_wire.h)
_EXPERIMENTAL_KEY = "_jupyter_types_experimental"

log = logging.getLogger("looseleaf_kernel")


class KernelLogHandler(logging.Handler):
    """Sends Python log records of the kernel's own code to the kernel's log
    (ll_log, the process's original stderr) instead of the cell's stderr."""

    # ll_log levels: 0 error, 1 warn, 2 info, 3 debug
    @staticmethod
    def _level(levelno):
        if levelno >= logging.ERROR:
            return 0
        if levelno >= logging.WARNING:
            return 1
        return 2 if levelno >= logging.INFO else 3

    def emit(self, record):
        try:
            _lk.log(self._level(record.levelno), "py." + record.name, self.format(record))
        except Exception:
            self.handleError(record)


def _route_logs():
    level = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}.get(_lk.log_level(),
                                                                      logging.DEBUG)
    handler = KernelLogHandler()
    for name in ("looseleaf_kernel", "Comm"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False

HELP_LINKS = [
    {"text": "Python Reference", "url": "https://docs.python.org/%i.%i" % sys.version_info[:2]},
    {"text": "IPython Reference", "url": "https://ipython.org/documentation.html"},
    {"text": "NumPy Reference", "url": "https://docs.scipy.org/doc/numpy/reference/"},
    {"text": "SciPy Reference", "url": "https://docs.scipy.org/doc/scipy/reference/"},
    {"text": "Matplotlib Reference", "url": "https://matplotlib.org/contents.html"},
    {"text": "SymPy Reference", "url": "http://docs.sympy.org/latest/index.html"},
    {"text": "pandas Reference", "url": "https://pandas.pydata.org/pandas-docs/stable/"},
]


def _code_and_cursor(content):
    """The draft code and cursor of a complete/inspect request, made safe:
    a non-string code is empty and a missing or out-of-range cursor sits at
    the end, as frontends mean when they omit it."""
    code = content.get("code", "")
    cursor_pos = content.get("cursor_pos")
    if not isinstance(code, str):
        code = ""
    if not isinstance(cursor_pos, int) or not 0 <= cursor_pos <= len(code):
        cursor_pos = len(code)
    return code, cursor_pos


def _now():
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _history_stand_in(flag):
    """What stands for IPython 9's history writer thread in a forked child: it never starts; setting its
    save_flag (FLAG) writes the inputs out at once."""
    from IPython.core.history import HistorySavingThread

    class _StandIn(HistorySavingThread):
        def __init__(self):
            threading.Thread.__init__(self, name="looseleaf-history-stand-in", daemon=True)
            self.save_flag = flag
            self.stop_now = False

        def run(self):
            pass

        def stop(self):
            pass

    return _StandIn()


class Kernel:
    """The interpreter side of one kernel: a shell plus request handlers."""

    implementation = "looseleaf"
    implementation_version = __version__

    def __init__(self):
        self.ident = str(uuid.uuid4())
        self._parent_main = {}
        # A request's own state, per thread: the interpreter thread serves the main shell, each subshell
        # (JEP 91) has a thread of its own that runs its requests alongside (gateway/ll_dispatch.c).
        self._tls = threading.local()
        # Subshells and the store: the coherence state is the main thread's; a subshell takes this lock
        # to refresh what its cell names, and leaves the names its cells rebind in _sub_dirty, which the
        # main thread marks dirty before its next request (so a later GPU cell sees them).
        self._coh_lock = threading.Lock()
        self._sub_lock = threading.Lock()
        self._sub_dirty = set()
        self.allow_stdin = False
        self._stdout = OutStream("stdout", 1)
        self._stderr = OutStream("stderr", 2)
        sys.stdout, sys.stderr = self._stdout, self._stderr
        # What code written for ipykernel sends through: kernel.session.send(kernel.iopub_socket, ...).
        self.session = comms.SESSION
        self.iopub_socket = comms.IOPUB
        comms.install(self)
        # Our errors and the comm package's are the kernel's business, not
        # the cell's output.
        _route_logs()

        # What ipykernel's config holds: libraries (tqdm.auto, ...) look for
        # this section to know they run in a Jupyter kernel.
        config = _profile_config()
        config.IPKernelApp.connection_file = connection_file() or ""
        self.shell = ZMQInteractiveShell.instance(kernel=self, compiler_class=CellCompiler,
                                                  config=config)
        # IPython's default extension, loaded by every IPython app (%store).
        try:
            self.shell.extension_manager.load_extension("storemagic")
        except Exception:
            log.warning("storemagic extension not loaded", exc_info=True)
        self.shell.displayhook.get_execution_count = lambda: self.shell.execution_count
        self.comm_manager = comms.manager()
        self.language_info = {
            "name": "python",
            "version": sys.version.split()[0],
            "mimetype": "text/x-python",
            "codemirror_mode": {"name": "ipython", "version": sys.version_info[0]},
            "pygments_lexer": "ipython%d" % sys.version_info[0],
            "nbconvert_exporter": "python",
            "file_extension": ".py",
        }
        builtins.input = self.raw_input
        getpass.getpass = self.getpass
        os.register_at_fork(before=self._before_fork, after_in_parent=self._after_fork_parent,
                            after_in_child=self._after_fork_child)
        self._fork_held = []
        self._run_startup_files()
        # One handler per type the gateway forwards here, named as the type; the list is the gateway's
        # (proto/ll_msgtype.c), so a type added there without a handler here stops the kernel at start-up.
        self.handlers = _request_handlers(self, _lk.request_types())
        self.coherence = Coherence(self.shell)
        self._note_pending = True  # first_note not asked yet
        self._restore_note = None  # a restore's summary for the first cell to show
        self.restarting = False
        CellCompiler.sweep()  # cell sources of kernels that were killed
        from . import magic
        magic.install(self)
        # The files the kernel itself runs (as ipykernel lists them at start): the debugger never steps into them.
        from . import debugger
        self.debugger = debugger.install(self.shell, sorted({
            m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)}),
            coherence=lambda: getattr(self, "coherence", None))

    def _run_startup_files(self):
        """Run the profile's startup/*.py and *.ipy files in the user
        namespace, in name order, as IPython apps (and ipykernel) do.
        Their failures go to the kernel's log: no frontend is listening yet."""
        from IPython.core.application import ENV_CONFIG_DIRS, SYSTEM_CONFIG_DIRS

        dirs = [self.shell.profile_dir.startup_dir]
        dirs += [os.path.join(p, "startup") for p in ENV_CONFIG_DIRS + SYSTEM_CONFIG_DIRS]
        files = []
        for d in dirs[::-1]:
            files += glob.glob(os.path.join(d, "*.py")) + glob.glob(os.path.join(d, "*.ipy"))
        for fname in sorted(files):
            ns = self.shell.user_ns
            had_file, old_file = "__file__" in ns, ns.get("__file__")
            ns["__file__"] = fname
            try:
                if fname.endswith(".ipy"):
                    self.shell.safe_execfile_ipy(fname)
                else:
                    self.shell.safe_execfile(fname, ns, raise_exceptions=True)
            except BaseException:
                log.error("startup file %s failed:\n%s", fname, traceback.format_exc())
            finally:
                if had_file:
                    ns["__file__"] = old_file
                else:
                    ns.pop("__file__", None)

    def _before_fork(self):
        """Keep the history writer thread out of sqlite across fork().  While
        it writes it holds sqlite's process-wide mutexes with the GIL
        released; a child forked at that instant inherits them locked, and
        its first sqlite call (even on a fresh in-memory database) hangs for
        ever.  The writer does all its sqlite work inside the two cache locks,
        so holding both over the fork (and waiting for the thread's first
        connect, which is outside them) excludes it."""
        hm = getattr(self.shell, "history_manager", None)
        if hm is None:
            return
        thread = getattr(hm, "save_thread", None)
        if thread is not None and thread.is_alive():
            deadline = time.monotonic() + 2.0
            while getattr(thread, "db", None) is None and time.monotonic() < deadline:
                time.sleep(0.001)
        for lock in (hm.db_input_cache_lock, hm.db_output_cache_lock):
            if lock.acquire(timeout=5.0):
                self._fork_held.append(lock)
            else:
                log.warning("history writer held its lock for 5 s; forking anyway")

    def _after_fork_parent(self):
        while self._fork_held:
            self._fork_held.pop().release()

    def _after_fork_child(self):
        """In a fork()ed child (a worker, multiprocessing): the history
        writer thread did not survive the fork and may have died holding the
        history locks, and the parent's sqlite database must not be touched
        from the child: using, or even closing, an inherited connection can
        break the parent's (sqlite's locks are per process), and reading the
        live file races the parent's writer.  The child keeps the inherited
        connections alive untouched and gets fresh locks and an in-memory
        database holding this session's inputs, so %history and _i<N> work,
        and nothing reaches the parent's file."""
        self._fork_held = []  # the parent's; the child gets fresh locks below
        hm = getattr(self.shell, "history_manager", None)
        if hm is None:
            return
        thread = getattr(hm, "save_thread", None)
        _fork_keepalive.extend([hm.db, thread, getattr(thread, "db", None)])
        # Reentrant: the write-out below runs inside store_inputs' lock.
        hm.db_input_cache_lock = threading.RLock()
        hm.db_output_cache_lock = threading.RLock()
        hm.save_thread = None
        hm.db_input_cache = []
        hm.db_output_cache = []
        hm.end_session = lambda: None
        db = sqlite3.connect(":memory:", detect_types=sqlite3.PARSE_DECLTYPES |
                             sqlite3.PARSE_COLNAMES, check_same_thread=False)
        db.execute("CREATE TABLE sessions (session integer primary key autoincrement,"
                   " start timestamp, end timestamp, num_cmds integer, remark text)")
        db.execute("CREATE TABLE history (session integer, line integer, source text,"
                   " source_raw text, PRIMARY KEY (session, line))")
        db.execute("CREATE TABLE output_history (session integer, line integer,"
                   " output text, PRIMARY KEY (session, line))")
        session = hm.session_number
        db.execute("INSERT INTO sessions VALUES (?, NULL, NULL, NULL, '')", (session,))
        rows = [(session, i, parsed, raw) for i, (parsed, raw) in
                enumerate(zip(hm.input_hist_parsed, hm.input_hist_raw)) if i > 0]
        db.executemany("INSERT OR REPLACE INTO history VALUES (?, ?, ?, ?)", rows)
        db.commit()
        hm.db = db
        # Inputs are written to this database at once, by the interpreter
        # thread itself (there is no writer thread in the child).
        hm.db_cache_size = 0

        class _WriteNow(threading.Event):
            def set(self):
                hm.writeout_cache(db)

        if isinstance(getattr(type(hm), "save_flag", None), property):
            # IPython 9: the flag belongs to the writer thread; a stand-in that never starts carries it.
            hm.save_thread = _history_stand_in(_WriteNow())
        else:
            hm.save_flag = _WriteNow()

    # -- entry ------------------------------------------------------------

    # -- per-thread request state (subshells) ------------------------------

    @staticmethod
    def on_subshell():
        """Whether this thread serves a subshell: any thread but the interpreter's (Python's main)."""
        return threading.current_thread() is not threading.main_thread()

    @property
    def _route_plan(self):
        return getattr(self._tls, "route_plan", None)

    @_route_plan.setter
    def _route_plan(self, value):
        self._tls.route_plan = value

    @property
    def _request_metadata(self):
        return getattr(self._tls, "metadata", {})

    @_request_metadata.setter
    def _request_metadata(self, value):
        self._tls.metadata = value

    @property
    def _request_buffers(self):
        return getattr(self._tls, "buffers", [])

    @_request_buffers.setter
    def _request_buffers(self, value):
        self._tls.buffers = value

    @property
    def parent_header(self):
        if self.on_subshell():
            return getattr(self._tls, "parent", {})
        return self._parent_main

    @parent_header.setter
    def parent_header(self, value):
        if self.on_subshell():
            self._tls.parent = value
        else:
            self._parent_main = value

    def _merge_subshell_changes(self):
        """Main thread: what subshells' code rebound becomes dirty, as after a CPU cell."""
        with self._sub_lock:
            bound, self._sub_dirty = self._sub_dirty, set()
        if bound:
            with self._coh_lock:
                self.coherence._mark_dirty(bound)
                self.coherence._mods_dirty = True
                self.coherence._rebound_here(bound)

    @contextlib.contextmanager
    def _coh_for_subshell(self):
        """_coh_lock for a subshell's code, listed while it waits: the background commit, which holds the
        lock, gives way to it (coherence.commit_slow).  (list.append/pop: atomic under the GIL.)"""
        waiting = self.coherence.subshells_waiting
        waiting.append(None)
        try:
            self._coh_lock.acquire()
        finally:
            waiting.pop()
        try:
            yield
        finally:
            self._coh_lock.release()

    @contextlib.contextmanager
    def _subshell_code(self, code):
        """User code on a subshell (a cell, a comm's callback): the variables CODE names come up to date
        from the store where a worker changed them, as a CPU cell's closure does, and what the code rebinds
        is handed to the main thread (_merge_subshell_changes).  In-place changes are as invisible as in a
        widget's callback (coherence.untracked_code)."""
        coh = self.coherence
        with self._coh_for_subshell():
            try:
                coh.refresh_for(code)
            except Exception:  # noqa: BLE001 - the cell still runs on the values the kernel holds
                log.warning("refreshing for a subshell's cell failed", exc_info=True)
            before, before_mods = split_visible(self.shell)
        self._tls.dynamic = None
        try:
            yield
        finally:
            after, after_mods = split_visible(self.shell)
            bound = coh._rebound_since(before, after)
            if bound:
                with self._sub_lock:
                    self._sub_dirty.update(bound)
            # No analysis saw this code: the gateway's session learns what it bound (reply metadata).
            self._tls.dynamic = namespace_diff(self.shell.user_ns, dict(before, **before_mods),
                                               dict(after, **after_mods), None)

    _LOCKED_TYPES = frozenset(("complete_request", "inspect_request", "looseleaf_before_gpu",
                               "looseleaf_after_gpu", "looseleaf_commit_idle", "looseleaf_commit_slow",
                               "looseleaf_home_lost"))

    def handle(self, msg_type, content_json, parent_json, metadata_json="{}", buffers=(), route_json=None):
        """Run one request (API.md); returns (reply_json or None, metadata_json or None)."""
        subshell = self.on_subshell()
        if not subshell:
            self._merge_subshell_changes()
        try:
            content = loads(content_json)
            parent = loads(parent_json) if parent_json else {}
            metadata = loads(metadata_json) if metadata_json else {}
            route = loads(route_json) if route_json else None
            if not isinstance(content, dict):
                raise ValueError("request content is not a JSON object")
            if not isinstance(parent, dict):
                parent = {}
            if not isinstance(metadata, dict):
                metadata = {}
        except ValueError as e:
            return self._error_json("BadRequest", "invalid %s: %s" % (msg_type, e))
        if self.debugger is not None and msg_type != "execute_request" and not subshell:
            self.debugger.trace_this_thread(False)  # pydevd sees cells only (a breakpoint change traces all)
        handler = self.handlers.get(msg_type)
        if handler is None:
            return self._error_json("UnknownRequest", "unknown request type %r" % (msg_type,))
        # An executed cell's plan under GPU routing (the gateway's, never the client's).
        self._route_plan = route if isinstance(route, dict) and not subshell else None
        self._request_metadata = metadata
        self._request_buffers = list(buffers) if buffers else []
        # The whole request, as ipykernel's get_parent() gives it (the
        # Output widget reads get_parent()["header"]["msg_id"]).
        self.set_parent({
            "header": parent,
            "msg_id": parent.get("msg_id", ""),
            "msg_type": msg_type,
            "parent_header": {},
            "metadata": metadata,
            "content": content,
            "buffers": self._request_buffers,
        })
        try:
            if not subshell and msg_type in self._LOCKED_TYPES:
                with self._coh_lock:  # a subshell's refresh waits for the coherence state
                    return handler(content, parent)
            return handler(content, parent)
        except BaseException as e:  # KeyboardInterrupt too: the kernel lives on
            log.exception("%s failed", msg_type)
            return self._error_json(type(e).__name__, str(e))

    def _error_json(self, ename, evalue):
        reply = {"status": "error", "ename": ename, "evalue": evalue, "traceback": []}
        return dumps(reply), None

    def set_parent(self, parent):
        """PARENT: the current request as a message dict (header, content,
        metadata, ...), like ipykernel's; a subshell's stays its thread's."""
        self.parent_header = parent
        if not self.on_subshell():
            self.shell.set_parent(parent)

    def get_parent(self, channel="shell"):
        return self.parent_header

    @property
    def _parent_header(self):
        # ipykernel's name for the same, used by ipywidgets
        return self.parent_header

    # -- execute ----------------------------------------------------------

    def execute_request(self, content, parent):
        shell = self.shell
        code = content.get("code")
        if not isinstance(code, str):
            reply = {
                "status": "error",
                "ename": "BadRequest",
                "evalue": "execute_request without a 'code' string",
                "traceback": [],
                "execution_count": shell.execution_count,
                "user_expressions": {},
                "payload": [],
            }
            return dumps(reply), dumps({"started": _now(), "status": "error"})
        silent = bool(content.get("silent", False))
        store_history = bool(content.get("store_history", not silent))
        user_expressions = content.get("user_expressions") or {}
        subshell = self.on_subshell()
        if not subshell:
            self.allow_stdin = bool(content.get("allow_stdin", False))
        cell_id = self._request_metadata.get("cellId")
        metadata = {"started": _now(), "dependencies_met": True, "engine": self.ident}

        if not silent:
            publish("execute_input", {"code": code, "execution_count": shell.execution_count})
        # With GPU routing the gateway sends the cell's closure along: refresh what workers changed,
        # then note what this cell changes (coherence.py).
        plan = self._route_plan
        if not isinstance(plan, dict):
            plan = None
        if plan is not None and isinstance(plan.get("notice"), str):
            sys.stderr.write(plan["notice"])  # why a GPU cell runs here (gateway/ll_kernel.c)
        # A GPU cell the kernel could not hand to a worker (the store did not answer, an interrupt came
        # while committing) fails with that error instead of running; so does a CPU cell whose variables
        # a worker changed when the store cannot give them back.
        fail = plan.get("raise") if plan is not None else None
        route_md = None
        if plan is not None and not fail:
            with self._coh_lock:
                route_md = self.coherence.before_cpu(dict(plan, code=code))
        if not silent and not subshell:
            # A store an earlier kernel of this notebook left (keep.py), once; the main shell's first cell
            # restores or offers it (the coherence state is the main thread's).
            note = self.first_note()
            if note:
                sys.stderr.write(note)
        if route_md and isinstance(route_md.get("error"), dict):
            fail = route_md.pop("error")
        t_exec = time.perf_counter()
        # Interrupts land only while the cell runs, never in the reply; they never reach a subshell's.
        if not subshell:
            _lk.set_busy(not fail)
        try:
            try:
                if isinstance(fail, dict):
                    res = self._fail_cell(code, store_history, silent, cell_id, fail)
                elif subshell:
                    with self._subshell_code(code):
                        res = shell.run_cell(code, store_history=store_history, silent=silent,
                                             cell_id=cell_id)
                else:
                    if self.debugger is not None:
                        self.debugger.trace_this_thread()  # breakpoints hit in this cell
                    res = shell.run_cell(code, store_history=store_history, silent=silent,
                                         cell_id=cell_id)
            except BaseException as e:
                # IPython itself failed on this cell (or an interrupt hit its
                # own code): still a cell error for the user, published and
                # replied, not a broken kernel.
                shell.showtraceback()
                res = ExecutionResult(ExecutionInfo(code, store_history, silent, False, cell_id))
                res.error_in_exec = e
        finally:
            if not subshell:
                _lk.set_busy(False)
                if self.debugger is not None:
                    self.debugger.cell_ended()
                self.allow_stdin = False
            self._flush_streams()
            if plan is not None and not fail:
                with self._coh_lock:
                    extra = self.coherence.after_cpu(plan)
                if route_md is not None and extra:
                    route_md.update(extra)

        reply = {}
        shown = getattr(shell, "displayhook_error", None)
        if res.success and not shown:
            reply["status"] = "ok"
        else:
            err = res.error_before_exec if res.error_before_exec is not None else res.error_in_exec
            etype, evalue = (type(err), err) if err is not None else shown
            reply["status"] = "error"
            reply["traceback"] = shell._last_traceback or []
            reply["ename"] = str(etype.__name__)
            reply["evalue"] = str(evalue)
            reply["engine_info"] = {"engine_uuid": self.ident, "engine_id": -1, "method": "execute"}
        reply["execution_count"] = shell.execution_count - 1
        if reply["status"] == "ok" and isinstance(user_expressions, dict):
            reply["user_expressions"] = shell.user_expressions(user_expressions)
        else:
            reply["user_expressions"] = {}
        reply["payload"] = shell.payload_manager.read_payload()
        shell.payload_manager.clear_payload()
        metadata["status"] = reply["status"]
        if route_md is not None:
            route_md["exec_ms"] = (time.perf_counter() - t_exec) * 1e3
            metadata["looseleaf"] = route_md
        elif subshell and getattr(self._tls, "dynamic", None):
            metadata["looseleaf"] = {"dynamic": self._tls.dynamic}  # for the gateway (gateway/ll_kernel.c)
        return dumps(reply), dumps(metadata)

    def _fail_cell(self, code, store_history, silent, cell_id, fail):
        """The cell ends with the error FAIL ({ename, evalue}) without running: its error is shown (the
        exception only: no traceback into the kernel), and history and counter move as for a cell that
        raised."""
        shell = self.shell
        ename = str(fail.get("ename") or "StoreUnavailable")
        evalue = str(fail.get("evalue") or "")
        etype = KeyboardInterrupt if ename == "KeyboardInterrupt" else type(ename, (Exception,), {})
        if store_history:
            shell.history_manager.store_inputs(shell.execution_count, code, code)
        res = ExecutionResult(ExecutionInfo(code, store_history, silent, False, cell_id))
        shell._last_traceback = None
        e = etype(evalue)
        res.error_in_exec = e
        shell._showtraceback(etype, e, shell.InteractiveTB.get_exception_only(etype, e))
        if store_history:
            shell.execution_count += 1
        return res

    def looseleaf_before_gpu(self, content, parent):
        if not content.get("prefetch") and self._note_pending:
            from . import keep
            if _auto_restore() and keep.pending(self.coherence):
                # The restored names are news to the gateway's analysis: this cell runs here, and its
                # metadata tells the analysis what it bound (coherence._fresh).
                self._restore_note = self.first_note()
                return dumps({"fallback": "the session was just restored (LOOSELEAF_RESTORE)"}), None
            note = self.first_note()
            if note:
                publish("stream", {"name": "stderr", "text": note})
        return dumps(self.coherence.before_gpu(content)), None

    def first_note(self):
        """Once per kernel, before its first cell: restore what an earlier kernel of this notebook left when
        LOOSELEAF_RESTORE says so (the summary is the note), else offer it.  The note's text, or None."""
        if not self._note_pending:
            note, self._restore_note = self._restore_note, None
            return note
        self._note_pending = False
        from . import keep
        try:
            if _auto_restore():
                res = keep.restore(self.coherence)
                if "error" in res:
                    return None
                self.coherence._fresh.update(res["restored"])
                self.coherence._fresh.update(_bound_by(res["imports"]))
                return keep.summary(res) + "\n"
            return keep.offer(self.coherence)
        except Exception as e:  # noqa: BLE001 - said; the cell runs on
            log.warning("restore at start failed", exc_info=True)
            return "LooseLeaf: restoring the previous kernel's variables failed: %s: %s\n" % (type(e).__name__, e)

    def looseleaf_after_gpu(self, content, parent):
        if self.debugger is not None:
            self.debugger.gpu_cell_ended()  # the worker's debug session ends with its cell
        return dumps(self.coherence.after_gpu(content)), None

    def looseleaf_debug_gpu(self, content, parent):
        """A GPU cell is about to go to its worker: {"debug": {...}} when it runs under the debugger there."""
        on = self.debugger.gpu_cell_starting() if self.debugger is not None else None
        return dumps({"debug": on} if on else {}), None

    def looseleaf_debug_worker(self, content, parent):
        """The worker's pydevd listens (debugger.Debugger.worker_listening); answered once attached."""
        if self.debugger is not None:
            self.debugger.worker_listening(content)
        return dumps({}), None

    def looseleaf_commit_idle(self, content, parent):
        return dumps(self.coherence.commit_idle()), None

    def looseleaf_commit_slow(self, content, parent):
        return dumps(self.coherence.commit_slow()), None

    def looseleaf_home_lost(self, content, parent):
        return dumps(self.coherence.home_lost(content)), None

    def _flush_streams(self):
        flush_streams()
        _lk.stream_flush()

    # -- stdin --------------------------------------------------------------

    def _input_request(self, prompt, password):
        self._flush_streams()
        try:
            value = _lk.input_request(str(prompt), bool(password))
        except RuntimeError as e:
            raise StdinNotImplementedError(str(e)) from None
        if value == "\x04":
            # The frontend's way of saying end of file (Ctrl-D).
            raise EOFError("EOF when reading a line")
        return value

    def raw_input(self, prompt=""):
        """input() of the user's code: a line from the frontend."""
        if not self.allow_stdin:
            raise StdinNotImplementedError(
                "raw_input was called, but this frontend does not support input requests."
            )
        return self._input_request(prompt, False)

    def getpass(self, prompt="Password: ", stream=None):
        """getpass.getpass of the user's code: a hidden line from the frontend."""
        if not self.allow_stdin:
            raise StdinNotImplementedError(
                "getpass was called, but this frontend does not support input requests."
            )
        if stream is not None:
            import warnings

            warnings.warn(
                "The `stream` parameter of `getpass.getpass` will have no effect "
                "when using the LooseLeaf kernel",
                UserWarning,
                stacklevel=2,
            )
        return self._input_request(prompt, True)

    # -- edit-time requests ---------------------------------------------

    def complete_request(self, content, parent):
        code, cursor_pos = _code_and_cursor(content)
        # Names of a package the kernel has not imported: from the index, never by importing it (unimported.py).
        quick = unimported.answer(code, cursor_pos, self.shell.user_ns)
        if quick is not None:
            return dumps(quick), None
        # variables GPU cells made or changed, as a CPU cell sees them
        with self.coherence.complete_view(code), unimported.imports_held():
            return self._complete(code, cursor_pos)

    def _complete(self, code, cursor_pos):
        if _HAVE_EXPERIMENTAL_COMPLETIONS:
            with provisionalcompleter():
                raw = self.shell.Completer.completions(code, cursor_pos)
                completions = list(rectify_completions(code, raw))
                comps = [
                    {"start": c.start, "end": c.end, "text": c.text, "type": c.type,
                     "signature": c.signature}
                    for c in completions
                ]
            if completions:
                start, end = completions[0].start, completions[0].end
                matches = [c.text for c in completions]
            else:
                start = end = cursor_pos
                matches = []
            reply = {"matches": matches, "cursor_end": end, "cursor_start": start,
                     "metadata": {_EXPERIMENTAL_KEY: comps}, "status": "ok"}
        else:  # pragma: no cover
            line, offset = line_at_cursor(code, cursor_pos)
            txt, matches = self.shell.complete("", line, cursor_pos - offset)
            reply = {"matches": matches, "cursor_end": cursor_pos,
                     "cursor_start": cursor_pos - len(txt), "metadata": {}, "status": "ok"}
        return dumps(reply), None

    def inspect_request(self, content, parent):
        code, cursor_pos = _code_and_cursor(content)
        detail_level = content.get("detail_level", 0)
        if detail_level not in (0, 1):
            detail_level = 0
        omit = content.get("omit_sections", ())
        name = token_at_cursor(code, cursor_pos)
        self.coherence.refresh_for(name)
        reply = {"status": "ok", "data": {}, "metadata": {}}
        try:
            bundle = self.shell.object_inspect_mime(
                name, detail_level=detail_level, omit_sections=omit
            )
            reply["data"].update(bundle)
            if not self.shell.enable_html_pager:
                reply["data"].pop("text/html", None)
            reply["found"] = True
        except KeyError:
            reply["found"] = False
        return dumps(reply), None

    def is_complete_request(self, content, parent):
        code = content.get("code", "")
        if not isinstance(code, str):
            return self._error_json("BadRequest", "is_complete_request without a 'code' string")
        status, indent = self.shell.input_transformer_manager.check_complete(code)
        reply = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return dumps(reply), None

    # -- history ----------------------------------------------------------

    def history_request(self, content, parent):
        hm = self.shell.history_manager
        kind = content.get("hist_access_type")
        output = bool(content.get("output", False))
        raw = bool(content.get("raw", True))
        n = content.get("n")
        if kind == "tail":
            hist = hm.get_tail(n if isinstance(n, int) else 10, raw=raw, output=output,
                               include_latest=True)
        elif kind == "range":
            hist = hm.get_range(content.get("session", 0), content.get("start", 0),
                                content.get("stop"), raw=raw, output=output)
        elif kind == "search":
            hist = hm.search(content.get("pattern", "*"), raw=raw, output=output,
                             n=n if isinstance(n, int) else None,
                             unique=bool(content.get("unique", False)))
        else:
            hist = []
        return dumps({"status": "ok", "history": list(hist)}), None

    # -- kernel info, comms, shutdown ----------------------------------

    def kernel_info_request(self, content, parent):
        reply = {
            "status": "ok",
            "protocol_version": PROTOCOL_VERSION,
            "implementation": self.implementation,
            "implementation_version": self.implementation_version,
            "language_info": self.language_info,
            "banner": self.shell.banner,
            "help_links": HELP_LINKS,
            "debugger": self.debugger is not None,
            "supported_features": ["debugger"] if self.debugger is not None else [],
        }
        return dumps(reply), None

    def comm_info_request(self, content, parent):
        target = content.get("target_name")
        return dumps({"status": "ok", "comms": comms.comm_info(target)}), None

    def _comm_message(self, msg_type, content, parent):
        # The request itself, as the comm package's handlers expect it.
        return self.parent_header

    def _comm_args_ok(self, content, *keys):
        return all(isinstance(content.get(k), str) for k in keys)

    def _user_code(self, content):
        """The context a comm message's handler runs in: untracked user code, except on our own prefetch
        comm (hints for the gateway; its handler ignores them), which must not refresh or mark anything."""
        comm_id = content.get("comm_id")
        target = content.get("target_name") or getattr(self.comm_manager.comms.get(comm_id), "target_name", None)
        if target == comms.PREFETCH_TARGET:
            return contextlib.nullcontext()
        if self.on_subshell():
            return self._subshell_code("")
        return self.coherence.untracked_code()

    def comm_open(self, content, parent):
        if self._comm_args_ok(content, "comm_id", "target_name"):
            with self._user_code(content):
                self.comm_manager.comm_open(None, None, self._comm_message("comm_open", content, parent))
        else:
            log.warning("comm_open without comm_id/target_name ignored")
        return None, None

    def comm_msg(self, content, parent):
        if self._comm_args_ok(content, "comm_id"):
            with self._user_code(content):
                self.comm_manager.comm_msg(None, None, self._comm_message("comm_msg", content, parent))
        return None, None

    def comm_close(self, content, parent):
        if self._comm_args_ok(content, "comm_id"):
            with self._user_code(content):
                self.comm_manager.comm_close(None, None, self._comm_message("comm_close", content, parent))
        return None, None

    def shutdown_request(self, content, parent):
        restart = bool(content.get("restart", False))
        self.restarting = restart
        self.shell.exit_now = True
        return dumps({"status": "ok", "restart": restart}), None



def _request_handlers(kernel, types):
    """{msg_type: bound method of KERNEL named msg_type} for each of TYPES; RuntimeError naming every type
    KERNEL has no handler for."""
    missing = [t for t in types if not callable(getattr(kernel, t, None))]
    if missing:
        raise RuntimeError("the gateway forwards %s to the interpreter, which has no handler for %s"
                           % (", ".join(missing), "it" if len(missing) == 1 else "them"))
    return {t: getattr(kernel, t) for t in types}


def _profile_config():
    """ipython_config.py and ipython_kernel_config.py of the default profile,
    which ipykernel's IPKernelApp loads too (a user's InlineBackend or
    InteractiveShell settings must apply here as well)."""
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir
    from traitlets.config.loader import PyFileConfigLoader

    config = Config()
    try:
        location = ProfileDir.find_profile_dir_by_name(get_ipython_dir(), "default").location
    except Exception:
        return config
    for name in ("ipython_config.py", "ipython_kernel_config.py"):
        if os.path.isfile(os.path.join(location, name)):
            try:
                config.merge(PyFileConfigLoader(name, path=location).load_config())
            except Exception:
                log.error("config file %s failed:\n%s", name, traceback.format_exc())
    return config


_kernel = None
_fork_keepalive = []  # the parent's sqlite connections, never closed in a child


def get_kernel():
    return _kernel


def start():
    """Create the kernel (called once by ll_interp_init)."""
    global _kernel
    if _kernel is None:
        _kernel = Kernel()
    return _kernel


def handle(msg_type, content_json, parent_json, metadata_json="{}", buffers=(), route_json=None):
    return _kernel.handle(msg_type, content_json, parent_json, metadata_json, buffers, route_json)


def debug_request(request_json):
    """A debug_request's content (JSON text) -> the debug_reply's; on the gateway's control thread."""
    from . import debugger
    return debugger.request(request_json)


def _auto_restore():
    """LOOSELEAF_RESTORE (the kernelspec's env): restore an earlier kernel's variables before the first cell."""
    return os.environ.get("LOOSELEAF_RESTORE", "").strip().lower() in ("1", "yes", "true", "on", "auto")


def _bound_by(stmts):
    """The names import statements bind."""
    import ast
    out = set()
    for stmt in stmts:
        try:
            for node in ast.parse(stmt).body:
                for a in getattr(node, "names", []):
                    out.add(a.asname or a.name.partition(".")[0])
        except SyntaxError:
            pass
    return out


def shutdown(restart=False):
    """Run exit handlers; return whether Python may be finalized (no live
    non-daemon thread that Py_FinalizeEx would wait for).  RESTART: the
    shutdown_request asked for a restart (the gateway says so): a store kept
    for the notebook stays for the next kernel (keep.py)."""
    import atexit
    import threading

    # IPython registered its atexit_operations (history saved, temp files
    # removed); run them now, while the hooks still work.
    atexit._run_exitfuncs()
    if _kernel is not None:
        # The session's store: its pool file would keep its memory (a restart keeps a notebook's).
        _kernel.coherence.close(keep_store=restart or getattr(_kernel, "restarting", False))
        # The session's cell sources (shell.CellCompiler), if this kernel made the directory.
        from .shell import CellCompiler
        d = CellCompiler._dir
        if d and d.endswith("_%d" % os.getpid()):
            import shutil
            shutil.rmtree(d, ignore_errors=True)
    main = threading.main_thread()
    return not any(
        t.is_alive() and not t.daemon and t is not main for t in threading.enumerate()
    )

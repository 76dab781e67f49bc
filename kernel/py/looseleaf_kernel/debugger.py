"""JupyterLab's debugger for CPU cells: debug_request on control, debug_event on iopub.

Threads.  debug_request() runs on the gateway's control thread (ll_interp_debug takes the GIL there), while a
cell may run, or sit stopped at a breakpoint, on the interpreter thread.  It forwards most requests to debugpy's
adapter (a subprocess started by debugpy.listen) over one TCP connection and waits for the answer with the GIL
released; a reader thread parses what comes back (responses to the waiting request, events), and an event thread
handles events (a "stopped" event first asks debugpy which threads stopped, which needs the reader) and publishes
them as debug_event.  pydevd, inside this process, traces the interpreter thread: a breakpoint parks that thread
in pydevd's wait loop, which sleeps with the GIL released, so the control thread and pydevd's own threads go on.

What the frontend sees follows ipykernel 7's debugger message by message (its requests, the replies' shapes, the
variables it hides); cells are compiled under the names dumpCell gives (shell.CellCompiler: Murmur2 of the raw
cell, as ipykernel names them), so breakpoints set in a cell's editor match the code that runs, in the cell and in
functions it defines that later cells call.

GPU cells run in workers.  When the session's debugger is attached, the gateway asks
gpu_cell_starting before it hands a GPU cell to its worker, and the job then says so; the worker starts pydevd
after the fork (zygote/py/looseleaf_zygote/debug.py: debugpy's in-process adapter, so pydevd itself answers the
Debug Adapter Protocol), says where it listens, and waits.  worker_listening (on the interpreter thread, from the
gateway's relay) connects to it, initializes and attaches as the frontend did, replays the session's breakpoints
and exception filters, and sends configurationDone: the cell starts.  Until the cell ends (gpu_cell_ended, from
looseleaf_after_gpu) the frontend's requests go to the worker (setBreakpoints to both: the kernel keeps them for
later cells), and the worker's events come back as debug_event.  The worker compiles the cell under the same name
(the session's cell directory), so its frames show the cell's file as dumpCell named it.  Between cells the
variable explorer lists the kernel's namespace, and what GPU cells made that the kernel does not hold as
committed by the workers' account of what they saved (coherence.worker_made: type, and a tensor's device, shape
and dtype), without restoring it."""

import importlib.util
import itertools
import json
import logging
import os
import re
import socket
import sys
import threading

from .shell import CellCompiler, get_file_name

log = logging.getLogger("looseleaf_kernel.debugger")

HASH_SEED = 0xC70F6907  # ipykernel's (compiler.get_tmp_hash_seed): JupyterLab hashes cells with what debugInfo says
REPLY_TIMEOUT_S = 30.0  # a request debugpy never answers must not hold the control channel for good

# Imported only when a frontend starts the debugger: zygotes run this package too, and must stay single-threaded
# and quick to start (pydevd is large).
available = importlib.util.find_spec("debugpy") is not None


def _pydevd():
    """pydevd's variable machinery (ipykernel's VariableExplorer uses the same)."""
    from debugpy.server import api  # noqa: F401  (sets up the _pydevd_bundle imports)
    from _pydevd_bundle import pydevd_frame_utils
    from _pydevd_bundle.pydevd_api import PyDevdAPI
    from _pydevd_bundle.pydevd_suspended_frames import SuspendedFramesManager, _FramesTracker
    return pydevd_frame_utils, PyDevdAPI, SuspendedFramesManager, _FramesTracker


# Names the variable explorer hides (ipykernel's list: IPython's bookkeeping, not the user's variables).
_HIDDEN = frozenset([
    "__name__", "__doc__", "__package__", "__loader__", "__spec__", "__annotations__", "__builtins__",
    "__builtin__", "__display__", "get_ipython", "debugpy", "exit", "quit", "In", "Out", "_oh", "_dh", "_", "__",
    "___",
])


def accept_variable(name):
    return name not in _HIDDEN and not re.match(r"^_\d", name) and name[0:2] != "_i"


class _FakeCode:
    def __init__(self, co_filename, co_name):
        self.co_filename = co_filename
        self.co_name = co_name


class _FakeFrame:
    """The user namespace as a frame, so pydevd's variable machinery lists it between cells."""

    def __init__(self, f_code, f_globals, f_locals):
        self.f_code = f_code
        self.f_globals = f_globals
        self.f_locals = f_locals
        self.f_back = None


class _VariableExplorer:
    """The user namespace's variables, with pydevd's references, while nothing is stopped."""

    def __init__(self, user_ns):
        pydevd_frame_utils, PyDevdAPI, SuspendedFramesManager, _FramesTracker = _pydevd()

        class _PyDB:
            variable_presentation = PyDevdAPI.VariablePresentation()

        self.manager = SuspendedFramesManager()
        self.tracker = _FramesTracker(self.manager, _PyDB())
        self.frame = _FakeFrame(_FakeCode("<module>", get_file_name("sys._getframe()")), user_ns, user_ns)
        self.tracker.track("thread1", pydevd_frame_utils.create_frames_list_from_frame(self.frame))

    def untrack(self):
        self.tracker.untrack_all()

    def children(self, ref=None):
        variables = self.manager.get_variable(ref or id(self.frame))
        return [v.get_var_data() for v in variables.get_children_variables()]


# -- tensors in the variable explorer ----------------------------------------

TENSOR_PREVIEW = 100  # leading elements a tensor's expansion shows (copied to the host: a few, never the tensor)


def tensor_summary(t):
    """A tensor as the variable explorer's value column shows it: what a GPU user checks first (device, shape,
    dtype), without printing (or copying to the host) its data."""
    text = "Tensor(shape=%s, dtype=%s, device=%s" % (tuple(t.shape), t.dtype, t.device)
    if t.requires_grad:
        text += ", requires_grad=True"
    return text + ")"


def _tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


class _TensorStr:
    """pydevd's string for a tensor in the variables list (context None); evaluate, hover and the clipboard
    (repl, hover, clipboard, watch) keep its repr."""

    def can_provide(self, type_object, type_name):
        tensor = _tensor_type()
        return tensor is not None and isinstance(type_object, type) and issubclass(type_object, tensor)

    def get_str(self, o):
        return tensor_summary(o)

    def get_str_in_context(self, o, context):
        return tensor_summary(o) if context is None else None


class _DeviceStr:
    """A torch.device as the user writes it ("cuda:0", "cpu"), not device(type='cuda', index=0)."""

    def can_provide(self, type_object, type_name):
        torch = sys.modules.get("torch")
        return torch is not None and type_object is getattr(torch, "device", None)

    def get_str(self, o):
        return str(o)


class _TensorChildren(_TensorStr):
    """A tensor's expansion: device, shape, dtype, requires_grad, grad_fn, numel, its first elements
    (flattened), and pydevd's usual attribute listing under __internals__."""

    def _fields(self, t):
        # device, shape and dtype as text: JupyterLab's variables tree (its default view) shows the value of an
        # int, float, bool or str and only the type name of anything else, so a torch.device, a tuple and a
        # torch.dtype would read "device", "tuple", "dtype" there (the objects are under __internals__).
        out = {"device": str(t.device), "shape": str(tuple(t.shape)), "dtype": str(t.dtype),
               "requires_grad": t.requires_grad, "numel": t.numel()}
        if t.grad_fn is not None:
            out["grad_fn"] = type(t.grad_fn).__name__
        return out

    def _preview(self, t):
        n = min(t.numel(), TENSOR_PREVIEW)
        try:
            return t.detach().reshape(-1)[:n].tolist()
        except Exception as e:  # a meta or sparse tensor
            return "(no preview: %s)" % e

    def resolve(self, t, attribute):
        from _pydevd_bundle.pydevd_resolver import defaultResolver
        if attribute == "__internals__":
            return defaultResolver.get_dictionary(t)
        if attribute.startswith("["):
            return self._preview(t)
        return self._fields(t).get(attribute)

    def get_dictionary(self, t):
        from _pydevd_bundle.pydevd_resolver import defaultResolver
        out = self._fields(t)
        out["[0:%d] (flattened)" % min(t.numel(), TENSOR_PREVIEW)] = self._preview(t)
        out["__internals__"] = defaultResolver.get_dictionary(t)
        return out


def install_tensor_view():
    """Tensors in pydevd's variables (the debugger's, in the kernel or a GPU cell's worker) as a GPU user reads
    them: device, shape and dtype in the value column, without the data's repr (a CUDA tensor's repr copies it
    to the host and syncs the device).  pydevd takes providers from plugin packages only; these go first into
    the lists it keeps of them."""
    from debugpy.server import api  # noqa: F401  (sets up the _pydevd_bundle imports)
    from _pydevd_bundle import pydevd_extension_utils
    from _pydevd_bundle.pydevd_extension_api import StrPresentationProvider, TypeResolveProvider
    for kind, provider in ((TypeResolveProvider, _TensorChildren), (StrPresentationProvider, _TensorStr),
                           (StrPresentationProvider, _DeviceStr)):
        providers = pydevd_extension_utils.extensions_of_type(kind)
        if not any(type(p) is provider for p in providers):
            providers.insert(0, provider())


def _daemon(target, name):
    t = threading.Thread(target=target, name=name, daemon=True)
    # pydevd neither traces these nor lists them among the debuggee's threads.
    t.is_pydev_daemon_thread = True
    t.pydev_do_not_trace = True
    t.start()
    return t


class _Connection:
    """One DAP connection to debugpy's adapter: framed JSON both ways, replies matched to their request."""

    def __init__(self, host, port, on_event, on_response):
        self.sock = socket.create_connection((host, port), timeout=REPLY_TIMEOUT_S)
        self.sock.settimeout(None)
        self.on_event = on_event
        self.on_response = on_response  # called in arrival order, before any later message is read
        self.lock = threading.Condition()
        self.replies = {}  # (request_seq, command) -> response
        self.closed = False
        self.send_lock = threading.Lock()
        _daemon(self._read_loop, "looseleaf-debug-reader")

    def _read_loop(self):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = None
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length is None:
                    log.warning("debugpy sent a frame without Content-Length: dropped")
                    continue
                while len(buf) < length:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                try:
                    msg = json.loads(body)
                except ValueError:
                    log.warning("debugpy sent a frame that is not JSON: dropped")
                    continue
                if msg.get("type") == "event":
                    self.on_event(msg)
                elif msg.get("type") == "response":
                    self.on_response(msg)
                    with self.lock:
                        self.replies[(msg.get("request_seq"), msg.get("command"))] = msg
                        self.lock.notify_all()
        except OSError:
            pass
        finally:
            with self.lock:
                self.closed = True
                self.lock.notify_all()

    def send(self, msg):
        body = json.dumps(msg, ensure_ascii=False, allow_nan=False).encode("utf-8")
        with self.send_lock:
            self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def wait(self, seq, command, timeout=REPLY_TIMEOUT_S):
        """The response to request SEQ/COMMAND, or None (timed out, or the adapter went away)."""
        key = (seq, command)
        with self.lock:
            ok = self.lock.wait_for(lambda: key in self.replies or self.closed, timeout)
            return self.replies.pop(key, None) if ok else None

    def request(self, msg):
        self.send(msg)
        return self.wait(msg.get("seq"), msg.get("command"))

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _response(req, success=True, body=None, **extra):
    reply = {"type": "response", "request_seq": req.get("seq"), "success": success, "command": req.get("command")}
    if body is not None:
        reply["body"] = body
    reply.update(extra)
    return reply


class Debugger:
    """The kernel's debugger (one per kernel; see the module's docstring)."""

    # Served even while no debug session is started (JupyterLab asks debugInfo on every kernel it meets).
    STATIC = ("debugInfo", "inspectVariables", "richInspectVariables", "modules", "copyToGlobals")

    def __init__(self, shell, kernel_modules, coherence=None):
        self.shell = shell
        # The kernel's coherence now (None before the first GPU cell), for what GPU cells made: a function,
        # since a restore replaces it (and the kernel module is above this one).
        self.coherence = coherence or (lambda: None)
        self.kernel_modules = kernel_modules  # files of what the kernel imported at start: stepping skips them
        self.started = False
        self.endpoint = None  # (host, port) of debugpy's adapter, once listening
        self.conn = None
        self.breakpoints = {}  # source path -> [{"line": n}], as debugpy placed them
        self.stopped_threads = set()
        self.init_event = threading.Event()
        self.init_seq = -1
        self.attached = False
        self.explorer = None
        self.events = []  # events for the event thread
        self.events_cv = threading.Condition()
        self.removed_cleanup = {}
        self.lock = threading.RLock()  # one request at a time (control is one thread; this is for safety)
        self.event_thread = None  # started with the first debug session
        # Sequence numbers of the kernel's own requests to debugpy, apart from the frontend's (replies are
        # matched by request_seq and command).
        self.own_seq = itertools.count(1 << 30)
        self.resuming = {}  # seq of a resuming request in flight -> its threadId
        # The running GPU cell's worker: a DAP connection to its pydevd while the cell runs, else None.
        self.worker = None
        self.worker_pid = None
        self.worker_init = threading.Event()
        self.gpu_token = 0  # the GPU cell whose worker may attach (a late worker of an earlier one may not)
        self.init_args = None  # the frontend's initialize arguments, replayed to each worker
        self.bp_args = {}  # source path -> the frontend's last setBreakpoints arguments, replayed likewise
        self.exc_args = None  # the frontend's last setExceptionBreakpoints arguments

    # -- events -----------------------------------------------------------

    def _on_event(self, msg, conn=None):
        with self.events_cv:
            self.events.append((conn, msg))
            self.events_cv.notify()

    def _event_loop(self):
        while True:
            with self.events_cv:
                self.events_cv.wait_for(lambda: self.events)
                conn, msg = self.events.pop(0)
            try:
                self._handle_event(msg, conn)
            except Exception:
                log.exception("debug event %r failed", msg.get("event"))

    WORKER = object()  # the origin of a worker's events that came before its connection object was made

    def _handle_event(self, msg, worker=None):
        event, body = msg.get("event"), msg.get("body") or {}
        if worker is not None and event == "initialized":
            self.worker_init.set()  # the worker's pydevd, to worker_listening (not the frontend's business)
            return
        if worker is self.WORKER:
            worker = self.worker
        if event == "initialized":
            self.init_seq = msg.get("seq", 0)
            self.init_event.set()
        elif event == "stopped":
            if body.get("allThreadsStopped"):
                # Which threads stopped: ask debugpy (the event names one), as ipykernel does.
                conn = worker or self.conn
                rep = conn.request({"seq": next(self.own_seq), "type": "request", "command": "threads"}) \
                    if conn else None
                for t in ((rep or {}).get("body") or {}).get("threads", []):
                    if t.get("name") not in ("IPythonHistorySavingThread",):
                        self.stopped_threads.add(t.get("id"))
            else:
                self.stopped_threads.add(body.get("threadId"))
        elif event == "continued":
            if body.get("allThreadsContinued", True):
                self.stopped_threads = set()
            else:
                self.stopped_threads.discard(body.get("threadId"))
        self._publish(msg)

    def _publish(self, msg):
        from .display import publish
        publish("debug_event", msg)

    # -- start and stop ------------------------------------------------------

    def _listen(self):
        import debugpy
        if self.endpoint is None:
            # subProcess: do not inject debugpy into the Python processes cells start.  The adapter runs with
            # the interpreter of the kernel's environment, which has debugpy.
            python = os.environ.get("LOOSELEAF_PYTHON") or sys.executable
            debugpy.configure(python=python, subProcess=False)
            host, port = debugpy.listen(("127.0.0.1", 0))
            self.endpoint = (host, port)
            install_tensor_view()
        return self.endpoint

    def start(self):
        if self.event_thread is None:
            self.event_thread = _daemon(self._event_loop, "looseleaf-debug-events")
        try:
            host, port = self._listen()
            self.conn = _Connection(host, port, self._on_event, self._on_response)
        except Exception as e:
            log.warning("the debugger cannot start: %s", e)
            return False
        self.init_event.clear()
        self.attached = False
        # IPython imports asttokens at a cell's first traceback, and its import raises and catches exceptions:
        # with "pause on raised exceptions" the first failing cell would stop inside it (it does on ipykernel).
        try:
            import asttokens  # noqa: F401
        except ImportError:
            pass
        # Keep a cell's leading empty lines while debugging, so breakpoints land on the lines the editor shows.
        from IPython.core.inputtransformer2 import leading_empty_lines
        cleanup = self.shell.input_transformer_manager.cleanup_transforms
        if leading_empty_lines in cleanup:
            i = cleanup.index(leading_empty_lines)
            self.removed_cleanup[i] = cleanup.pop(i)
        return True

    def stop(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        cleanup = self.shell.input_transformer_manager.cleanup_transforms
        for i in sorted(self.removed_cleanup):
            cleanup.insert(i, self.removed_cleanup.pop(i))

    def trace_this_thread(self, on=True):
        """On the interpreter thread: pydevd traces it while a cell runs (breakpoints hit there), and not while
        the kernel's own requests run there (an idle commit importing the store would stop at every exception
        numpy raises and catches while it loads, with "pause on raised exceptions" on)."""
        if self.started and self.endpoint is not None:
            import debugpy
            try:
                if on:
                    debugpy.debug_this_thread()
                else:
                    debugpy.trace_this_thread(False)
            except Exception:
                log.warning("cannot switch tracing of the interpreter thread", exc_info=True)

    def cell_ended(self):
        """Called on the interpreter thread once a cell has ended.  A cell interrupted while stopped at a
        breakpoint leaves pydevd's wait loop by the KeyboardInterrupt, with the thread still marked suspended:
        pydevd would park the next cell at its first line, waiting for a "continue" nobody sends (the frontend
        saw the cell end).  So the thread is marked running again, and the frontend told so."""
        if not self.started:
            return
        self.trace_this_thread(False)
        info = getattr(threading.current_thread(), "additional_info", None)
        try:
            from _pydevd_bundle.pydevd_constants import STATE_RUN, STATE_SUSPEND
        except ImportError:
            return
        if info is None or getattr(info, "pydev_state", None) != STATE_SUSPEND:
            return
        info.pydev_state = STATE_RUN
        info.pydev_step_cmd = -1
        info.pydev_original_step_cmd = -1
        info.pydev_step_stop = None
        stopped, self.stopped_threads = self.stopped_threads, set()
        self._publish({"type": "event", "event": "continued", "seq": 0,
                       "body": {"threadId": min(stopped) if stopped else 1, "allThreadsContinued": True}})

    # -- GPU cells: the worker's pydevd -----------------------------------

    def gpu_cell_starting(self):
        """The gateway hands a GPU cell to a worker: what its job says of the debugger (None: off)."""
        self.gpu_cell_ended()  # a worker session whose cell's end went unseen
        if not (self.started and self.attached):
            return None
        self.gpu_token += 1
        return {"token": self.gpu_token}

    def _worker_rules(self, skip):
        """What stepping skips in a worker: the kernel's own files, the worker's packages (the cell runs under
        looseleaf_zygote's wrapper, which the kernel never imports), and SKIP, what the worker held before the
        cell (debug._own_paths)."""
        rules = [{"path": path, "include": False} for path in self.kernel_modules]
        rules += [{"path": path, "include": False} for path in skip if isinstance(path, str)]
        for pkg in ("looseleaf_zygote", "looseleaf_store", "looseleaf_kernel"):
            spec = importlib.util.find_spec(pkg)
            for d in (spec.submodule_search_locations or []) if spec else []:
                rules.append({"path": d, "include": False})
        return rules

    def worker_listening(self, content):
        """The GPU cell's worker listens (CONTENT: host, port, pid, token, skip), its cell waiting: attach as
        the frontend did, replay the session's breakpoints and exception filters, configurationDone (the cell
        starts).  On the interpreter thread, from the gateway's relay.  A worker nobody debugs any more (the
        frontend disconnected since the cell started, or it is a late one of an earlier cell) is configured
        without breakpoints and let go at once, rather than left waiting for its timeout."""
        with self.lock:
            wanted = self.started and self.attached and self.worker is None and \
                content.get("token") == self.gpu_token
            mute = [not wanted]  # a worker let go: its events are not the frontend's

            def on_event(msg):
                if not mute[0] or msg.get("event") == "initialized":
                    self._on_event(msg, holder[0] if holder else self.WORKER)

            holder = []  # the connection, for its events (the reader starts at once)
            try:
                self.worker_init.clear()
                conn = _Connection(str(content["host"]), int(content["port"]), on_event, self._on_response)
                holder.append(conn)
            except (OSError, KeyError, ValueError, TypeError) as e:
                log.warning("cannot attach to the GPU cell's worker: %s", e)
                return
            ok = False
            try:
                skip = content.get("skip")
                ok = self._configure_worker(conn, skip if isinstance(skip, list) else [], wanted)
            finally:
                if ok and wanted:
                    self.worker, self.worker_pid = conn, content.get("pid")
                else:
                    if not ok:
                        log.warning("the GPU cell's worker did not take the debugger's configuration")
                    mute[0] = True
                    self._end_session(conn)

    def _configure_worker(self, conn, skip, replay=True):
        """Attach to a worker's pydevd; with REPLAY the session's breakpoints and exception filters.  Whatever
        fails, configurationDone goes out when the connection is up, so the cell does not wait for it."""
        seq, sent = self.own_seq, set()

        def request(command, arguments):
            sent.add(command)
            rep = conn.request({"type": "request", "seq": next(seq), "command": command, "arguments": arguments})
            return rep is not None and rep.get("success")

        try:
            return self._configure_steps(conn, skip, replay, seq, request)
        finally:
            if "configurationDone" not in sent and not conn.closed:
                try:
                    conn.send({"type": "request", "seq": next(seq), "command": "configurationDone",
                               "arguments": {}})
                except OSError:
                    pass

    def _configure_steps(self, conn, skip, replay, seq, request):
        args = dict(self.init_args or {})
        args.setdefault("adapterID", "python")
        if not request("initialize", args):
            return False
        attach = {"type": "request", "seq": next(seq), "command": "attach",
                  "arguments": {"debugOptions": ["DebugStdLib"], "rules": self._worker_rules(skip)}}
        conn.send(attach)
        if not self.worker_init.wait(REPLY_TIMEOUT_S):
            return False
        for path, arguments in list(self.bp_args.items()) if replay else ():
            request("setBreakpoints", arguments)
        if self.exc_args is not None and replay:
            request("setExceptionBreakpoints", self.exc_args)
        request("configurationDone", {})
        rep = conn.wait(attach["seq"], "attach")
        return rep is not None and rep.get("success")

    def gpu_cell_ended(self):
        """The GPU cell's reply is in: its worker's session ends (pydevd there resumes and drops its
        breakpoints; the warm worker's next debugged cell attaches again)."""
        with self.lock:
            self._drop_worker()

    def _drop_worker(self):
        conn, self.worker = self.worker, None
        if conn is None:
            return
        self._end_session(conn)
        if self.stopped_threads:
            # Interrupted at a breakpoint, or the worker died there: the frontend must not show it stopped.
            stopped, self.stopped_threads = self.stopped_threads, set()
            self._publish({"type": "event", "event": "continued", "seq": 0,
                           "body": {"threadId": min(stopped), "allThreadsContinued": True}})

    def _end_session(self, conn):
        """Disconnect from a worker's pydevd (it resumes, drops its breakpoints, and may be attached again)."""
        try:
            seq = next(self.own_seq)
            conn.send({"type": "request", "seq": seq, "command": "disconnect",
                       "arguments": {"restart": False, "terminateDebuggee": False}})
            conn.wait(seq, "disconnect", timeout=5.0)
        except OSError:
            pass
        conn.close()

    # -- the entry --------------------------------------------------------

    def process(self, message):
        with self.lock:
            return self._process(message)

    def _process(self, message):
        command = message.get("command")
        reply = {}
        if command == "initialize":
            self.init_args = dict(message.get("arguments") or {})
            if not self.started:
                self.started = self.start()
                if not self.started:
                    return {"command": "initialize", "request_seq": message.get("seq"), "seq": 3,
                            "success": False, "type": "response"}
        handler = getattr(self, "_" + command, None) if isinstance(command, str) else None
        if command in self.STATIC:
            reply = handler(message)
        elif self.started:
            if handler is not None and command in ("dumpCell", "setBreakpoints", "source", "stackTrace",
                                                   "variables", "attach", "configurationDone"):
                reply = handler(message)
            else:
                if command in self.RESUMING:
                    self.resuming[message.get("seq")] = (message.get("arguments") or {}).get("threadId")
                reply = self._forward(message)
                self.resuming.pop(message.get("seq"), None)
        else:
            # ipykernel answers {} here; a DAP error says why to the frontend.
            reply = _response(message, False, message="the debugger is not started (send initialize first)")
        if command == "setExceptionBreakpoints" and self.started:
            self.exc_args = message.get("arguments")
            if self.worker is not None:
                self._forward(message, self.conn)  # the kernel's too: later CPU cells
        if command == "disconnect":
            if self.worker is not None:
                self._forward(message, self.conn)
            self._drop_worker()
            self.bp_args = {}
            self.exc_args = None
            self.stop()
            self.breakpoints = {}
            self.stopped_threads = set()
            self.started = False
        return reply

    # Requests that resume stopped threads.  debugpy sends no "continued" event for a continue the client asked
    # for (the DAP says adapters need not), so ipykernel keeps such threads as stopped after the cell has ended,
    # and then sends the variable explorer's requests to debugpy instead of reading the namespace: here the
    # response itself says which threads go on.  It is read on the reader thread, before the "stopped" event
    # that may follow at once (the next breakpoint, the end of a step), so that event is never undone.
    RESUMING = ("continue", "next", "stepIn", "stepOut", "stepBack", "reverseContinue", "goto")

    def _on_response(self, msg):
        if msg.get("command") not in self.RESUMING or not msg.get("success"):
            return
        thread = self.resuming.get(msg.get("request_seq"))
        if (msg.get("body") or {}).get("allThreadsContinued", msg.get("command") == "continue"):
            self.stopped_threads = set()
        else:
            self.stopped_threads.discard(thread)

    def _forward(self, message, conn=None):
        """MESSAGE to the debuggee: the running GPU cell's worker if any, else the kernel's debugpy."""
        conn = conn or self.worker or self.conn
        rep = conn.request(message) if conn is not None else None
        if rep is None:
            return _response(message, False, message="debugpy did not answer")
        return rep

    # -- handlers ---------------------------------------------------------

    def _dumpCell(self, message):
        code = message["arguments"]["code"]
        path = get_file_name(code)
        CellCompiler.write_source(path, code)
        return _response(message, body={"sourcePath": path})

    def _setBreakpoints(self, message):
        source = message["arguments"]["source"]["path"]
        self.breakpoints[source] = message["arguments"].get("breakpoints", [])
        self.bp_args[source] = message["arguments"]
        rep = self._forward(message, self.conn)  # the kernel keeps every breakpoint, for later cells
        if rep.get("success"):
            # debugpy may move a breakpoint to another line: keep where it really is.
            self.breakpoints[source] = [{"line": b["line"]} for b in rep["body"]["breakpoints"]]
        if self.worker is not None:
            # Set while a GPU cell runs: its worker too (the answer the frontend sees, the cell's code being
            # there).
            wrep = self._forward(message, self.worker)
            if wrep.get("success"):
                return wrep
        return rep

    def _source(self, message):
        path = message["arguments"]["source"]["path"]
        try:
            with open(path, encoding="utf-8") as f:
                return _response(message, body={"content": f.read()})
        except (OSError, UnicodeDecodeError):
            return _response(message, False, body={}, message="source unavailable")

    def _stackTrace(self, message):
        return self._forward(message)

    def _variables(self, message):
        if not self.stopped_threads:
            if self.explorer is None:
                self.explorer = _VariableExplorer(self.shell.user_ns)
            try:
                variables = self.explorer.children(message["arguments"]["variablesReference"])
            except KeyError:
                variables = []
            return self._variables_response(message, variables)
        rep = self._forward(message)
        if rep.get("success"):
            rep["body"]["variables"] = [v for v in rep["body"]["variables"] if accept_variable(v["name"])]
        return rep

    @staticmethod
    def _variables_response(message, variables):
        return {"seq": message.get("seq"), "type": "response", "request_seq": message.get("seq"), "success": True,
                "command": message.get("command"),
                "body": {"variables": [v for v in variables if accept_variable(v["name"])]}}

    def _attach(self, message):
        host, port = self.endpoint
        args = message.setdefault("arguments", {})
        args["connect"] = {"host": host, "port": port}
        args["debugOptions"] = ["DebugStdLib"]
        args["rules"] = [{"path": path, "include": False} for path in self.kernel_modules]
        conn = self.conn
        conn.send(message)
        if self.attached:
            return conn.wait(message.get("seq"), "attach") or _response(message, False, message="no answer")
        # debugpy answers attach only once configured: wait for "initialized", send configurationDone
        # ourselves (the frontend's comes later and is answered here), then the attach response.
        if not self.init_event.wait(REPLY_TIMEOUT_S):
            return _response(message, False, message="debugpy did not initialize")
        done = {"type": "request", "seq": int(self.init_seq) + 1, "command": "configurationDone"}
        conn.request(done)
        rep = conn.wait(message.get("seq"), "attach")
        self.attached = rep is not None
        return rep or _response(message, False, message="debugpy did not answer attach")

    def _configurationDone(self, message):
        return {"seq": message.get("seq"), "type": "response", "request_seq": message.get("seq"), "success": True,
                "command": message.get("command")}

    def _debugInfo(self, message):
        return _response(message, body={
            "isStarted": self.started,
            "hashMethod": "Murmur2",
            "hashSeed": HASH_SEED,
            "tmpFilePrefix": CellCompiler.session_dir() + os.sep,
            "tmpFileSuffix": ".py",
            "breakpoints": [{"source": k, "breakpoints": v} for k, v in self.breakpoints.items()],
            "stoppedThreads": sorted(self.stopped_threads),
            "richRendering": True,
            "exceptionPaths": ["Python Exceptions"],
            "copyToGlobals": True,
        })

    def _worker_made(self):
        """{name: (type, value)} of what GPU cells made that the kernel does not hold (coherence.worker_made)."""
        coherence = self.coherence()
        try:
            return coherence.worker_made() if coherence is not None else {}
        except Exception:  # noqa: BLE001 - the explorer lists the namespace alone
            log.warning("cannot list what GPU cells made", exc_info=True)
            return {}

    def _inspectVariables(self, message):
        if self.explorer is not None:
            self.explorer.untrack()
        self.explorer = _VariableExplorer(self.shell.user_ns)
        variables = self.explorer.children()
        # What GPU cells made lives in the store (and their workers): listed by the workers' account, as they
        # saved it, without restoring it here (a CUDA tensor cannot come to the kernel; a large one would be
        # mapped for a look).  Not expandable: a CPU cell or the variable's inspection brings it.
        made = self._worker_made()
        if made:
            variables = [v for v in variables if v.get("name") not in made]
            for name in sorted(made):
                type_name, value = made[name]
                short = type_name.rsplit(".", 1)[-1]
                variables.append({"name": name, "value": value if value is not None else "<%s>" % short,
                                  "type": short, "evaluateName": name, "variablesReference": 0})
        return self._variables_response(message, variables)

    def _richInspectVariables(self, message):
        reply = {"type": "response", "sequence_seq": message.get("seq"), "success": False,
                 "command": message.get("command")}
        name = message["arguments"]["variableName"]
        if not name.isidentifier():
            reply["body"] = {"data": {}, "metadata": {}}
            reply["success"] = name in ("special variables", "function variables")
            return reply
        data, metadata = {}, {}
        made = self._worker_made().get(name) if not self.stopped_threads else None
        if made is not None and made[1] is not None:
            data = {"text/plain": made[1]}  # a GPU cell's, by its worker's account (not restored here)
        elif not self.stopped_threads:
            result = self.shell.user_expressions({name: name})[name]
            if result.get("status", "error") == "ok":
                data, metadata = result.get("data", {}), result.get("metadata", {})
        else:
            reply = self._forward({"type": "request", "command": "evaluate", "seq": message["seq"] + 1,
                                   "arguments": {"expression": "get_ipython().display_formatter.format(%s)" % name,
                                                 "frameId": message["arguments"].get("frameId"),
                                                 "context": "clipboard"}})
            if reply.get("success"):
                import ast
                try:
                    data, metadata = ast.literal_eval(reply["body"]["result"])
                except (ValueError, SyntaxError):
                    data, metadata = {"text/plain": reply["body"]["result"]}, {}
        reply["body"] = {"data": data, "metadata": {k: v for k, v in metadata.items() if k in data}}
        reply["success"] = True
        return reply

    def _copyToGlobals(self, message):
        args = message["arguments"]
        dst, src = args["dstVariableName"], args["srcVariableName"]
        if not dst.isidentifier() or not src.isidentifier():
            return _response(message, False,
                             message="dstVariableName and srcVariableName must be valid identifiers")
        return self._forward({"type": "request", "command": "setExpression", "seq": message["seq"] + 1,
                              "arguments": {"expression": "globals()['%s']" % dst, "value": src,
                                            "frameId": args["srcFrameId"]}})

    def _modules(self, message):
        modules = list(sys.modules.copy().values())
        args = message.get("arguments") or {}
        start = args.get("startModule", 0)
        count = args.get("moduleCount") or len(modules)
        mods = []
        for i in range(start, min(start + count, len(modules))):
            path = getattr(getattr(modules[i], "__spec__", None), "origin", None)
            if path and path.endswith(".py"):
                mods.append({"id": i, "name": modules[i].__name__, "path": path})
        return _response(message, body={"modules": mods, "totalModules": len(modules)})


_debugger = None


def install(shell, kernel_modules, coherence=None):
    global _debugger
    _debugger = Debugger(shell, kernel_modules, coherence) if available else None
    return _debugger


def get():
    return _debugger


def request(request_json):
    """One debug_request content (JSON text) -> its debug_reply content (JSON text)."""
    try:
        message = json.loads(request_json)
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        return json.dumps({"type": "response", "request_seq": None, "success": False, "command": None,
                           "message": "invalid debug_request: %s" % e})
    if _debugger is None:
        return json.dumps(_response(message, False, message="debugpy is not installed in the kernel's environment"))
    # This is the gateway's control thread (a "Dummy-N" thread to Python, the same object on every call): it is
    # the kernel's, not the debuggee's, so pydevd neither traces nor lists it (a stopped thread the frontend
    # would offer to inspect).
    me = threading.current_thread()
    if not getattr(me, "is_pydev_daemon_thread", False):
        me.name = "looseleaf-control"
        me.is_pydev_daemon_thread = True
        me.pydev_do_not_trace = True
    if not isinstance(message.get("command"), str):
        return json.dumps(_response(message, False, message="invalid debug_request: no command"), default=repr)
    try:
        reply = _debugger.process(message)
    except Exception as e:
        # Mostly a request missing what its command needs: a line, the traceback only when debugging.
        log.warning("debug request %r failed: %s: %s", message.get("command"), type(e).__name__, e)
        log.debug("debug request failed", exc_info=True)
        reply = _response(message, False, message="%s: %s" % (type(e).__name__, e))
    return json.dumps(reply, default=repr)

"""JupyterLab's debugger on CPU cells (issue 27, item 1), compared message by message with ipykernel 7.

Each kernel is driven the way JupyterLab's debugger panel drives it: debug_request on control (initialize, attach,
dumpCell, setBreakpoints, configurationDone, ...), a cell executed on shell that stops at a breakpoint, the
debug_events on iopub, the panel's requests while stopped (stackTrace, scopes, variables, stepping, rich
inspection, copyToGlobals, evaluate), the cell completing, the variable explorer between cells, disconnect, and a
second session.  The transcript of both kernels is normalized (sequence numbers, object references, the cells'
directory, which differ between any two runs) and compared step by step; assertions on LooseLeaf's own transcript
say what each step must show, so a step that fails on both kernels alike still fails the test.
"""
import os
import queue
import re
import time

import pytest
from jupyter_client.manager import start_new_kernel

TIMEOUT = int(__import__("os").environ.get("DBG_TIMEOUT", "60"))  # generous: a loaded test machine, debugpy's adapter starting

# A function defined by a cell run before the debugger starts; a breakpoint in it must hit when a later cell calls it.
DEF_CELL = "def add(p, q):\n    total = p + q\n    return total\n"
SETUP_CELL = "lst = [1, 2, 3]\nname = 'leaf'\n"
# The cell debugged: a breakpoint on line 2.
MAIN_CELL = "x = 1\ny = add(x, 2)\nz = y * 10\nprint(z)\n"
AFTER_CELL = "print(z + 1)\n"


class Session:
    """One kernel and a debugger client on it."""

    def __init__(self, kernel_name):
        self.km, self.kc = start_new_kernel(kernel_name=kernel_name, startup_timeout=TIMEOUT)
        self.seq = 0
        self.pending = []  # iopub debug_events not consumed yet
        self.event_parents = []  # (event, its parent's msg_type) of every debug_event seen, in order

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def control(self, msg_type, content):
        msg = self.kc.session.msg(msg_type, content)
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                reply = self.kc.control_channel.get_msg(timeout=1)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply
        raise AssertionError("no reply to %s on control" % msg_type)

    def debug(self, command, arguments=None):
        self.seq += 1
        request = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments or {}}
        reply = self.control("debug_request", request)
        assert reply["msg_type"] == "debug_reply"
        return reply["content"]

    def _pump(self, timeout):
        try:
            msg = self.kc.iopub_channel.get_msg(timeout=timeout)
        except queue.Empty:
            return
        if msg["msg_type"] == "debug_event":
            self._event(msg)

    def _event(self, msg):
        self.pending.append(msg["content"])
        self.event_parents.append((msg["content"].get("event"), msg["parent_header"].get("msg_type")))

    def wait_running(self, msg_id):
        """Until the cell MSG_ID has started (its execute_input), and a moment more so its loop runs."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                msg = self.kc.iopub_channel.get_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["msg_type"] == "debug_event":
                self._event(msg)
            elif msg["msg_type"] == "execute_input" and msg["parent_header"].get("msg_id") == msg_id:
                time.sleep(0.5)  # not a timing assertion: a pause earlier would stop on an earlier line
                return
        raise AssertionError("the cell did not start")

    def wait_event(self, name):
        """Consume debug_events up to the first NAME; return the stopped/continued ones among them (the rest
        (threads, modules) differ between any two kernels)."""
        deadline = time.monotonic() + TIMEOUT
        seen = []
        while time.monotonic() < deadline:
            while self.pending:
                ev = self.pending.pop(0)
                if ev["event"] in ("stopped", "continued"):
                    seen.append(ev)
                if ev["event"] == name:
                    return seen
            self._pump(1)
        raise AssertionError("no %s debug_event (saw %r)" % (name, seen))

    def execute(self, code):
        return self.kc.execute(code)

    def shell_reply(self, msg_id):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                reply = self.kc.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply
        raise AssertionError("no execute_reply")

    def run(self, code):
        reply = self.shell_reply(self.execute(code))
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply


def script(s, ours):
    """The debugger session JupyterLab would hold; returns [(step, content)]."""
    t = []
    info = s.control("kernel_info_request", {})["content"]
    t.append(("kernel_info.supported_features", "debugger" in info.get("supported_features", [])))
    s.run(DEF_CELL)
    s.run(SETUP_CELL)
    t.append(("debugInfo before", s.debug("debugInfo")))
    # The variable explorer before any debug session (JupyterLab shows it as soon as the panel opens).
    inspected = s.debug("inspectVariables")
    t.append(("inspectVariables", user_names(inspected)))
    t.append(("richInspectVariables", s.debug("richInspectVariables", {"variableName": "name"})))
    t.append(("richInspectVariables bad name", s.debug("richInspectVariables", {"variableName": "1x"})))
    t.append(("initialize", s.debug("initialize", {
        "clientID": "jupyterlab", "clientName": "JupyterLab", "adapterID": "python", "pathFormat": "path",
        "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True,
        "supportsVariablePaging": True, "supportsRunInTerminalRequest": True, "locale": "en"})))
    t.append(("attach", s.debug("attach")))
    main = s.debug("dumpCell", {"code": MAIN_CELL})
    t.append(("dumpCell", main))
    main_path = main["body"]["sourcePath"]
    def_path = s.debug("dumpCell", {"code": DEF_CELL})["body"]["sourcePath"]
    # The cell names JupyterLab computes (Murmur2): every tail length, and UTF-8 beyond ASCII.
    for code in ("a", "ab", "abc", "abcd", "s = 'é ü 𝔘 ✓'\n"):
        t.append(("dumpCell %r" % code, s.debug("dumpCell", {"code": code})))
    t.append(("setBreakpoints main", s.debug("setBreakpoints", {
        "source": {"path": main_path}, "breakpoints": [{"line": 2}], "sourceModified": False})))
    t.append(("setBreakpoints def", s.debug("setBreakpoints", {
        "source": {"path": def_path}, "breakpoints": [{"line": 2}], "sourceModified": False})))
    t.append(("debugInfo started", s.debug("debugInfo")))
    t.append(("configurationDone", s.debug("configurationDone")))
    # Started, nothing stopped: a variable the explorer listed expands from the namespace.
    inspected = s.debug("inspectVariables")
    ref = [v for v in inspected["body"]["variables"] if v["name"] == "lst"][0]["variablesReference"]
    t.append(("variables of lst", s.debug("variables", {"variablesReference": ref})))

    msg_id = s.execute(MAIN_CELL)
    t.append(("stopped at the cell's breakpoint", s.wait_event("stopped")))
    stack = s.debug("stackTrace", {"threadId": 1})
    t.append(("stackTrace in the cell", stack))
    frame = stack["body"]["stackFrames"][0]["id"]
    scopes = s.debug("scopes", {"frameId": frame})
    t.append(("scopes", scopes))
    glob = s.debug("variables", {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]})
    t.append(("variables of the cell", user_names(glob)))
    t.append(("debugInfo stopped", s.debug("debugInfo")))
    # The control channel answers while the cell is stopped (the interpreter thread is parked in pydevd).
    t.append(("kernel_info on control while stopped",
              s.control("kernel_info_request", {})["content"]["status"]))
    t.append(("richInspectVariables stopped",
              s.debug("richInspectVariables", {"variableName": "x", "frameId": frame})))

    t.append(("continue", s.debug("continue", {"threadId": 1})))
    t.append(("stopped in the earlier cell's function", s.wait_event("stopped")))
    stack = s.debug("stackTrace", {"threadId": 1})
    t.append(("stackTrace in add", stack))
    frame = stack["body"]["stackFrames"][0]["id"]
    scopes = s.debug("scopes", {"frameId": frame})
    local = s.debug("variables", {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]})
    t.append(("locals of add", local))

    t.append(("next", s.debug("next", {"threadId": 1})))
    t.append(("stopped after next", s.wait_event("stopped")))
    stack = s.debug("stackTrace", {"threadId": 1})
    frame = stack["body"]["stackFrames"][0]["id"]
    t.append(("line after next", [(f["name"], f["line"]) for f in stack["body"]["stackFrames"]]))
    scopes = s.debug("scopes", {"frameId": frame})
    local = s.debug("variables", {"variablesReference": scopes["body"]["scopes"][0]["variablesReference"]})
    t.append(("locals after next", local))
    t.append(("evaluate", s.debug("evaluate", {"expression": "total * 100", "frameId": frame, "context": "repl"})))
    t.append(("copyToGlobals", s.debug("copyToGlobals", {
        "srcVariableName": "total", "dstVariableName": "total_copy", "srcFrameId": frame})))

    t.append(("stepOut", s.debug("stepOut", {"threadId": 1})))
    t.append(("stopped after stepOut", s.wait_event("stopped")))
    stack = s.debug("stackTrace", {"threadId": 1})
    t.append(("line after stepOut", [(f["name"], f["line"]) for f in stack["body"]["stackFrames"]]))
    t.append(("stepIn", s.debug("stepIn", {"threadId": 1})))
    t.append(("stopped after stepIn", s.wait_event("stopped")))
    stack = s.debug("stackTrace", {"threadId": 1})
    t.append(("line after stepIn", [(f["name"], f["line"]) for f in stack["body"]["stackFrames"]]))

    t.append(("continue to the end", s.debug("continue", {"threadId": 1})))
    reply = s.shell_reply(msg_id)
    t.append(("execute_reply", reply["content"]["status"]))
    info = s.debug("debugInfo")
    # ipykernel still lists the threads stopped before the continue (see below); LooseLeaf none.
    t.append(("+debugInfo after the cell", info))

    if ours:
        # Between cells: the variable explorer reads the namespace.  (ipykernel keeps the thread it stopped as
        # stopped after a continue, since debugpy sends no "continued" event for one, and then forwards these
        # to debugpy, which fails them or leaves them unanswered: LooseLeaf only.)
        inspected = s.debug("inspectVariables")
        t.append(("+inspectVariables after", user_names(inspected)))
        ref = [v for v in inspected["body"]["variables"] if v["name"] == "lst"][0]["variablesReference"]
        t.append(("+variables of lst after", s.debug("variables", {"variablesReference": ref})))
        t.append(("+richInspectVariables after", s.debug("richInspectVariables", {"variableName": "z"})))
    t.append(("source", s.debug("source", {"source": {"path": main_path}})))
    t.append(("source missing", s.debug("source", {"source": {"path": main_path + ".gone"}})))
    mods = s.debug("modules", {"startModule": 0, "moduleCount": 5})
    t.append(("modules", sorted(mods.get("body", {}))))
    t.append(("disconnect", s.debug("disconnect", {"restart": False, "terminateDebuggee": False})))
    t.append(("debugInfo after disconnect", s.debug("debugInfo")))

    # The cell runs as without the debugger; a second session starts and stops.
    out = s.run(AFTER_CELL)
    t.append(("cell after disconnect", out["content"]["status"]))
    t.append(("initialize again", s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python",
                                                         "pathFormat": "path", "linesStartAt1": True,
                                                         "columnsStartAt1": True})["success"]))
    t.append(("attach again", s.debug("attach")["success"]))
    t.append(("disconnect again", s.debug("disconnect", {"restart": False, "terminateDebuggee": False})))
    return t


def user_names(reply):
    """A variables reply reduced to the user's variables (the kernels' namespaces differ otherwise)."""
    keep = {"x", "y", "z", "lst", "name", "add", "total_copy", "special variables", "function variables"}
    return [(v["name"], v.get("value"), v.get("type")) for v in reply["body"]["variables"] if v["name"] in keep]


_CELLS_DIR = re.compile(r"/[^\s\"']*/(?:ipykernel|looseleaf)_\d+/")
_ADDR = re.compile(r" at 0x[0-9a-f]+")


def norm(v, key=None):
    if isinstance(v, dict):
        # stoppedThreads: ipykernel counts one of its own threads as stopped (checked on LooseLeaf's alone).
        return {k: norm(x, k) for k, x in v.items()
                if k not in ("seq", "request_seq", "sequence_seq", "id", "frameId", "variablesReference",
                             "stoppedThreads") or x == 0}
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, str):
        return _ADDR.sub(" at 0x?", _CELLS_DIR.sub("<cells>/", v))
    return v


@pytest.fixture(scope="module")
def transcripts(jupyter_env):
    out = {}
    for name in ("looseleaf", "python3"):
        s = Session(name)
        try:
            out[name] = script(s, name == "looseleaf")
        finally:
            s.close()
    return out


def test_debug_session_matches_ipykernel(transcripts):
    ours, ref = transcripts["looseleaf"], transcripts["python3"]
    ours = [(step, c) for step, c in ours if not step.startswith("+")]
    ref = [(step, c) for step, c in ref if not step.startswith("+")]
    assert [step for step, _ in ours] == [step for step, _ in ref]
    for (step, a), (_, b) in zip(ours, ref):
        assert norm(a) == norm(b), step


def test_debug_session_shows_what_the_panel_needs(transcripts):
    t = dict(transcripts["looseleaf"])
    assert t["kernel_info.supported_features"] is True
    assert t["debugInfo before"]["body"]["isStarted"] is False
    assert t["initialize"]["success"] and t["attach"]["success"]
    info = t["debugInfo started"]["body"]
    assert info["isStarted"] is True and info["hashMethod"] == "Murmur2"
    assert t["dumpCell"]["body"]["sourcePath"].startswith(info["tmpFilePrefix"])
    # The cell's own breakpoint, then the one in the function an earlier cell defined.
    (stop,) = [e for e in t["stopped at the cell's breakpoint"] if e["event"] == "stopped"]
    assert stop["body"]["reason"] == "breakpoint"
    frames = t["stackTrace in the cell"]["body"]["stackFrames"]
    assert (frames[0]["name"], frames[0]["line"]) == ("<module>", 2)
    assert frames[0]["source"]["path"] == t["dumpCell"]["body"]["sourcePath"]
    assert ("x", "1", "int") in t["variables of the cell"]
    assert t["debugInfo stopped"]["body"]["stoppedThreads"] == [1]
    assert t["kernel_info on control while stopped"] == "ok"
    assert t["richInspectVariables stopped"]["body"]["data"]["text/plain"] == "1"
    stops = [e for e in t["stopped in the earlier cell's function"] if e["event"] == "stopped"]
    assert stops[-1]["body"]["reason"] == "breakpoint"
    frames = t["stackTrace in add"]["body"]["stackFrames"]
    assert [(f["name"], f["line"]) for f in frames[:2]] == [("add", 2), ("<module>", 2)]
    assert {v["name"]: v["value"] for v in t["locals of add"]["body"]["variables"]} == {"p": "1", "q": "2"}
    assert t["line after next"][0] == ("add", 3)
    assert {v["name"]: v["value"] for v in t["locals after next"]["body"]["variables"]} == {
        "p": "1", "q": "2", "total": "3"}
    assert t["evaluate"]["body"]["result"] == "300"
    assert t["copyToGlobals"]["success"]
    assert t["line after stepOut"][0][0] == "<module>"
    assert t["execute_reply"] == "ok"
    assert t["+debugInfo after the cell"]["body"]["stoppedThreads"] == []
    assert ("lst", "[1, 2, 3]", "list") in t["inspectVariables"]
    assert [v["value"] for v in t["variables of lst"]["body"]["variables"] if v["name"] in "012"] == ["1", "2", "3"]
    assert t["richInspectVariables"]["body"]["data"]["text/plain"] == "'leaf'"
    assert t["richInspectVariables bad name"]["success"] is False
    after = t["+inspectVariables after"]
    assert ("z", "30", "int") in after and ("total_copy", "3", "int") in after
    assert t["+variables of lst after"]["success"] is True
    assert t["+richInspectVariables after"]["body"]["data"]["text/plain"] == "30"
    assert t["source"]["body"]["content"] == MAIN_CELL
    assert t["source missing"]["success"] is False
    assert t["debugInfo after disconnect"]["body"]["isStarted"] is False
    assert t["cell after disconnect"] == "ok"
    assert t["initialize again"] and t["attach again"]


def test_debugger_advertised(jupyter_env):
    s = Session("looseleaf")
    try:
        info = s.control("kernel_info_request", {})["content"]
        assert info["debugger"] is True
        assert "debugger" in info["supported_features"]
        # A malformed request gets an error response, and the kernel lives on.
        bad = s.control("debug_request", {"type": "request", "seq": 1, "command": "stackTrace",
                                           "arguments": {"threadId": 1}})["content"]
        assert bad["success"] is False and bad["command"] == "stackTrace"
        s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path"})
        for content in ({"type": "request", "seq": 5, "command": "dumpCell"},  # no arguments
                        {"type": "request", "seq": 6, "command": "source", "arguments": {"source": 3}},
                        {"type": "request", "seq": 7, "command": "copyToGlobals", "arguments": {
                            "srcVariableName": "a;b", "dstVariableName": "c", "srcFrameId": 1}},
                        {"type": "request", "seq": 8, "command": 5}):
            bad = s.control("debug_request", content)["content"]
            assert bad["success"] is False and bad.get("message"), content
        assert s.run("print(1)")["content"]["status"] == "ok"
    finally:
        s.close()


def test_interrupt_and_shutdown_at_a_breakpoint(jupyter_env):
    """An interrupt while a cell is stopped ends the cell (KeyboardInterrupt) and leaves the debugger usable: the
    next cell runs, the breakpoint hits again (ipykernel's pydevd keeps the thread marked suspended and never
    stops again); a shutdown while stopped ends the kernel."""
    s = Session("looseleaf")
    try:
        s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path",
                               "linesStartAt1": True, "columnsStartAt1": True})
        assert s.debug("attach")["success"]
        code = "a = 1\nb = 2\n"
        path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
        s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 2}]})
        s.debug("configurationDone")
        msg_id = s.execute(code)
        s.wait_event("stopped")
        s.km.interrupt_kernel()
        reply = s.shell_reply(msg_id)["content"]
        assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
        assert any(e["event"] == "continued" for e in s.wait_event("continued"))
        assert s.debug("debugInfo")["body"]["stoppedThreads"] == []
        assert s.run("c = 3")["content"]["status"] == "ok"
        s.execute(code)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        assert stop["body"]["reason"] == "breakpoint"
        s.kc.shutdown()
        deadline = time.monotonic() + TIMEOUT
        while s.km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not s.km.is_alive()
    finally:
        s.close()


def test_exception_breakpoints_and_placement_magic(jupyter_env):
    """Pause on raised exceptions (the panel's checkbox: setExceptionBreakpoints) stops where the cell raises, with
    exceptionInfo, as on ipykernel; a breakpoint in a %%cpu cell stops on the line the editor shows."""
    results = {}
    for name in ("looseleaf", "python3"):
        s = Session(name)
        try:
            t = results[name] = []
            # IPython's first traceback imports asttokens, whose import raises and catches (ipykernel would stop
            # there with "raised" on): a failing cell first.
            assert s.shell_reply(s.execute("1/0"))["content"]["status"] == "error"
            s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path",
                                   "linesStartAt1": True, "columnsStartAt1": True})
            s.debug("attach")
            t.append(("setExceptionBreakpoints",
                      s.debug("setExceptionBreakpoints", {"filters": ["raised"], "filterOptions": [],
                                                          "exceptionOptions": []})))
            s.debug("configurationDone")
            code = "v = 7\nraise ValueError('bad %d' % v)\n"
            msg_id = s.execute(code)
            t.append(("stopped", s.wait_event("stopped")))
            stack = s.debug("stackTrace", {"threadId": 1})
            t.append(("frame", [(f["name"], f["line"]) for f in stack["body"]["stackFrames"]][:1]))
            info = s.debug("exceptionInfo", {"threadId": 1})
            t.append(("exceptionInfo", {k: info["body"].get(k) for k in ("exceptionId", "description", "breakMode")}))
            s.debug("continue", {"threadId": 1})
            reply = s.shell_reply(msg_id)["content"]
            t.append(("reply", (reply["status"], reply["ename"], reply["evalue"])))
            s.debug("setExceptionBreakpoints", {"filters": [], "filterOptions": [], "exceptionOptions": []})
            if name == "looseleaf":
                code = "%%cpu\nw = 1\nw = w + 1\nw = w * 5\n"
                path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
                s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 3}]})
                msg_id = s.execute(code)
                s.wait_event("stopped")
                frame = s.debug("stackTrace", {"threadId": 1})["body"]["stackFrames"][0]
                assert (frame["line"], frame["source"]["path"]) == (3, path)
                # Stopped before the editor's line 3 (w = w + 1), not before the code's third line.
                value = s.debug("evaluate", {"expression": "w", "frameId": frame["id"], "context": "repl"})
                assert value["body"]["result"] == "1"
                s.debug("continue", {"threadId": 1})
                assert s.shell_reply(msg_id)["content"]["status"] == "ok"
                assert s.run("assert w == 10")["content"]["status"] == "ok"
        finally:
            s.close()
    ours, ref = results["looseleaf"], results["python3"]
    assert [norm(c) for _, c in ours] == [norm(c) for _, c in ref]
    assert ours[2][1] == [("<module>", 2)]
    assert ours[3][1]["exceptionId"] == "ValueError" and ours[4][1] == ("error", "ValueError", "bad 7")


def _iopub_until_idle(s, msg_id):
    """The cell MSG_ID's stream text, read from iopub up to its idle status (debug_events kept for wait_event)."""
    text, deadline = [], time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            msg = s.kc.iopub_channel.get_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "debug_event":
            s.pending.append(msg["content"])
        elif msg["parent_header"].get("msg_id") != msg_id:
            continue
        elif msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(text)
    raise AssertionError("the cell did not go idle")


def _proc_status(pid):
    with open("/proc/%s/status" % pid) as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _proc_maps(pid):
    with open("/proc/%s/maps" % pid) as f:
        return f.read()


def lab_tree_shows(variable):
    """What JupyterLab 4's variables tree shows beside a variable's name (@jupyterlab/debugger's convertType):
    the value of an int, float, bool or str (a str without its quotes when pydevd marks it rawString), the type
    name of anything else."""
    kind, value = variable.get("type"), variable["value"]
    if kind in ("int", "float", "bool"):
        return value
    if kind == "str":
        raw = "rawString" in (variable.get("presentationHint") or {}).get("attributes", [])
        return value[1:-1] if raw else value
    return kind if kind is not None else value


def _gpu_session(jupyter_env):
    if os.path.isdir(jupyter_env["LOOSELEAF_POOL_DIR"]):
        os.chmod(jupyter_env["LOOSELEAF_POOL_DIR"], 0o700)  # the pool refuses a directory others may read
    s = Session("looseleaf")
    s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path",
                           "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True})
    assert s.debug("attach")["success"]
    return s


# A GPU cell (%%gpu: on a worker with or without a GPU; CPU tensors here).  Line numbers are the editor's.
GPU_CELL = ("%%gpu\n"                        # 1
            "import torch\n"                 # 2
            "t = torch.ones(2, 3)\n"         # 3
            "g = 5\n"                        # 4
            "g = g + 1\n"                    # 5
            "h = g * 7\n"                    # 6
            "print('result', h)\n")          # 7


def test_gpu_cell_stops_in_its_worker(jupyter_env):
    """A breakpoint set while no GPU cell runs stops the next GPU cell in its worker: the stack shows the cell's
    file as dumpCell named it, its variables (a tensor among them) are listed, next steps a line, evaluate reads
    the worker's frame, a breakpoint set while stopped there hits, continue ends the cell with its result as
    without the debugger; the warm worker's next debugged cell stops again; a CPU cell after stops in the
    kernel."""
    s = _gpu_session(jupyter_env)
    try:
        path = s.debug("dumpCell", {"code": GPU_CELL})["body"]["sourcePath"]
        bp = s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 5}],
                                        "sourceModified": False})
        assert bp["success"] and bp["body"]["breakpoints"][0]["line"] == 5
        s.debug("configurationDone")
        msg_id = s.execute(GPU_CELL)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        assert stop["body"]["reason"] == "breakpoint"
        thread = stop["body"]["threadId"]
        assert s.debug("debugInfo")["body"]["stoppedThreads"] == [thread]
        stack = s.debug("stackTrace", {"threadId": thread})
        assert stack["success"], stack
        frame = stack["body"]["stackFrames"][0]
        assert (frame["name"], frame["line"], frame["source"]["path"]) == ("<module>", 5, path)
        # The worker's frame, not the kernel's: the cell's code ran there.
        pid = s.debug("evaluate", {"expression": "__import__('os').getpid()", "frameId": frame["id"],
                                   "context": "repl"})
        assert int(pid["body"]["result"]) != s.km.provisioner.process.pid
        scopes = s.debug("scopes", {"frameId": frame["id"]})
        ref = scopes["body"]["scopes"][0]["variablesReference"]
        variables = {v["name"]: v for v in s.debug("variables", {"variablesReference": ref})["body"]["variables"]}
        assert variables["g"]["value"] == "5" and variables["g"]["type"] == "int"
        # A tensor: device, shape and dtype in the value column; its expansion lists them; evaluate keeps repr.
        assert variables["t"]["type"] == "Tensor"
        assert variables["t"]["value"] == "Tensor(shape=(2, 3), dtype=torch.float32, device=cpu)"
        # Expanded in JupyterLab's variables tree (its default view), the fields read as text there.
        children = {v["name"]: lab_tree_shows(v) for v in s.debug("variables", {
            "variablesReference": variables["t"]["variablesReference"]})["body"]["variables"]}
        assert (children["device"], children["shape"], children["dtype"]) == ("cpu", "(2, 3)", "torch.float32")
        assert children["numel"] == "6" and children["requires_grad"] == "False"
        shown = s.debug("evaluate", {"expression": "t", "frameId": frame["id"], "context": "repl"})
        assert shown["body"]["result"].startswith("tensor([[1., 1., 1.]")
        rich = s.debug("richInspectVariables", {"variableName": "g", "frameId": frame["id"]})
        assert rich["body"]["data"]["text/plain"] == "5"

        assert s.debug("next", {"threadId": thread})["success"]
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        assert stop["body"]["reason"] == "step"
        frame = s.debug("stackTrace", {"threadId": thread})["body"]["stackFrames"][0]
        assert frame["line"] == 6
        value = s.debug("evaluate", {"expression": "g", "frameId": frame["id"], "context": "repl"})
        assert value["body"]["result"] == "6"
        assert s.debug("copyToGlobals", {"srcVariableName": "g", "dstVariableName": "g_copy",
                                         "srcFrameId": frame["id"]})["success"]

        # A breakpoint set while stopped in the worker hits there.
        bp = s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 5}, {"line": 7}]})
        assert bp["success"] and [b["line"] for b in bp["body"]["breakpoints"]] == [5, 7]
        s.debug("continue", {"threadId": thread})
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        frame = s.debug("stackTrace", {"threadId": stop["body"]["threadId"]})["body"]["stackFrames"][0]
        assert frame["line"] == 7
        s.debug("continue", {"threadId": stop["body"]["threadId"]})
        reply = s.shell_reply(msg_id)
        assert reply["content"]["status"] == "ok"
        worker = reply["metadata"]["looseleaf"]["worker_pid"]
        assert worker != s.km.provisioner.process.pid
        assert "result 42" in _iopub_until_idle(s, msg_id)
        assert s.debug("debugInfo")["body"]["stoppedThreads"] == []
        # pydevd runs in the worker only: the zygote it was forked from stays single-threaded, without it.
        zygote = _proc_status(worker)["PPid"]
        with open("/proc/%s/cmdline" % zygote, "rb") as f:
            assert b"zygote" in f.read()
        assert _proc_status(zygote)["Threads"] == "1"
        assert "debugpy" not in _proc_maps(zygote) and "debugpy" in _proc_maps(worker)

        # The warm worker's next debugged cell stops again (the session's breakpoints replayed there).
        again = "%%gpu\ng = g + 1\ng = g + 1\n"
        again_path = s.debug("dumpCell", {"code": again})["body"]["sourcePath"]
        s.debug("setBreakpoints", {"source": {"path": again_path}, "breakpoints": [{"line": 3}]})
        msg_id = s.execute(again)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        frame = s.debug("stackTrace", {"threadId": stop["body"]["threadId"]})["body"]["stackFrames"][0]
        assert (frame["line"], frame["source"]["path"]) == (3, again_path)
        value = s.debug("evaluate", {"expression": "g", "frameId": frame["id"], "context": "repl"})
        assert value["body"]["result"] == "7"
        s.debug("continue", {"threadId": stop["body"]["threadId"]})
        reply = s.shell_reply(msg_id)
        assert reply["content"]["status"] == "ok"
        assert reply["metadata"]["looseleaf"]["worker_pid"] == worker

        # A CPU cell after: it stops in the kernel and sees what the GPU cells made (copyToGlobals' too).
        cpu = "k = g * 2 + g_copy - 6\nk = k + 1\n"
        cpu_path = s.debug("dumpCell", {"code": cpu})["body"]["sourcePath"]
        s.debug("setBreakpoints", {"source": {"path": cpu_path}, "breakpoints": [{"line": 2}]})
        msg_id = s.execute(cpu)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        frame = s.debug("stackTrace", {"threadId": stop["body"]["threadId"]})["body"]["stackFrames"][0]
        value = s.debug("evaluate", {"expression": "k", "frameId": frame["id"], "context": "repl"})
        assert value["body"]["result"] == "16"
        s.debug("continue", {"threadId": stop["body"]["threadId"]})
        assert s.shell_reply(msg_id)["content"]["status"] == "ok"
    finally:
        s.close()


def test_gpu_cell_without_a_breakpoint_runs_as_without_the_debugger(jupyter_env):
    """With the debugger on and no breakpoint in it, a GPU cell runs to its end on its worker, its result as
    without the debugger; after a disconnect GPU cells run without pydevd."""
    s = _gpu_session(jupyter_env)
    try:
        s.debug("configurationDone")
        code = "%%gpu\nq = sum(range(10))\nprint('q is', q)\n"
        msg_id = s.execute(code)
        reply = s.shell_reply(msg_id)
        assert reply["content"]["status"] == "ok"
        assert reply["metadata"]["looseleaf"]["worker_pid"] != s.km.provisioner.process.pid
        assert "q is 45" in _iopub_until_idle(s, msg_id)
        assert not [e for e in s.pending if e["event"] == "stopped"]
        s.debug("disconnect", {"restart": False, "terminateDebuggee": False})
        msg_id = s.execute("%%gpu\nq = q + 1\nprint('q is', q)\n")
        assert s.shell_reply(msg_id)["content"]["status"] == "ok"
        assert "q is 46" in _iopub_until_idle(s, msg_id)
    finally:
        s.close()


def test_gpu_cell_pause_interrupt_and_disconnect(jupyter_env):
    """The panel's pause stops a running GPU cell in its worker; an interrupt while it is stopped ends the cell
    with KeyboardInterrupt and the frontend is told it runs again; the next GPU cell stops at its breakpoint;
    a disconnect while stopped there lets the cell run to its end."""
    s = _gpu_session(jupyter_env)
    try:
        s.debug("configurationDone")
        loop = ("%%gpu\nimport time\nn = 0\nprint('started', flush=True)\nwhile n < 3000:\n    n += 1\n"
                "    time.sleep(0.01)\n")
        loop_path = s.debug("dumpCell", {"code": loop})["body"]["sourcePath"]
        msg_id = s.execute(loop)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:  # the loop runs in the worker, under its pydevd
            msg = s.kc.iopub_channel.get_msg(timeout=TIMEOUT)
            if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
                break
        assert s.debug("pause", {"threadId": 1})["success"]
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        assert stop["body"]["reason"] == "pause"
        frame = s.debug("stackTrace", {"threadId": stop["body"]["threadId"]})["body"]["stackFrames"][0]
        assert frame["source"]["path"] == loop_path and frame["line"] in (5, 6, 7)
        s.km.interrupt_kernel()
        reply = s.shell_reply(msg_id)["content"]
        assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
        assert any(e["event"] == "continued" for e in s.wait_event("continued"))
        assert s.debug("debugInfo")["body"]["stoppedThreads"] == []

        code = "%%gpu\nm = 1\nm = m + 1\nprint('m', m)\n"
        path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
        s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 3}]})
        msg_id = s.execute(code)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        assert stop["body"]["reason"] == "breakpoint"
        assert s.debug("disconnect", {"restart": False, "terminateDebuggee": False})["success"]
        assert s.shell_reply(msg_id)["content"]["status"] == "ok"
        assert "m 2" in _iopub_until_idle(s, msg_id)
        assert s.debug("debugInfo")["body"] == dict(s.debug("debugInfo")["body"], isStarted=False,
                                                    stoppedThreads=[])
    finally:
        s.close()


def test_gpu_cell_step_in_and_out(jupyter_env):
    """Step in and step out in a GPU cell's worker: into a function the cell defines, and back to the cell."""
    s = _gpu_session(jupyter_env)
    try:
        code = ("%%gpu\n"                 # 1
                "def twice(a):\n"         # 2
                "    b = a * 2\n"         # 3
                "    return b\n"          # 4
                "r = twice(21)\n"         # 5
                "print('r', r)\n")        # 6
        path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
        s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 5}]})
        s.debug("configurationDone")
        msg_id = s.execute(code)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        thread = stop["body"]["threadId"]

        def where():
            frames = s.debug("stackTrace", {"threadId": thread})["body"]["stackFrames"]
            return [(f["name"], f["line"]) for f in frames[:2]]

        assert where()[0] == ("<module>", 5)
        s.debug("stepIn", {"threadId": thread})
        s.wait_event("stopped")
        assert where() == [("twice", 3), ("<module>", 5)]
        s.debug("stepOut", {"threadId": thread})
        s.wait_event("stopped")
        assert where()[0][0] == "<module>"
        s.debug("continue", {"threadId": thread})
        assert s.shell_reply(msg_id)["content"]["status"] == "ok"
        assert "r 42" in _iopub_until_idle(s, msg_id)
    finally:
        s.close()


def test_gpu_cell_stops_on_a_raised_exception(jupyter_env):
    """Pause on raised exceptions, set before the GPU cell runs, is replayed to its worker: the cell stops where
    it raises, exceptionInfo names the exception, and continue ends the cell with that error, as in a CPU
    cell."""
    s = _gpu_session(jupyter_env)
    try:
        # IPython's first traceback imports asttokens, whose import raises and catches: a failing cell first.
        assert s.shell_reply(s.execute("%%gpu\n1/0\n"))["content"]["status"] == "error"
        s.debug("setExceptionBreakpoints", {"filters": ["raised"], "filterOptions": [], "exceptionOptions": []})
        s.debug("configurationDone")
        code = "%%gpu\nv = 7\nraise ValueError('bad %d' % v)\n"
        path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
        msg_id = s.execute(code)
        (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
        assert stop["body"]["reason"] == "exception"
        thread = stop["body"]["threadId"]
        frame = s.debug("stackTrace", {"threadId": thread})["body"]["stackFrames"][0]
        assert (frame["line"], frame["source"]["path"]) == (3, path)
        info = s.debug("exceptionInfo", {"threadId": thread})["body"]
        assert (info["exceptionId"], info["description"]) == ("ValueError", "bad 7")
        s.debug("continue", {"threadId": thread})
        reply = s.shell_reply(msg_id)["content"]
        assert (reply["status"], reply["ename"], reply["evalue"]) == ("error", "ValueError", "bad 7")
    finally:
        s.close()


def test_variable_explorer_lists_what_gpu_cells_made(jupyter_env):
    """Between cells the variable explorer (inspectVariables, richInspectVariables) lists what GPU cells made,
    by their workers' account (a tensor's device, shape and dtype), without restoring it in the kernel; once a
    CPU cell brought a variable to the kernel it is listed from there."""
    s = _gpu_session(jupyter_env)
    try:
        s.debug("configurationDone")
        s.run("%%gpu\nimport torch\nt = torch.ones(2, 3)\ng = 6\nlabel = 'gpu'\n")

        def listed():
            return {v["name"]: v for v in s.debug("inspectVariables")["body"]["variables"]}

        seen = listed()
        assert (seen["t"]["value"], seen["t"]["type"]) == ("Tensor(shape=(2, 3), dtype=torch.float32, device=cpu)",
                                                           "Tensor")
        assert seen["t"]["variablesReference"] == 0  # not restored here to be expanded
        assert (seen["g"]["value"], seen["g"]["type"]) == ("6", "int")
        assert seen["label"]["value"] == "'gpu'"
        rich = s.debug("richInspectVariables", {"variableName": "t"})
        assert rich["body"]["data"]["text/plain"] == "Tensor(shape=(2, 3), dtype=torch.float32, device=cpu)"
        # A CPU cell reads g (it is restored for it) and makes g2: both listed from the kernel's namespace.
        s.run("g2 = g + 1\n")
        seen = listed()
        assert seen["g"]["value"] == "6" and seen["g2"]["value"] == "7"
        assert seen["t"]["value"].startswith("Tensor(shape=(2, 3)")
        # The GPU cell's next value replaces it.
        s.run("%%gpu\ng = g * 10\n")
        assert listed()["g"]["value"] == "60"
    finally:
        s.close()


def test_pause_and_breakpoint_set_while_running(jupyter_env):
    """The panel's pause button stops a running loop where it is; a breakpoint set while the cell runs hits; as on
    ipykernel."""
    results = {}
    for name in ("looseleaf", "python3"):
        s = Session(name)
        try:
            t = results[name] = []
            s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path",
                                   "linesStartAt1": True, "columnsStartAt1": True})
            s.debug("attach")
            s.debug("configurationDone")
            code = "import time\nn = 0\nwhile n < 3000:\n    n += 1\n    time.sleep(0.01)\n"
            path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
            msg_id = s.execute(code)
            s.wait_running(msg_id)
            t.append(("pause", s.debug("pause", {"threadId": 1})))
            t.append(("stopped", s.wait_event("stopped")))
            stack = s.debug("stackTrace", {"threadId": 1})["body"]["stackFrames"]
            t.append(("where", (stack[0]["name"], stack[0]["line"] in (3, 4, 5), stack[0]["source"]["path"] == path)))
            t.append(("setBreakpoints", s.debug("setBreakpoints", {"source": {"path": path},
                                                                   "breakpoints": [{"line": 4}]})["success"]))
            s.debug("continue", {"threadId": 1})
            t.append(("stopped at the new breakpoint", s.wait_event("stopped")))
            s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": []})
            frame = s.debug("stackTrace", {"threadId": 1})["body"]["stackFrames"][0]["id"]
            t.append(("evaluate a statement", s.debug("evaluate", {"expression": "n = 2990", "frameId": frame,
                                                                   "context": "repl"})))  # the loop ends soon
            s.debug("continue", {"threadId": 1})
            t.append(("reply", s.shell_reply(msg_id)["content"]["status"]))
            t.append(("n", s.run("print(n)")["content"]["status"]))
        finally:
            s.close()
    assert [norm(c) for _, c in results["looseleaf"]] == [norm(c) for _, c in results["python3"]]
    t = dict(results["looseleaf"])
    assert [e["body"]["reason"] for e in t["stopped"] if e["event"] == "stopped"] == ["pause"]
    assert t["where"] == ("<module>", True, True)
    assert [e["body"]["reason"] for e in t["stopped at the new breakpoint"]
            if e["event"] == "stopped"] == ["breakpoint"]
    assert t["reply"] == "ok"


def _stop_once(s, code, line):
    """A breakpoint on LINE of CODE, the cell run to it, continued and ended: the (event, parent msg_type) of
    the debug_events seen from the stop on."""
    path = s.debug("dumpCell", {"code": code})["body"]["sourcePath"]
    s.debug("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": line}], "sourceModified": False})
    s.debug("configurationDone")
    first = len(s.event_parents)
    msg_id = s.execute(code)
    (stop,) = [e for e in s.wait_event("stopped") if e["event"] == "stopped"]
    thread = stop["body"]["threadId"]
    s.debug("stackTrace", {"threadId": thread})
    s.debug("next", {"threadId": thread})
    s.wait_event("stopped")
    s.debug("continue", {"threadId": thread})
    assert s.shell_reply(msg_id)["content"]["status"] == "ok"
    return s.event_parents[first:]


STEP_CELL = "a = 5\nb = a + 1\nc = b * 2\n"  # stopped on b's line, then next to c's


@pytest.mark.parametrize("kernel,code", [("python3", STEP_CELL), ("looseleaf", STEP_CELL),
                                         ("looseleaf", "%%gpu\n" + STEP_CELL)],
                         ids=["ipykernel", "looseleaf-cpu", "looseleaf-gpu"])
def test_debug_events_answer_the_control_request(jupyter_env, kernel, code):
    """debug_events go out under the last debug_request (control), as ipykernel's do, never under the running
    cell's execute_request: JupyterLab takes any iopub message of an execute_request, while it knows no stopped
    thread, as the sign to refresh the variable explorer from inspectVariables (the kernel's globals), so a
    `stopped` event under the cell made it race the stopped frame's own variables (a GPU cell's panel could end
    up with the kernel's namespace instead of the worker's frame)."""
    if kernel == "looseleaf":
        s = _gpu_session(jupyter_env)
    else:
        s = Session(kernel)
        s.debug("initialize", {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path",
                               "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True})
        assert s.debug("attach")["success"]
    try:
        seen = _stop_once(s, code, code.split("\n").index("b = a + 1") + 1)
        assert [e for e, _ in seen].count("stopped") == 2, seen
        assert {p for e, p in seen if e in ("stopped", "continued")} == {"debug_request"}, seen
    finally:
        s.close()

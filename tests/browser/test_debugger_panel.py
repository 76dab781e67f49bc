"""JupyterLab's debugger panel on LooseLeaf (issue 27), used as a person uses it: the bug icon in the notebook's
toolbar switches the debugger on, a click in a cell's gutter sets a breakpoint, running the cell stops it there
(the line highlighted in the cell, the cell's frame in the call stack, its variables in the variables panel), the
callstack's Next and Continue buttons step and resume, and the cell ends with the output it has without the
debugger.  A GPU cell (one the kernel sends to a worker: it uses torch) stops in its worker, its tensor listed
with device, shape and dtype as the variable explorer reports them; a CPU cell is the control.

Runs in the pytest process (`make test-browser`), with a JupyterLab server and chromium of its own (browserutil.py),
stopped by the fixtures.  DBG_PASSES=N repeats the whole walk N times on fresh notebooks of the same server (what
was run to check the test is not flaky); every wait is on what the page shows, never a fixed sleep.
"""
import json
import os
import re
import urllib.request

import pytest

from browserutil import Server, have_chromium, launch_chromium
from pageutil import CELL_TIMEOUT_MS, LabNotebook, decode_frame, expect

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(not have_chromium(), reason="Debian's chromium (/usr/bin/chromium) is needed")

KERNEL_DISPLAY = "LooseLeaf (GPU)"
LAB_USER_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                     '{"fetchNews": "false", "checkForUpdates": false}'}
PASSES = int(os.environ.get("DBG_PASSES", "1"))

SETUP_CELL = "import os, torch\nkpid = os.getpid()\nprint('setup done')"
# The GPU cell (it uses torch: the kernel sends it to a worker); the breakpoint goes on line 2.
GPU_CELL = ("g = torch.arange(6.0).reshape(2, 3)\n"
            "h = g * 2\n"
            "s = h.sum().item()\n"
            "print('gpu cell', s, 'worker', os.getpid() != kpid)")
GPU_LINE = 2
# No GPU on the test machines: the worker makes CPU tensors.
GPU_TENSOR = ("cpu", "(2, 3)", "torch.float32")
CPU_CELL = ("a = 5\n"
            "b = a + 1\n"
            "print('cpu cell', a, b, 'kernel', os.getpid() == kpid)")
CPU_LINE = 2


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-debugger")
    for rel, text in LAB_USER_SETTINGS.items():
        path = root / "lab-user-settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    srv = Server(str(root), kind="lab", hints=True)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    d = tmp_path_factory.mktemp("debugger-screenshots")
    yield d
    print("\nscreenshots: %s" % d)


class DapLog:
    """The page's Debug Adapter Protocol traffic with its kernel (debug_request, debug_reply, debug_event), in
    order: written next to the screenshots, to read when a step fails."""

    def __init__(self, page):
        self.lines = []
        page.on("websocket", self._socket)

    def _socket(self, ws):
        if "/api/kernels/" in ws.url:
            ws.on("framesent", lambda p: self._add(">", p))
            ws.on("framereceived", lambda p: self._add("<", p))

    def _add(self, way, payload):
        try:
            _, msg = decode_frame(payload)
        except (ValueError, KeyError, UnicodeDecodeError):
            return
        if msg.get("header", {}).get("msg_type", "").startswith("debug_"):
            self.lines.append("%s %s" % (way, json.dumps(msg.get("content"))[:600]))

    def save(self, path):
        path.write_text("\n".join(self.lines) + "\n")


class DebuggerPage(LabNotebook):
    """A notebook of prepared cells in JupyterLab, and the debugger panel's controls."""

    def open(self, name):
        self.name = name
        # A workspace of its own: JupyterLab would otherwise reopen the notebooks of earlier tests beside it.
        self.page.goto(self.server.page_url("/lab/workspaces/%s/tree/%s" % (name.split(".")[0], name)))
        expect(self.page.locator(".jp-StatusBar-Widget", has_text="%s | Idle" % KERNEL_DISPLAY).first).to_be_visible(
            timeout=CELL_TIMEOUT_MS)
        expect(self.cells()).to_have_count(len(self.sources))
        # The notebook's tab: the debugger's toolbar and panels act on the current notebook.
        self.page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.wait_for()

    def run_cell(self, i):
        """Select cell I as a person does (its prompt, command mode) and run it with Ctrl+Enter."""
        cell = self.cell(i)
        cell.locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")
        expect(cell).to_have_class(re.compile(r"\bjp-mod-selected\b"))
        before = cell.locator(".jp-InputArea-prompt").inner_text()
        self.page.keyboard.press("Control+Enter")
        return cell, before

    def wait_ran(self, cell, before, text):
        """Until CELL shows a new execution count (not BEFORE) and TEXT in its output; its output texts, less
        LooseLeaf's own notices (a wait for a GPU slot other kernels on the machine hold)."""
        old = re.escape(before.strip("[]: "))
        expect(cell.locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"^\[(?!%s\])\d+\]:$" % old),
                                                                  timeout=CELL_TIMEOUT_MS)
        return [t for t in self.wait_output(cell, text) if not t.startswith("LooseLeaf: ")]

    def bug_button(self):
        return self.page.locator(".jp-NotebookPanel:visible .jp-DebuggerBugButton")

    def debugger_on(self):
        button = self.bug_button()
        expect(button).to_be_enabled(timeout=CELL_TIMEOUT_MS)  # enabled once the kernel says debugger: true
        button.click()
        expect(button).to_have_attribute("aria-pressed", "true")
        # JupyterLab opens its debugger side panel by itself once the session started.  In one CI run of
        # many it stayed closed (the bug button pressed, the session started): a person then clicks the
        # panel's tab, and so does the test, saying so; the walk after it checks what the panel shows.
        sidebar = self.page.locator(".jp-DebuggerSidebar")
        try:
            expect(sidebar).to_be_visible(timeout=30000)
        except AssertionError:
            print("debugger panel: not opened by JupyterLab within 30 s; opening its tab")
            self.page.get_by_role("tab", name="Debugger").click()
        expect(sidebar).to_be_visible(timeout=CELL_TIMEOUT_MS)
        # The cells get the breakpoint gutter (and line numbers) once the session is up.
        expect(self.cell(0).locator(".cm-breakpoint-gutter").first).to_be_visible(timeout=CELL_TIMEOUT_MS)

    def set_breakpoint(self, i, line):
        """A click in cell I's breakpoint gutter beside LINE (1-based), at that line's height."""
        cell = self.cell(i)
        box = cell.locator(".cm-line").nth(line - 1).bounding_box()
        gutter = cell.locator(".cm-gutter.cm-breakpoint-gutter").bounding_box()
        self.page.mouse.click(gutter["x"] + gutter["width"] / 2, box["y"] + box["height"] / 2)
        # The marker in the gutter, and the breakpoint in the panel's list (from the kernel's answer to
        # setBreakpoints for the cell's path).
        expect(cell.locator(".cm-breakpoint-icon")).to_have_count(1)
        entry = self.page.locator(".jp-DebuggerBreakpoints .jp-DebuggerBreakpoint",
                                  has=self.page.locator(".jp-DebuggerBreakpoint-line", has_text=str(line)))
        expect(entry).to_have_count(1)

    def wait_stopped(self, cell, line):
        """Until the debugger shows the cell stopped at LINE: the line highlighted in the cell's editor (the
        stack's path is the one JupyterLab computes for the cell), the cell's frame alone in the callstack (the
        kernel's and worker's own frames hidden, as ipykernel hides its own), the frame's scopes in the
        variables panel."""
        highlight = cell.locator(".cm-line.jp-DebuggerEditor-highlight")
        expect(highlight).to_have_count(1, timeout=CELL_TIMEOUT_MS)
        expect(cell.locator(".cm-line").nth(line - 1)).to_have_class(re.compile(r"jp-DebuggerEditor-highlight"))
        expect(self.page.locator(".jp-DebuggerCallstack .jp-DebuggerCallstackFrame")).to_have_count(1)
        # The variables panel on the stopped frame's scopes (Locals, Globals), no longer on the variable
        # explorer's list between cells (Globals only, where a GPU-made tensor is not expandable).
        expect(self.page.locator('select[aria-label="Scope"] option', has_text="Locals")).to_have_count(1)

    def variable(self, name, within=None):
        """The variables panel's name span of NAME (the tree view, JupyterLab's default), at the top level or
        WITHIN an expanded row."""
        scope = within if within is not None else self.page.locator(".jp-DebuggerVariables-body")
        return scope.locator(".jp-DebuggerVariables-name", has_text=re.compile(r"^%s$" % re.escape(name))).first

    def expect_variable(self, name, detail, within=None):
        """NAME's row shows DETAIL: JupyterLab's tree shows the value of an int, float, bool or str and the type
        of anything else."""
        span = self.variable(name, within)
        expect(span).to_be_visible()
        expect(span.locator("xpath=following-sibling::span[contains(@class, 'jp-DebuggerVariables-detail')]")
               ).to_have_text(detail)

    def expect_tensor(self, name, device, shape, dtype):
        """NAME is a tensor (the row's type); expanded (a click on its name), what the kernel's tensor view
        lists first: its device, shape and dtype, readable in the tree."""
        self.expect_variable(name, "Tensor")
        span = self.variable(name)
        row = span.locator("xpath=..")  # the tree item: the name, the detail, and the children once expanded
        # One click: the children come from the kernel (a variables request, relayed to the worker).  A click
        # lost because the panel re-rendered the list under it (as it did while each `stopped` event also made
        # JupyterLab refresh the explorer from inspectVariables) fails here.
        span.click()
        for field, text in (("device", device), ("shape", shape), ("dtype", dtype)):
            self.expect_variable(field, text, within=row)
        span.click()  # folded again
        expect(self.variable("device", within=row)).to_be_hidden()

    def command(self, label):
        """The callstack toolbar's button LABEL ("Next", "Continue"), clicked once enabled (while stopped)."""
        toolbar = self.page.get_by_role("toolbar", name="Callstack panel toolbar")
        button = toolbar.get_by_role("button", name=re.compile(r"^%s \(" % label))
        expect(button).to_be_enabled()
        button.click()


@pytest.fixture
def dbg(lab_server, browser, shots, request):
    ctx = browser.new_context(viewport={"width": 1600, "height": 1100})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    nb = DebuggerPage(page, shots)
    nb.server = lab_server
    dap = DapLog(page)
    failed = request.session.testsfailed
    yield nb
    name = re.sub(r"\W", "_", request.node.name)
    dap.save(shots / ("dap-%s.txt" % name))
    if request.session.testsfailed > failed:
        nb.shot("failed-%s" % name)
    ctx.close()
    # The notebook's kernel goes with its page, as a person shuts a finished notebook down: the next pass's
    # kernel must not wait for a GPU slot this one's warm worker holds.
    for kernel in lab_server.running_kernels():
        req = urllib.request.Request(lab_server.api_url("/api/kernels/" + kernel["id"]), method="DELETE")
        urllib.request.urlopen(req, timeout=60).close()


def _notebook(dbg, name, cells):
    dbg.sources = cells
    dbg.server.write_notebook(name, cells=cells)
    dbg.open(name)


@pytest.mark.parametrize("n", range(PASSES))
def test_breakpoint_in_a_gpu_cell(dbg, n):
    """A breakpoint in a GPU cell: stopped in the worker on the clicked line, the cell's tensor listed with its
    device, shape and dtype, Next to the following line (the new tensor listed), Continue, and the output the
    same cell printed before the debugger was on."""
    _notebook(dbg, "gpu-debug-%d.ipynb" % n, [SETUP_CELL, GPU_CELL])
    cell, before = dbg.run_cell(0)
    dbg.wait_ran(cell, before, "setup done")
    cell, before = dbg.run_cell(1)
    plain = dbg.wait_ran(cell, before, "gpu cell 30.0 worker True")
    dbg.shot("dbg-%d-gpu-01-without" % n)

    dbg.debugger_on()
    dbg.set_breakpoint(1, GPU_LINE)
    dbg.shot("dbg-%d-gpu-02-breakpoint" % n)
    cell, before = dbg.run_cell(1)
    dbg.wait_stopped(cell, GPU_LINE)
    dbg.expect_tensor("g", *GPU_TENSOR)
    dbg.shot("dbg-%d-gpu-03-stopped" % n)

    dbg.command("Next")
    dbg.wait_stopped(cell, GPU_LINE + 1)
    dbg.expect_tensor("h", *GPU_TENSOR)
    dbg.expect_tensor("g", *GPU_TENSOR)
    dbg.shot("dbg-%d-gpu-04-next" % n)

    dbg.command("Continue")
    assert dbg.wait_ran(cell, before, "gpu cell 30.0 worker True") == plain
    expect(cell.locator(".cm-line.jp-DebuggerEditor-highlight")).to_have_count(0)
    expect(dbg.page.locator(".jp-DebuggerCallstack .jp-DebuggerCallstackFrame")).to_have_count(0)
    dbg.shot("dbg-%d-gpu-05-continued" % n)


@pytest.mark.parametrize("n", range(PASSES))
def test_breakpoint_in_a_cpu_cell(dbg, n):
    """The control: the same walk in a CPU cell, stopped in the kernel itself."""
    _notebook(dbg, "cpu-debug-%d.ipynb" % n, [SETUP_CELL, CPU_CELL])
    cell, before = dbg.run_cell(0)
    dbg.wait_ran(cell, before, "setup done")
    cell, before = dbg.run_cell(1)
    plain = dbg.wait_ran(cell, before, "cpu cell 5 6 kernel True")

    dbg.debugger_on()
    dbg.set_breakpoint(1, CPU_LINE)
    cell, before = dbg.run_cell(1)
    dbg.wait_stopped(cell, CPU_LINE)
    dbg.expect_variable("a", "5")
    dbg.shot("dbg-%d-cpu-01-stopped" % n)
    dbg.command("Next")
    dbg.wait_stopped(cell, CPU_LINE + 1)
    dbg.expect_variable("b", "6")
    dbg.command("Continue")
    assert dbg.wait_ran(cell, before, "cpu cell 5 6 kernel True") == plain
    expect(cell.locator(".cm-line.jp-DebuggerEditor-highlight")).to_have_count(0)
    dbg.shot("dbg-%d-cpu-02-continued" % n)

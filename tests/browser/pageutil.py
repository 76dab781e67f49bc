"""What a user does in a notebook page, for Playwright: type a cell at human speed, run it, read its output.
JupyterLab and Notebook 7 share the notebook's DOM (.jp-Notebook, CodeMirror 6); Debian's classic notebook
6.4 has its own (.cell, CodeMirror 5): ClassicNotebook.

Runs in the pytest (or benchmark) process.  Every wait is on page state (an element, a text), never a sleep.
"""
import json
import re

from playwright.sync_api import expect

# A person types ~5-8 characters a second (125-200 ms a key); the functional steps type as a fast typist does
# (still key by key, 20 keys a second) to stay short; the typing test types at HUMAN_KEY_DELAY_MS.  At 15 ms a
# key JupyterLab's completer could hide its list again before the next key.
TEST_KEY_DELAY_MS = 50
HUMAN_KEY_DELAY_MS = 150
CELL_TIMEOUT_MS = 120_000  # a cold GPU worker on 2 shared cores
# Page state is waited for up to a minute (JupyterLab's first load on 2 shared cores takes ~10 s).
expect.set_options(timeout=60_000)


def type_code(page, code, delay_ms=TEST_KEY_DELAY_MS, newline=None):
    """Type CODE into the focused editor key by key, each line's indentation included.  A line break is
    NEWLINE() when given (the editor inserts a bare newline), else the Enter key: Enter would accept an open
    completer (continuous hinting) and auto-indent, and Chrome's text input of a newline adds a stray one."""
    for i, line in enumerate(code.split("\n")):
        if i:
            if newline is not None:
                newline()
            else:
                page.keyboard.press("Enter")
                page.keyboard.press("Shift+Home")  # the auto-indentation, replaced by what is typed
                if not line:
                    page.keyboard.press("Delete")
        if line:
            page.keyboard.type(line, delay=delay_ms)


# CodeMirror 6 keeps its view on the content element: a newline inserted as a transaction, as Enter would
# without the indentation (typed next) and without reaching an open completer.
_CM_NEWLINE = "e => { const v = e.cmView.view; v.dispatch(v.state.replaceSelection('\\n')); }"


def decode_frame(payload):
    """A kernel websocket frame as (channel, msg dict) for both of jupyter_server's protocols."""
    if isinstance(payload, str):
        msg = json.loads(payload)
        return msg.get("channel"), msg
    data = bytes(payload)
    n = int.from_bytes(data[:8], "little")
    offsets = [int.from_bytes(data[8 * (i + 1):8 * (i + 2)], "little") for i in range(n)]
    channel = data[offsets[0]:offsets[1]].decode("utf-8")
    parts = [data[offsets[i]:offsets[i + 1]] for i in range(1, n - 1)]
    keys = ("header", "parent_header", "metadata", "content")
    msg = {k: json.loads(parts[i]) for i, k in enumerate(keys) if i < len(parts)}
    return channel, msg


class Traffic:
    """What a page exchanges with its kernels over their websockets: execute_replies received; the msg_types
    sent, counted; the targets of the comms it opened.  Attach before the page opens a notebook."""

    def __init__(self, page):
        self.replies = []
        self.sent = {}
        self.comm_targets = []
        page.on("websocket", self._socket)

    def _socket(self, ws):
        if "/api/kernels/" not in ws.url:
            return
        ws.on("framereceived", self._received)
        ws.on("framesent", self._sent)

    def _received(self, payload):
        try:
            channel, msg = decode_frame(payload)
        except (ValueError, KeyError, UnicodeDecodeError):
            return
        if msg.get("header", {}).get("msg_type") == "execute_reply":
            self.replies.append(msg)

    def _sent(self, payload):
        try:
            _, msg = decode_frame(payload)
        except (ValueError, KeyError, UnicodeDecodeError):
            return
        t = msg.get("header", {}).get("msg_type")
        self.sent[t] = self.sent.get(t, 0) + 1
        if t == "comm_open":
            self.comm_targets.append(msg.get("content", {}).get("target_name"))


class LabNotebook:
    """A notebook open in JupyterLab or Notebook 7.  Each step types into a cell of its own at the end of the
    notebook (fresh_cell), so a step that fails leaves the next ones a clean cell."""

    def __init__(self, page, shots, kernel_display="LooseLeaf (GPU)"):
        self.page = page
        self.shots = shots
        self.kernel_display = kernel_display
        self.n = 0  # the cell the step at hand types into (fresh_cell sets it)

    def shot(self, name):
        self.page.screenshot(path=str(self.shots / ("%s.png" % name)), full_page=True)

    def cell(self, i):
        return self.cells().nth(i)

    def editor_text(self, i):
        """The document of cell I's editor (CodeMirror 6 keeps its view on the content element)."""
        return self.cell(i).locator(".cm-content").evaluate("e => e.cmView.view.state.doc.toString()")

    def cells(self):
        # The notebook on show: JupyterLab restores the workspace's other notebooks, in hidden tabs.
        return self.page.locator(".jp-Notebook:visible .jp-CodeCell")

    def completer_open(self):
        # (JupyterLab keeps one hidden .jp-Completer per editor kind)
        return self.page.locator(".jp-Completer:visible").count() > 0

    def fresh_cell(self):
        """Make self.n an empty code cell at the end of the notebook and return its index.  The last cell is
        used when it is empty (running a cell leaves one); otherwise (a step that failed left its text there)
        a new one is inserted below it as a person would: select the cell, then `b` in command mode."""
        if self.completer_open():
            self.page.keyboard.press("Escape")  # a person closes a completer left open before moving on
        cells = self.cells()
        expect(cells.first).to_be_visible()
        last = cells.count() - 1
        if self.editor_text(last) != "":
            cells.nth(last).locator(".jp-InputPrompt").click()
            self.page.keyboard.press("Escape")  # command mode
            self.page.keyboard.press("b")
            expect(cells).to_have_count(last + 2)
            last += 1
        self.n = last
        return last

    def type_cell(self, code, delay_ms=TEST_KEY_DELAY_MS):
        self.fresh_cell()
        cell = self.cell(self.n)
        content = cell.locator(".cm-content")
        for attempt in (1, 2):
            content.click()
            # Keys go to the editor only once it has the focus (the notebook in edit mode); the first cell of a
            # freshly opened notebook gets it a moment after the click.
            expect(cell.locator(".cm-editor.cm-focused")).to_have_count(1)
            type_code(self.page, code, delay_ms, newline=lambda: content.evaluate(_CM_NEWLINE))
            # What reached the editor is what was meant (no auto-closed bracket, no auto-indent added): first
            # wait for it (whitespace-insensitive), then compare line by line, exactly.
            try:
                expect(content).to_have_text(code.replace("\n", ""), use_inner_text=False, timeout=10_000)
                break
            except AssertionError:
                typed = self.editor_text(self.n)
                # Only one failure is the page's and not the kernel's: the first keys of a freshly loaded page
                # lost before JupyterLab had wired the editor (seen once in CI: "import sys..." arrived as
                # "sys...").  A person retypes such a cell; anything else fails the step.
                if attempt == 2 or not typed or typed == code or not code.endswith(typed):
                    raise
                print("\n(the page lost the first keys typed: %r arrived as %r; typed again)" % (code, typed))
                content.evaluate("e => { const v = e.cmView.view; "
                                 "v.dispatch({changes: {from: 0, to: v.state.doc.length, insert: ''}}); }")
        typed = self.editor_text(self.n)
        assert typed == code, "the editor holds %r, not the %r typed" % (typed, code)
        return cell

    def run(self, code, wait=True, delay_ms=TEST_KEY_DELAY_MS):
        """Type CODE into the next cell and run it with Shift+Enter; with WAIT, until its prompt shows a
        number.  Returns the cell's locator."""
        cell = self.type_cell(code, delay_ms)
        # What the page shows before acting: a completer left open would take the Shift+Enter.  None opens
        # while typing (JupyterLab's default, which looseleaf install keeps); a person would close one.
        if self.completer_open():
            self.page.keyboard.press("Escape")
        self.page.keyboard.press("Shift+Enter")
        if wait:
            self.wait_done(cell)
        return cell

    def wait_done(self, cell, timeout=CELL_TIMEOUT_MS):
        expect(cell.locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"\[\d+\]:"), timeout=timeout)

    def output(self, cell):
        return cell.locator(".jp-OutputArea-output")

    def wait_output(self, cell, text, timeout=CELL_TIMEOUT_MS):
        expect(self.output(cell).filter(has_text=text).first).to_be_visible(timeout=timeout)
        return self.output(cell).all_inner_texts()


class ClassicNotebook:
    """A notebook open in the classic notebook 6.4 (CodeMirror 5)."""

    def __init__(self, page, shots):
        self.page = page
        self.shots = shots
        self.n = 0

    def shot(self, name):
        self.page.screenshot(path=str(self.shots / ("%s.png" % name)), full_page=True)

    def cell(self, i):
        return self.page.locator("#notebook-container .cell.code_cell").nth(i)

    def run(self, code, delay_ms=TEST_KEY_DELAY_MS):
        cell = self.cell(self.n)
        cell.locator(".CodeMirror").click()
        type_code(self.page, code, delay_ms)
        self.page.keyboard.press("Shift+Enter")
        self.n += 1
        expect(cell.locator(".input_prompt")).to_have_text(re.compile(r"In\s*\[\d+\]:"),
                                                           timeout=CELL_TIMEOUT_MS)
        return cell

    def wait_output(self, cell, text, timeout=CELL_TIMEOUT_MS):
        expect(cell.locator(".output_area").filter(has_text=text).first).to_be_visible(timeout=timeout)
        return cell.locator(".output_area").all_inner_texts()

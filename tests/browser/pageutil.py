"""What a user does in a notebook page, for Playwright: type a cell at human speed, run it, read its output.
JupyterLab and Notebook 7 share the notebook's DOM (.jp-Notebook, CodeMirror 6); Debian's classic notebook
6.4 has its own (.cell, CodeMirror 5): ClassicNotebook.

Runs in the pytest (or benchmark) process.  Every wait is on page state (an element, a text), never a sleep.
"""
import re

from playwright.sync_api import expect

# A person types ~5-8 characters a second; tests type faster (still key by key) to stay short.
TEST_KEY_DELAY_MS = 15
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


class LabNotebook:
    """A notebook open in JupyterLab or Notebook 7, its cells run in order from the first."""

    def __init__(self, page, shots, kernel_display="LooseLeaf (GPU)"):
        self.page = page
        self.shots = shots
        self.kernel_display = kernel_display
        self.n = 0  # cells run so far; the next is typed into cell self.n

    def shot(self, name):
        self.page.screenshot(path=str(self.shots / ("%s.png" % name)), full_page=True)

    def cell(self, i):
        return self.page.locator(".jp-Notebook .jp-CodeCell").nth(i)

    def editor_text(self, i):
        """The document of cell I's editor (CodeMirror 6 keeps its view on the content element)."""
        return self.cell(i).locator(".cm-content").evaluate("e => e.cmView.view.state.doc.toString()")

    def type_cell(self, code, delay_ms=TEST_KEY_DELAY_MS):
        cell = self.cell(self.n)
        content = cell.locator(".cm-content")
        content.click()
        type_code(self.page, code, delay_ms, newline=lambda: content.evaluate(_CM_NEWLINE))
        # What reached the editor is what was meant (no auto-closed bracket, no auto-indent added): first wait
        # for it (whitespace-insensitive), then compare line by line, exactly.
        expect(cell.locator(".cm-content")).to_have_text(code.replace("\n", ""), use_inner_text=False)
        typed = self.editor_text(self.n)
        assert typed == code, "the editor holds %r, not the %r typed" % (typed, code)
        return cell

    def run(self, code, wait=True, delay_ms=TEST_KEY_DELAY_MS):
        """Type CODE into the next cell and run it with Shift+Enter; with WAIT, until its prompt shows a
        number.  Returns the cell's locator."""
        cell = self.type_cell(code, delay_ms)
        self.page.keyboard.press("Shift+Enter")
        self.n += 1
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

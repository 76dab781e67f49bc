"""LooseLeaf in a real browser, used as a person would: JupyterLab 4 (the launcher, CPU and GPU cells, a matplotlib
plot, an error's traceback, input() in a GPU cell, Tab completion on a GPU-made tensor, an interrupt from the
toolbar, a restart from the Kernel menu then `%looseleaf restore` of what the GPU cell made, an ipywidgets slider
whose callback writes into an Output widget), then in a fresh notebook on LooseLeaf and one on ipykernel the same
steps (Tab completion of a package not yet imported, tqdm.auto's widget bar in a CPU and a GPU cell), Notebook 7
on the same server (a shorter set) and, as a smoke, Debian's classic notebook 6.4.

Runs in the pytest process (`make test-browser`); the Jupyter servers and chromium are its children (see
browserutil.py).  Each step saves a screenshot under the test run's temporary directory (printed at the end of
the run; not committed).  The steps of one frontend share one notebook page and run in file order, each in a
cell of its own at the end of the notebook (pageutil.LabNotebook.fresh_cell), so one step that fails does not
take the next ones with it.

LooseLeaf is installed as `make run` installs it, edit-time hints on (its JupyterLab extension sends the cell
being edited to the kernel); every JupyterLab setting the server reads is the run's own (browserutil.py), never
the project venv's.  Typing must stay exactly as in stock JupyterLab: test_lab_typing_with_enter_is_exact.

GPU cells: what routes a cell to a worker is the README's ("Cell analysis"): here the cells that use the tensor
`t`.  They print `os.getpid() != kpid` (the kernel's pid) to show in the page that they ran elsewhere.
"""
import json
import os
import re
import urllib.request

import pytest

from browserutil import DEBIAN_NOTEBOOK, Server, have_chromium, launch_chromium
from pageutil import HUMAN_KEY_DELAY_MS, ClassicNotebook, LabNotebook, Traffic, expect

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(not have_chromium(), reason="Debian's chromium (/usr/bin/chromium) is needed")

KERNEL_DISPLAY = "LooseLeaf (GPU)"
# JupyterLab's first-run news prompt would sit over the notebook in every screenshot.
LAB_USER_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                     '{"fetchNews": "false", "checkForUpdates": false}'}


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    d = tmp_path_factory.mktemp("screenshots")
    yield d
    print("\nscreenshots: %s" % d)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    for rel, text in LAB_USER_SETTINGS.items():
        path = root / "lab-user-settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # Hints on, as `make run` installs LooseLeaf (bench_hints.py measures what they buy).
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
def lab(lab_server, browser, shots):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    nb = LabNotebook(page, shots)
    nb.server = lab_server
    nb.traffic = Traffic(page)
    yield nb
    ctx.close()


def _kernel_idle(page):
    expect(page.locator(".jp-StatusBar-Widget", has_text="%s | Idle" % KERNEL_DISPLAY).first).to_be_visible(
        timeout=120_000)


# ---- JupyterLab ---------------------------------------------------------------------------------------------

def test_lab_launcher_opens_a_looseleaf_notebook(lab):
    page = lab.page
    page.goto(lab.server.page_url("/lab"))
    card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text=KERNEL_DISPLAY)
    expect(card).to_be_visible()
    lab.shot("lab-01-launcher")
    card.click()
    expect(page.locator(".jp-Notebook .jp-CodeCell").first).to_be_visible()
    _kernel_idle(page)
    lab.shot("lab-02-notebook")


def test_lab_cpu_cell(lab):
    cell = lab.run("import os, torch\nkpid = os.getpid()\nprint('cpu says', 6 * 7)")
    assert lab.wait_output(cell, "cpu says 42") == ["cpu says 42\n"]
    lab.shot("lab-03-cpu-cell")


def test_lab_gpu_cell(lab):
    cell = lab.run("t = torch.arange(6.0) * 2\nprint('gpu says', t.sum().item(), 'worker', os.getpid() != kpid)")
    lab.wait_output(cell, "gpu says 30.0 worker True")
    lab.shot("lab-04-gpu-cell")


def test_lab_matplotlib_plot(lab):
    cell = lab.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    img = cell.locator(".jp-RenderedImage img")
    expect(img).to_be_visible(timeout=120_000)
    assert img.get_attribute("src").startswith("data:image/png")
    assert img.evaluate("i => i.naturalWidth") > 100
    lab.shot("lab-05-plot")


def test_lab_error_with_traceback(lab):
    cell = lab.run("def boom(n): return 1 / n\nboom(0)")
    text = "".join(lab.wait_output(cell, "ZeroDivisionError"))
    assert "division by zero" in text
    assert "boom(0)" in text and "return 1 / n" in text  # the frames, with their source lines
    lab.shot("lab-06-error")


def test_lab_input_in_gpu_cell(lab):
    cell = lab.run("name = input('who? ')\nprint('hello', name, t.sum().item(), os.getpid() != kpid)", wait=False)
    box = lab.page.locator(".jp-Stdin-input")
    expect(box).to_be_visible(timeout=120_000)
    lab.shot("lab-07-input-asked")
    box.fill("Ada")
    box.press("Enter")
    lab.wait_done(cell)
    lab.wait_output(cell, "hello Ada 30.0 True")
    lab.shot("lab-08-input-answered")


def test_lab_tab_completion_on_gpu_tensor(lab):
    lab.type_cell("t.cums")
    editor = lab.cell(lab.n).locator(".cm-content")
    # A tensor has cumsum and cumsum_: the completer lists both.  JupyterLab drops a completion reply that takes
    # longer than its provider timeout (1 s); the kernel answers from the worker's account of `t` (type and
    # dir()) instead of restoring it when that would import torch, so one Tab is enough.  A machine loaded by
    # other work can still make a reply late: the test presses again then, and prints how many it took.  Each
    # press waits for what the page shows first: the typed text settled in the editor (type_cell), a pause
    # as a person makes before Tab, and no list already open.
    item = lab.page.locator('.jp-Completer .jp-Completer-item[data-value="cumsum"]')
    for tries in (1, 2, 3):
        lab.page.wait_for_timeout(HUMAN_KEY_DELAY_MS)
        if not lab.completer_open():
            lab.page.keyboard.press("Tab")
        try:
            expect(item).to_be_visible(timeout=10_000)
            break
        except AssertionError:
            # JupyterLab may have inserted the common prefix and hidden the list: the text is still ours.
            assert lab.editor_text(lab.n) in ("t.cums", "t.cumsum"), lab.editor_text(lab.n)
            if tries == 3:
                raise
    print("\nTab completion on the GPU-made tensor: completer shown after %d Tab press(es)" % tries)
    lab.shot("lab-09-completer")
    item.click()
    expect(editor).to_have_text("t.cumsum")
    expect(lab.page.locator(".jp-Completer:visible")).to_have_count(0)
    lab.page.keyboard.type("(0)[-1].item()", delay=HUMAN_KEY_DELAY_MS)
    expect(editor).to_have_text("t.cumsum(0)[-1].item()")
    lab.page.keyboard.press("Shift+Enter")
    cell = lab.cell(lab.n)
    lab.wait_done(cell)
    lab.wait_output(cell, "30.0")
    lab.shot("lab-10-completed")


# Ordinary code, typed with Enter at the end of each line as a person types it.  The two imports are the lines
# that JupyterLab's continuous hinting (what `looseleaf install` turned on before) rewrote on Enter into
# `import numpy as numpy` and `import ipywidgets as %%writefile`.
ORDINARY_LINES = ["import numpy as np",
                  "import ipywidgets as w",
                  "import os",
                  "arr = np.arange(10)",
                  "total = t.sum().item() + arr.sum()",
                  "print('typed', total, w.__name__)"]


def _type_lines_with_enter(nb, lines):
    """Type LINES into the focused editor key by key at a person's pace, Enter after each but the last;
    nothing in between but what the page shows.  Returns whether a completer was seen open after any Enter."""
    seen_completer = False
    for i, line in enumerate(lines):
        nb.page.keyboard.type(line, delay=HUMAN_KEY_DELAY_MS)
        if i < len(lines) - 1:
            nb.page.wait_for_timeout(HUMAN_KEY_DELAY_MS)
            seen_completer = seen_completer or nb.completer_open()
            nb.page.keyboard.press("Enter")
    return seen_completer


def _setting(server, plugin, key):
    """The value of setting KEY of PLUGIN the page gets: the user's own, else the schema's default (where the
    server has applied the administrators' overrides)."""
    with urllib.request.urlopen(server.api_url("/lab/api/settings/" + plugin), timeout=30) as r:
        reply = json.load(r)
    return (reply.get("settings") or {}).get(key, reply["schema"]["properties"][key].get("default"))


def test_lab_typing_with_enter_is_exact(lab):
    """Typing stays JupyterLab's own with LooseLeaf's hints on: no completer pops up while typing, Enter ends
    the line, and the cell holds exactly what was typed; the draft still reaches the kernel (on the
    looseleaf.prefetch comm), and the cell runs."""
    # JupyterLab's defaults: no continuous hinting; Enter in an open completer is its own business.
    assert _setting(lab.server, "@jupyterlab/completer-extension:manager", "autoCompletion") is False
    sent_before = lab.traffic.sent.get("comm_msg", 0)
    lab.fresh_cell()
    cell = lab.cell(lab.n)
    cell.locator(".cm-content").click()
    seen_completer = _type_lines_with_enter(lab, ORDINARY_LINES)
    code = "\n".join(ORDINARY_LINES)
    expect(cell.locator(".cm-content")).to_have_text(code.replace("\n", ""), use_inner_text=False)
    assert lab.editor_text(lab.n) == code
    assert not seen_completer and not lab.completer_open()
    lab.shot("lab-10b-typed")
    assert "looseleaf.prefetch" in lab.traffic.comm_targets
    assert lab.traffic.sent.get("comm_msg", 0) > sent_before
    lab.page.keyboard.press("Shift+Enter")
    lab.wait_done(cell)
    lab.wait_output(cell, "typed 75.0 ipywidgets")


def test_lab_interrupt_running_gpu_loop_from_toolbar(lab):
    cell = lab.run("while True: t = t + 1", wait=False)
    expect(cell.locator(".jp-InputArea-prompt")).to_have_text("[*]:")
    expect(lab.page.locator(".jp-StatusBar-Widget", has_text="%s | Busy" % KERNEL_DISPLAY).first).to_be_visible()
    lab.shot("lab-11-loop-running")
    lab.page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()
    lab.wait_done(cell)
    lab.wait_output(cell, "KeyboardInterrupt")
    lab.shot("lab-12-interrupted")
    cell = lab.run("print('still', t.sum().item() > 30)")
    lab.wait_output(cell, "still True")


def test_lab_restart_from_kernel_menu(lab):
    page = lab.page
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel…$")).click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible()
    lab.shot("lab-13-restart-dialog")
    dialog.locator("button.jp-mod-accept").click()
    _kernel_idle(page)
    cell = lab.run("print('after restart', 't' in globals(), 'kpid' in globals())")
    lab.wait_output(cell, "after restart False False")
    # A clean restart, as users know it; the store the notebook's GPU cells committed to was kept, and the
    # first reply offers it (keep.py), once.
    texts = lab.wait_output(cell, "%looseleaf restore brings them back")
    assert any("previous kernel of this notebook" in t for t in texts), texts
    lab.shot("lab-14-restarted")
    cell = lab.run("%looseleaf restore")
    text = "".join(lab.wait_output(cell, "LooseLeaf: restored"))
    assert re.search(r"restored \d+ variables? .*\bt\b", text), text
    # (t is what the GPU cells left it, the interrupted loop's last value: its type and the kernel pid's are
    # what is checked.)
    cell = lab.run("print('restored', type(t).__name__, kpid > 0, torch.__name__)")
    lab.wait_output(cell, "restored Tensor True torch")
    cell = lab.run("print('offered again:', 1)")
    assert lab.wait_output(cell, "offered again: 1") == ["offered again: 1\n"]
    lab.shot("lab-14b-restored")


SLIDER_CELL = ("import ipywidgets as w\n"
               "s = w.IntSlider(value=3, description='level')\n"
               "o = w.Output()\n"
               "s.observe(lambda ch: o.append_stdout('now at %d\\n' % ch['new']), names='value')\n"
               "display(s, o)")


def _drive_slider(nb, cell, shot_prefix):
    """Set the slider to 4 as a user can: type it into the slider's readout."""
    expect(cell.locator(".widget-slider .noUi-handle")).to_be_visible(timeout=120_000)
    nb.shot(shot_prefix + "-slider")
    readout = cell.locator(".widget-readout")
    expect(readout).to_have_text("3")
    readout.click()
    nb.page.keyboard.press("Control+A")
    nb.page.keyboard.type("4")
    nb.page.keyboard.press("Enter")
    expect(readout).to_have_text("4")


def test_lab_widget_slider_callback(lab):
    cell = lab.run(SLIDER_CELL)
    _drive_slider(lab, cell, "lab-15")
    # The callback's text lands in the Output widget, under the slider.
    expect(cell.locator(".widget-output", has_text="now at 4")).to_be_visible()
    lab.shot("lab-16-slider-moved")
    cell = lab.run("print('value is', s.value)")
    lab.wait_output(cell, "value is 4")


def test_lab_typing_on_ipykernel_is_exact(lab_server, browser, shots):
    """The extension sends nothing to a kernel that is not LooseLeaf, and typing there is stock too."""
    lab_server.write_notebook("ipk.ipynb", kernel="python3")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    traffic = Traffic(page)
    try:
        page.goto(lab_server.page_url("/lab/tree/ipk.ipynb"))
        display = lab_server.kernelspecs["python3"]["spec"]["display_name"]
        expect(page.locator(".jp-StatusBar-Widget", has_text="%s | Idle" % display).first).to_be_visible(
            timeout=120_000)
        nb = LabNotebook(page, shots, kernel_display=display)
        nb.fresh_cell()
        nb.cell(nb.n).locator(".cm-content").click()
        lines = ORDINARY_LINES[:4] + ["print('typed', arr.sum(), w.IntSlider(value=2).value)"]
        assert not _type_lines_with_enter(nb, lines)
        assert nb.editor_text(nb.n) == "\n".join(lines)
        page.keyboard.press("Shift+Enter")
        nb.wait_output(nb.cell(nb.n), "typed 45 2")
        nb.shot("lab-ipykernel-typed")
        assert "looseleaf.prefetch" not in traffic.comm_targets
    finally:
        ctx.close()


# ---- Libraries in a notebook of each kernel: LooseLeaf's and ipykernel's, the same steps ----------------------

PYKERNELS = ["looseleaf", "python3"]
TORCH_LOADED = "import sys\nprint('torch in sys.modules:', 'torch' in sys.modules)"


@pytest.fixture(scope="module", params=PYKERNELS)
def kernel_nb(request, lab_server, browser, shots):
    """A notebook of its own, with a fresh kernel, on LooseLeaf and then on ipykernel (the reference): the tests
    that take it run on both, in file order, each in a cell of its own."""
    kernel = request.param
    name = "libs-%s.ipynb" % kernel
    lab_server.write_notebook(name, kernel=kernel)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    display = lab_server.kernelspecs[kernel]["spec"]["display_name"]
    nb = LabNotebook(page, shots, kernel_display=display)
    nb.kernel = kernel
    nb.traffic = Traffic(page)
    page.goto(lab_server.page_url("/lab/tree/" + name))
    expect(page.locator(".jp-StatusBar-Widget", has_text="%s | Idle" % display).first).to_be_visible(
        timeout=120_000)
    yield nb
    ctx.close()


def _route(nb, n0):
    """Where LooseLeaf ran the cell sent after NB had received N0 execute_replies (its metadata.looseleaf.route);
    None on ipykernel.  The reply's websocket frame event reaches this process on its own time: waited for."""
    if nb.kernel != "looseleaf":
        return None
    for _ in range(300):
        if len(nb.traffic.replies) > n0:
            break
        nb.page.wait_for_timeout(100)  # Playwright delivers the frame events while the page waits
    assert len(nb.traffic.replies) == n0 + 1, nb.traffic.replies[n0:]
    return nb.traffic.replies[n0].get("metadata", {}).get("looseleaf", {}).get("route")


def _run(nb, code):
    """nb.run(CODE); returns (its cell, its LooseLeaf route or None)."""
    n0 = len(nb.traffic.replies)
    cell = nb.run(code)
    return cell, _route(nb, n0)


def test_lab_completion_of_an_unimported_package(kernel_nb):
    """Issue 29, item 3: Tab on `torch.ar` in a fresh kernel, torch imported only in the cell's text (not run),
    lists `arange` as on ipykernel; the completed GPU cell then runs, and LooseLeaf's kernel still has not
    imported torch (ipykernel imports it to answer)."""
    nb = kernel_nb
    cell, route = _run(nb, TORCH_LOADED)
    nb.wait_output(cell, "torch in sys.modules: False")  # a fresh kernel
    assert route in (None, "cpu")
    draft = "import torch\ntorch.ar"
    cell = nb.type_cell(draft)
    editor = cell.locator(".cm-content")
    # The first answer can come late or empty: ipykernel imports torch to answer (JupyterLab drops a reply
    # slower than its 1 s provider timeout), LooseLeaf answers from its index of torch's names once that is
    # written.  Each press waits for what the page shows (as test_lab_tab_completion_on_gpu_tensor does).
    item = nb.page.locator('.jp-Completer .jp-Completer-item[data-value="arange"]')
    tries = 0
    while True:
        tries += 1
        nb.page.wait_for_timeout(HUMAN_KEY_DELAY_MS)
        if not nb.completer_open():
            nb.page.keyboard.press("Tab")
        try:
            expect(item).to_be_visible(timeout=10_000)
            break
        except AssertionError:
            assert nb.editor_text(nb.n) == draft, nb.editor_text(nb.n)
            if nb.completer_open():
                nb.page.keyboard.press("Escape")  # a list without arange: a person closes it, asks again
            if tries == 8:
                raise
    print("\n%s: `torch.ar` listed arange after %d Tab press(es)" % (nb.kernel, tries))
    nb.shot("libs-%s-01-completer" % nb.kernel)
    item.click()
    expect(editor).to_have_text("import torchtorch.arange", use_inner_text=False)
    expect(nb.page.locator(".jp-Completer:visible")).to_have_count(0)
    nb.page.keyboard.type("(5).sum().item()", delay=HUMAN_KEY_DELAY_MS)
    assert nb.editor_text(nb.n) == "import torch\ntorch.arange(5).sum().item()"
    n0 = len(nb.traffic.replies)
    nb.page.keyboard.press("Shift+Enter")
    nb.wait_done(cell)
    nb.wait_output(cell, "10")
    assert _route(nb, n0) in (None, "gpu")
    nb.shot("libs-%s-02-completed" % nb.kernel)
    # `torch` not named: a CPU cell on LooseLeaf, run in the kernel itself.
    cell, route = _run(nb, TORCH_LOADED)
    text = "".join(nb.wait_output(cell, "torch in sys.modules:"))
    print("%s after the completion and the GPU cell: %s" % (nb.kernel, text.strip()))
    if nb.kernel == "looseleaf":
        assert route == "cpu"
        assert text == "torch in sys.modules: False\n"


TQDM_CELLS = {"cpu": "from tqdm.auto import tqdm\nfor i in tqdm(range(30)): pass",
              "gpu": "import torch\nfrom tqdm.auto import tqdm\nfor i in tqdm(range(30)): torch.ones(2) * i"}
STDERR = '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'


@pytest.mark.parametrize("route", ["cpu", "gpu"])
def test_lab_tqdm_auto_draws_the_widget_bar(kernel_nb, route):
    """Issue 29, item 2: tqdm.auto draws ipywidgets' progress bar (FloatProgress between two HTML labels), as on
    ipykernel, not a text bar on the red stderr background, in a CPU cell and in a GPU cell alike."""
    nb = kernel_nb
    cell, ran = _run(nb, TQDM_CELLS[route])
    # The right label's last update says the loop is done; by then a text bar would have been written.
    expect(cell.locator(".widget-html", has_text="30/30")).to_be_visible(timeout=120_000)
    expect(cell.locator(".widget-hprogress")).to_be_visible()
    expect(cell.locator(STDERR)).to_have_count(0)
    assert ran in (None, route)
    nb.shot("libs-%s-tqdm-%s" % (nb.kernel, route))


# ---- Notebook 7, same server ----------------------------------------------------------------------------------

def test_notebook7(lab_server, browser, shots):
    lab_server.write_notebook("nb7.ipynb")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(lab_server.page_url("/tree"))
        entry = page.locator(".jp-DirListing-item", has_text="nb7.ipynb")
        expect(entry).to_be_visible()
        page.screenshot(path=str(shots / "nb7-01-tree.png"))
        with ctx.expect_page() as opened:  # Notebook 7 opens a notebook in a new tab
            entry.dblclick()
        page = opened.value
        page.set_default_timeout(60_000)
        expect(page).to_have_url(re.compile(r"/notebooks/nb7\.ipynb"))
        nb = LabNotebook(page, shots)
        expect(page.locator(".jp-Notebook .jp-CodeCell").first).to_be_visible()
        cell = nb.run("import os, torch\nkpid = os.getpid()\nprint('cpu says', 6 * 7)")
        nb.wait_output(cell, "cpu says 42")
        cell = nb.run("t = torch.ones(5) * 3\nprint('gpu says', t.sum().item(), 'worker', os.getpid() != kpid)")
        nb.wait_output(cell, "gpu says 15.0 worker True")
        nb.shot("nb7-02-cells")
        cell = nb.run("1 / 0")
        nb.wait_output(cell, "ZeroDivisionError")
        cell = nb.run(SLIDER_CELL)
        _drive_slider(nb, cell, "nb7-03")
        expect(cell.locator(".widget-output", has_text="now at 4")).to_be_visible()
        nb.shot("nb7-04-slider-moved")
    finally:
        ctx.close()


# ---- Debian's classic notebook 6.4 (smoke) ---------------------------------------------------------------------

@pytest.mark.skipif(not os.access(DEBIAN_NOTEBOOK, os.X_OK),
                    reason="Debian's classic notebook (python3-notebook, %s) is not installed" % DEBIAN_NOTEBOOK)
def test_classic_notebook_smoke(tmp_path_factory, browser, shots):
    srv = Server(str(tmp_path_factory.mktemp("classic")), kind="classic")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        srv.write_notebook("classic.ipynb")
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        page.goto(srv.page_url("/notebooks/classic.ipynb"))
        expect(page.locator("#kernel_indicator_icon.kernel_idle_icon")).to_be_visible(timeout=120_000)
        expect(page.locator(".kernel_indicator_name")).to_have_text(KERNEL_DISPLAY)
        nb = ClassicNotebook(page, shots)
        cell = nb.run("import os, torch\nkpid = os.getpid()\nprint('cpu says', 6 * 7)")
        nb.wait_output(cell, "cpu says 42")
        cell = nb.run("t = torch.ones(5) * 3\nprint('gpu says', t.sum().item(), 'worker', os.getpid() != kpid)")
        nb.wait_output(cell, "gpu says 15.0 worker True")
        nb.shot("classic-01-cells")
        # Debian's ipywidgets 6 (ipykernel.comm.Comm) and its jupyter-js-widgets: the slider must render.
        cell = nb.run("import ipywidgets as w\ns = w.IntSlider(value=3)\n"
                      "s.observe(lambda ch: print('now at', ch['new']), names='value')\ndisplay(s)")
        handle = cell.locator(".widget-hslider .ui-slider-handle")
        expect(handle).to_be_visible(timeout=60_000)
        nb.shot("classic-02-slider")
        handle.click()
        handle.press("ArrowRight")
        expect(cell.locator(".widget-readout")).to_have_text("4")
        cell = nb.run("print('value is', s.value)")
        nb.wait_output(cell, "value is 4")
        nb.shot("classic-03-slider-moved")
    finally:
        ctx.close()
        srv.stop()

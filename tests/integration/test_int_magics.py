"""IPython magics through the kernel: %time, %timeit, %%capture, !cmd,
%matplotlib inline producing an image/png display, and a few more that
frontends and notebooks use."""
import base64
import re

import pytest

from itest_util import normalized, of_type, stream_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_matplotlib_inline_by_default(kernel, reference):
    """Without any %matplotlib, a figure made in a cell is shown at its end
    (ipykernel sets the inline backend by default).  First in this module, so
    the kernels have run no %matplotlib yet."""
    code = "import matplotlib\nimport matplotlib.pyplot as plt\nplt.plot([3, 1, 2]);\nmatplotlib.get_backend()"
    mine_reply, mine = kernel.execute(code, timeout=60)
    ref_reply, ref = reference.execute(code, timeout=60)
    assert mine_reply["content"]["status"] == ref_reply["content"]["status"] == "ok"
    assert [m["msg_type"] for m in mine] == [m["msg_type"] for m in ref]
    assert of_type(mine, "execute_result")[0]["content"]["data"]["text/plain"] == \
        "'module://matplotlib_inline.backend_inline'"
    shown = of_type(mine, "display_data")
    assert len(shown) == 1 and "image/png" in shown[0]["content"]["data"]


def test_time(kernel):
    msgs = kernel.run_ok("%time sum(range(10))")
    out = stream_text(msgs)
    assert re.search(r"^CPU times: user .+, sys: .+, total: .+$", out, re.M), out
    assert re.search(r"^Wall time: .+$", out, re.M), out
    assert of_type(msgs, "execute_result")[0]["content"]["data"]["text/plain"] == "45"


def test_time_cell(kernel):
    msgs = kernel.run_ok("%%time\nx_timed = 3\nprint('body ran')")
    out = stream_text(msgs)
    assert "body ran\n" in out and "Wall time:" in out
    assert kernel.eval_text("x_timed") == "3"


def test_timeit(kernel):
    msgs = kernel.run_ok("%timeit -n1 -r1 pass")
    out = stream_text(msgs)
    assert re.search(r"per loop \(mean . std\. dev\. of 1 run, 1 loop each\)", out), out


def test_capture(kernel):
    msgs = kernel.run_ok("%%capture cap\nimport sys\nprint('hidden out')\nprint('hidden err', file=sys.stderr)\n"
                         "display('hidden display')")
    assert stream_text(msgs, "stdout") == "" and stream_text(msgs, "stderr") == ""
    assert not of_type(msgs, "display_data")
    assert kernel.eval_text("cap.stdout") == "'hidden out\\n'"
    assert kernel.eval_text("cap.stderr") == "'hidden err\\n'"
    assert kernel.eval_text("len(cap.outputs)") == "1"
    # Replaying the capture publishes what was held back.
    msgs = kernel.run_ok("cap.show()")
    assert stream_text(msgs, "stdout") == "hidden out\n"
    assert stream_text(msgs, "stderr") == "hidden err\n"
    assert [m["content"]["data"]["text/plain"] for m in of_type(msgs, "display_data")] == ["'hidden display'"]


def test_shell_escape(kernel):
    msgs = kernel.run_ok("!echo bang-$((6*7))")
    assert stream_text(msgs).replace("\r\n", "\n") == "bang-42\n"
    msgs = kernel.run_ok("lines = !printf 'a\\nb\\n'\nprint(list(lines))")
    assert stream_text(msgs) == "['a', 'b']\n"
    msgs = kernel.run_ok("!echo to-stderr >&2")
    # IPython's system() runs the command on a pty: both streams arrive as stdout.
    assert "to-stderr" in stream_text(msgs, "stdout") + stream_text(msgs, "stderr")


def test_matplotlib_inline(kernel):
    msgs = kernel.run_ok("%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                         "fig, ax = plt.subplots(figsize=(2, 2))\nax.plot([1, 2, 3])\nax.set_title('t');",
                         timeout=60)
    shown = of_type(msgs, "display_data")
    assert len(shown) == 1, [m["msg_type"] for m in msgs]
    data = shown[0]["content"]["data"]
    assert set(data) == {"image/png", "text/plain"}
    assert data["text/plain"] == "<Figure size 200x200 with 1 Axes>"
    assert base64.b64decode(data["image/png"]).startswith(PNG_MAGIC)
    # No stray figure is left to show in the next cell.
    msgs = kernel.run_ok("1")
    assert not of_type(msgs, "display_data")


MAGICS = {
    "env": "%env LL_TEST_VAR=hello\nimport os\nprint(os.environ['LL_TEST_VAR'])",
    "who": "magic_a = 1\nmagic_b = 'x'\n%who_ls str",
    "pwd_cd": "import os, tempfile\n_d = os.path.realpath(tempfile.mkdtemp())\n%cd -q {_d}\nprint(os.getcwd() == _d)",
    "writefile": "import tempfile, os\n_p = os.path.join(tempfile.mkdtemp(), 'w.txt')\n"
                 "%cd -q {os.path.dirname(_p)}\n"
                 "get_ipython().run_cell_magic('writefile', 'w.txt', 'line\\n')\nprint(open(_p).read(), end='')",
    "lsmagic_has_time": "'time' in get_ipython().magics_manager.lsmagic()['line']",
    "unknown_magic": "%no_such_magic_xyz",
    "autoreload": "%load_ext autoreload\n%autoreload 2\nprint('ok')",
    "alias": "%alias ll_echo echo %s-suffix\n%ll_echo word",
    "bash_cell": "%%bash\necho out-line\necho err-line >&2\nexit 0",
    "script_python": "%%python3\nimport sys\nprint('from a child python', sys.version_info[0])",
    "reset": "reset_me = 1\n%reset -f\nprint('reset_me' in dir())",
    "who_after": "%who int",
}


@pytest.mark.parametrize("case", sorted(MAGICS))
def test_magic_matches_ipykernel(kernel, reference, case):
    code = MAGICS[case]
    mine_reply, mine = kernel.execute(code)
    ref_reply, ref = reference.execute(code)
    assert mine_reply["content"]["status"] == ref_reply["content"]["status"]
    # Output of commands run on a pty ends lines with \r\n either way.
    assert normalized(mine) == normalized(ref)

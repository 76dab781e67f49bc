"""Rich output: display_data, update_display_data (display_id),
clear_output, execute_result with rich reprs; each snippet's iopub messages
must match ipykernel's."""
import base64

import pytest

from itest_util import Kernel, norm_value, normalized, of_type, types

# A valid 1x1 PNG, so an image repr carries real image bytes.
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

RICH_CLASS = """
import base64
class Rich:
    def _repr_html_(self):
        return '<i>rich</i>'
    def _repr_png_(self):
        return base64.b64decode(%r)
    def _repr_markdown_(self):
        return '*rich*'
    def __repr__(self):
        return 'Rich()'
""" % PNG_B64

SNIPPETS = {
    "execute_result": "6 * 7",
    "result_suppressed": "6 * 7;",
    "result_none": "None",
    "display_html": "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))",
    "display_several": "display(1, 'two', [3])",
    "display_raw": "display({'text/plain': 'raw', 'application/json': {'a': [1, 2]}}, raw=True)",
    "display_metadata": "display({'text/plain': 'm'}, raw=True, metadata={'isolated': True})",
    "rich_result": RICH_CLASS + "Rich()",
    "rich_display": RICH_CLASS + "display(Rich())\nprint('after')",
    "update_display": "from IPython.display import update_display\nh = display('a', display_id='dd1')\nh.update('b')\nupdate_display('c', display_id='dd1')",
    "generated_display_id": "h = display('a', display_id=True)\nh.update('b')",
    "clear_output": "from IPython.display import clear_output\nprint('a')\nclear_output()\nprint('b')",
    "clear_output_wait": "from IPython.display import clear_output\nprint('a')\nclear_output(wait=True)\nprint('b')",
    "markdown_latex": "from IPython.display import Markdown, Latex, JSON\ndisplay(Markdown('# t'), Latex('$x$'), JSON({'k': 1}))",
    "repr_address": "class Plain: pass\nPlain()",
    "print_and_result": "print('p')\n'r'",
    "set_next_input_payload": "get_ipython().set_next_input('x = 1')",
    "pager_payload": "len?",
    "pager_source": "def documented():\n    '''Doc.'''\ndocumented??",
    "help_builtin": "help(len)",
    "repr_raises": "class BadRepr:\n    def __repr__(self):\n        raise ValueError('no repr')\nBadRepr()",
    "html_repr_raises": "class BadHtml:\n    def _repr_html_(self):\n        raise RuntimeError('no html')\n    def __repr__(self):\n        return 'BadHtml()'\nBadHtml()",
    "nested_run_cell": "_r = get_ipython().run_cell('print(\"inner\")\\n40 + 2')\nprint('outer', _r.result)",
    "unicode_code": "s\u00e9 = 'caf\u00e9 \u2615'\nprint(s\u00e9)\ns\u00e9",
    "crlf_code": "a_crlf = 1\r\nprint(a_crlf + 1)\r\n",
    "large_text": "print('x' * 5000000)",
}


@pytest.mark.parametrize("snippet", sorted(SNIPPETS))
def test_matches_ipykernel(kernel, reference, snippet):
    code = SNIPPETS[snippet]
    mine_reply, mine = kernel.execute(code)
    ref_reply, ref = reference.execute(code)
    assert mine_reply["content"]["status"] == ref_reply["content"]["status"]
    assert normalized(mine) == normalized(ref)
    assert norm_value(mine_reply["content"]["payload"]) == norm_value(ref_reply["content"]["payload"])


def test_execute_result_fields(kernel):
    reply, msgs = kernel.execute(RICH_CLASS + "Rich()")
    res = of_type(msgs, "execute_result")
    assert len(res) == 1
    c = res[0]["content"]
    assert c["execution_count"] == reply["content"]["execution_count"]
    assert c["data"]["text/plain"] == "Rich()"
    assert c["data"]["text/html"] == "<i>rich</i>"
    assert c["data"]["text/markdown"] == "*rich*"
    # Binary reprs travel base64-encoded, as the protocol says.
    assert base64.b64decode(c["data"]["image/png"]) == base64.b64decode(PNG_B64)


def test_update_display_data(kernel):
    _, msgs = kernel.execute("h = display('v1', display_id='upd')\nh.update('v2')")
    assert types(msgs) == ["status", "execute_input", "display_data", "update_display_data", "status"]
    d, u = msgs[2]["content"], msgs[3]["content"]
    assert d["transient"] == {"display_id": "upd"} == u["transient"]
    assert d["data"] == {"text/plain": "'v1'"}
    assert u["data"] == {"text/plain": "'v2'"}


def test_clear_output(kernel):
    _, msgs = kernel.execute("from IPython.display import clear_output\nclear_output(wait=True)")
    cl = of_type(msgs, "clear_output")
    assert [m["content"] for m in cl] == [{"wait": True}]


def test_exit_asks_the_frontend(kernel_name, jupyter_env):
    """`exit` in a cell does not end the kernel by itself: it asks the
    frontend (an ask_exit payload), as ipykernel does."""
    k = Kernel(kernel_name)
    try:
        reply, msgs = k.execute("exit")
        assert reply["content"]["status"] == "ok"
        assert reply["content"]["payload"] == [{"source": "ask_exit", "keepkernel": False}]
        assert k.km.is_alive()
        assert k.eval_text("'still here'") == "'still here'"
    finally:
        k.stop()

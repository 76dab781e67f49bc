"""inspect, complete, is_complete and history requests, compared with
ipykernel on the same code and the same executed cells."""
import pytest

from itest_util import check_envelope, norm_value, strip_ansi

SETUP = "import os\nalpha_value = 1\nalpha_other = 2\ndef helper(a, b=2):\n    '''Helper docstring.'''\n    return a + b\n"


@pytest.fixture(scope="module")
def both(kernel, reference):
    kernel.run_ok(SETUP)
    reference.run_ok(SETUP)
    return kernel, reference


def _request(k, msg_type, content):
    msg_id = k.send(msg_type, content)
    reply = k.reply(msg_id)
    msgs = k.iopub_until_idle(msg_id)
    check_envelope(k, msg_id, msgs)
    assert reply["msg_type"] == msg_type.replace("_request", "_reply")
    assert [m["msg_type"] for m in msgs] == ["status", "status"], "a %s published output" % msg_type
    return reply["content"]


INSPECTS = {
    "function": ("helper", 6, 0),
    "function_detail1": ("helper", 6, 1),
    "builtin": ("print", 5, 0),
    "module_attr": ("os.path.join", 12, 0),
    "cursor_inside_call": ("helper(1, ", 3, 0),
    "unknown": ("no_such_name_q", 14, 0),
}


@pytest.mark.parametrize("case", sorted(INSPECTS))
def test_inspect(both, case):
    code, pos, detail = INSPECTS[case]
    k, ref = both
    content = {"code": code, "cursor_pos": pos, "detail_level": detail}
    mine, theirs = _request(k, "inspect_request", content), _request(ref, "inspect_request", content)
    assert mine["status"] == "ok"
    assert mine["found"] == theirs["found"]
    assert norm_value(mine["data"]) == norm_value(theirs["data"])
    if case == "unknown":
        assert mine["found"] is False and mine["data"] == {}
    else:
        assert mine["found"] is True
        assert "Signature" in strip_ansi(mine["data"]["text/plain"])
    if case.startswith("function"):
        assert "Helper docstring." in mine["data"]["text/plain"]


COMPLETES = {
    "global_prefix": ("alpha_", 6),
    "keyword": ("impo", 4),
    "attribute": ("os.pa", 5),
    "module_name": ("import ma", 9),
    "mid_line": ("x = alpha_v + 1", 11),
    "dict_key": ("d = {'key1': 1}\nd['k", 19),
    "nothing": ("zzzqqq_none", 11),
}


@pytest.mark.parametrize("case", sorted(COMPLETES))
def test_complete(both, case):
    code, pos = COMPLETES[case]
    k, ref = both
    content = {"code": code, "cursor_pos": pos}
    mine, theirs = _request(k, "complete_request", content), _request(ref, "complete_request", content)
    assert mine["status"] == "ok"
    assert (mine["cursor_start"], mine["cursor_end"]) == (theirs["cursor_start"], theirs["cursor_end"])
    assert mine["matches"] == theirs["matches"]
    # Completion types (JupyterLab shows them beside each match).
    assert mine["metadata"] == theirs["metadata"]
    # Names that must be offered (a match may carry its dotted prefix or not,
    # depending on cursor_start; both kernels must agree, checked above).
    expected = {"global_prefix": {"alpha_value", "alpha_other"}, "keyword": {"import"},
                "attribute": {"path"}, "mid_line": {"alpha_value"}, "module_name": {"math"}}
    if case in expected:
        offered = {m.split(".")[-1] for m in mine["matches"]}
        assert expected[case] <= offered
    if case == "nothing":
        assert mine["matches"] == []


IS_COMPLETE = {
    "complete": "x = 1",
    "open_block": "for i in range(3):",
    "open_paren": "x = (1,",
    "invalid": "x = )",
    "continued_block": "def f():\n    return 1",
    "decorator": "@property",
    "magic": "%time",
    "cell_magic_open": "%%capture\nprint(1)",
    "empty": "",
}


@pytest.mark.parametrize("case", sorted(IS_COMPLETE))
def test_is_complete(both, case):
    k, ref = both
    content = {"code": IS_COMPLETE[case]}
    mine, theirs = _request(k, "is_complete_request", content), _request(ref, "is_complete_request", content)
    assert mine == theirs
    expected = {"complete": "complete", "open_block": "incomplete", "open_paren": "incomplete",
                "invalid": "invalid"}
    if case in expected:
        assert mine["status"] == expected[case]
    if case == "open_block":
        assert mine["indent"] == "    "

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


def _drop_own_magic(reply, own="%looseleaf"):
    """A kernel's own magic is offered where IPython offers every magic: LooseLeaf's %looseleaf, ipykernel 7's
    %subshell (for kernel subshells, which LooseLeaf does not implement)."""
    keep = [i for i, m in enumerate(reply["matches"]) if m != own]
    reply["matches"] = [reply["matches"][i] for i in keep]
    exp = reply.get("metadata", {}).get("_jupyter_types_experimental")
    if isinstance(exp, list):
        reply["metadata"]["_jupyter_types_experimental"] = [e for e in exp if e.get("text") != own]


@pytest.mark.parametrize("case", sorted(COMPLETES))
def test_complete(both, case):
    code, pos = COMPLETES[case]
    k, ref = both
    content = {"code": code, "cursor_pos": pos}
    mine, theirs = _request(k, "complete_request", content), _request(ref, "complete_request", content)
    assert mine["status"] == "ok"
    for reply in (mine, theirs):
        _drop_own_magic(reply)
        _drop_own_magic(reply, "%subshell")
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


def test_requests_while_cell_runs(kernel, tmp_path):
    """JupyterLab sends complete/inspect/is_complete while a cell runs (the
    user keeps typing): every one is answered, with the same answers as when
    idle, and the running cell is unaffected."""
    go = str(tmp_path / "go")
    kernel.run_ok("typing_target = [1, 2]")
    code = ("import os, time\nprint('started', flush=True)\n_t = time.monotonic() + 30\n"
            "while not os.path.exists(%r) and time.monotonic() < _t:\n    time.sleep(0.01)\n"
            "typing_target.append(3)" % go)
    cell = kernel.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                           "user_expressions": {}, "allow_stdin": False})
    kernel.iopub_next(cell, lambda m: m["msg_type"] == "stream" and "started" in m["content"]["text"])
    sent = []
    for i in range(3):
        sent.append(("complete", kernel.send("complete_request", {"code": "typing_t", "cursor_pos": 8})))
        sent.append(("inspect", kernel.send("inspect_request", {"code": "typing_target", "cursor_pos": 5,
                                                                "detail_level": 0})))
        sent.append(("is_complete", kernel.send("is_complete_request", {"code": "for x in y:"})))
    open(go, "w").close()
    assert kernel.reply(cell)["content"]["status"] == "ok"
    for kind, msg_id in sent:
        c = kernel.reply(msg_id)["content"]
        if kind == "complete":
            assert c["status"] == "ok" and "typing_target" in c["matches"]
        elif kind == "inspect":
            assert c["status"] == "ok" and c["found"] is True
        else:
            assert c["status"] == "incomplete"
    assert kernel.eval_text("typing_target") == "[1, 2, 3]"

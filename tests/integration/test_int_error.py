"""error messages and error replies: ename, evalue and the traceback, which
must be formatted as ipykernel formats it (same lines, same colours) up to
the prompt numbers and generated cell file names."""
import pytest

from itest_util import normalized, of_type, strip_ansi

ERRORS = {
    "zero_division": ("1/0", "ZeroDivisionError"),
    "name_error": ("undefined_name_xyz", "NameError"),
    "syntax_error": ("def f(:\n    pass", "SyntaxError"),
    "indentation_error": ("if True:\npass", "IndentationError"),
    "nested_call": ("def inner(v):\n    return {}[v]\ndef outer():\n    return inner('k')\nouter()", "KeyError"),
    "chained": ("try:\n    1/0\nexcept Exception as e:\n    raise ValueError('wrapped') from e", "ValueError"),
    "library_frame": ("import json\njson.loads('{bad')", "JSONDecodeError"),
    "custom_class": ("class MyErr(Exception):\n    pass\nraise MyErr('mine', 2)", "MyErr"),
    "keyboard_interrupt_raised": ("raise KeyboardInterrupt", "KeyboardInterrupt"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_error_matches_ipykernel(kernel, reference, case):
    code, ename = ERRORS[case]
    mine_reply, mine = kernel.execute(code)
    ref_reply, ref = reference.execute(code)
    mc, rc = mine_reply["content"], ref_reply["content"]
    assert mc["status"] == rc["status"]
    assert mc.get("ename") == rc.get("ename")
    if ename is not None:
        assert mc["status"] == "error" and mc["ename"] == ename
    assert normalized(mine) == normalized(ref)
    if mc["status"] == "error":
        err = of_type(mine, "error")
        assert len(err) == 1
        e = err[0]["content"]
        # The reply repeats what the error message says.
        assert (mc["ename"], mc["evalue"]) == (e["ename"], e["evalue"])
        assert normalized([{"msg_type": "x", "content": {"t": mc["traceback"]}}]) == \
            normalized([{"msg_type": "x", "content": {"t": e["traceback"]}}])
    # The kernel carries on after the error.
    reply, msgs = kernel.execute("'alive'")
    assert reply["content"]["status"] == "ok"


def test_traceback_shape(kernel):
    kernel.run_ok("def f(x):\n    return 1 / x")
    reply, msgs = kernel.execute("f(0)")
    assert reply["content"]["status"] == "error"
    tb = [strip_ansi(line) for line in of_type(msgs, "error")[0]["content"]["traceback"]]
    assert tb[0].startswith("-----")
    assert tb[1].startswith("ZeroDivisionError") and "Traceback (most recent call last)" in tb[1]
    assert "----> 1 f(0)" in tb[2]
    assert "in f(x)" in tb[3] and "----> 2     return 1 / x" in tb[3]
    assert tb[-1] == "ZeroDivisionError: division by zero"


def test_error_in_silent_cell_is_not_published(kernel, reference):
    mine_reply, mine = kernel.execute("1/0", silent=True)
    ref_reply, ref = reference.execute("1/0", silent=True)
    assert mine_reply["content"]["status"] == ref_reply["content"]["status"] == "error"
    assert normalized(mine) == normalized(ref)


def test_system_exit_keeps_kernel(kernel, reference):
    """`raise SystemExit` in a cell does not end the kernel (IPython catches it
    and warns on stderr; the warning is shown once per process, so only the
    reply is compared)."""
    pid = kernel.pid
    mine, _ = kernel.execute("raise SystemExit(3)")
    ref, _ = reference.execute("raise SystemExit(3)")
    assert mine["content"]["status"] == ref["content"]["status"]
    assert mine["content"].get("ename") == ref["content"].get("ename")
    assert kernel.eval_text("'alive'") == "'alive'"
    assert kernel.pid == pid and kernel.km.is_alive()

"""Bad input to the cell analysis: a verdict or a clear error, never a crash,
in bounded time and memory (issue 3).

Each cell is analysed in its own `build/looseleaf analyze --json` process
under an address-space limit; a crash (signal), a hang (timeout) or a
malformed answer fails the test.  The C self-test covers the same cases
through the API (analysis/ll_analysis_selftest.c), including invalid UTF-8,
which a JSON notebook cannot carry.
"""
import json
import resource
import subprocess

import pytest

from test_analysis_corpus import ANALYZE, notebook

MEMORY_LIMIT = 3 << 30  # bytes of address space for one analysis process


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def nested_comprehensions(depth):
    src = "0"
    for i in range(depth):
        src = f"[{src} for a{i} in range(2)]"
    return "x = " + src + "\n"


CASES = {
    # name: (source, "ok" | "error" | "either")
    "empty": ("", "ok"),
    "blank_lines": ("   \n\n\t\n", "ok"),
    "comment_only": ("# nothing here\n", "ok"),
    "one_mb_of_statements": ("".join(f"v{i % 1000} = w + {i}\n" for i in range(70000)), "ok"),
    "one_mb_expression": ("x = 0" + "+y" * 500000, "error"),
    "one_mb_string": ("s = '" + "a" * (1 << 20) + "'\n", "ok"),
    "one_mb_line_of_calls": ("x = " + "f(" * 1000 + ")" * 1000 + "\n", "error"),
    "brackets_199": ("x = " + "(" * 199 + "1" + ")" * 199 + "\n", "ok"),
    "brackets_200": ("x = " + "(" * 200 + "1" + ")" * 200 + "\n", "either"),
    "brackets_5000": ("x = " + "[" * 5000 + "]" * 5000 + "\n", "error"),
    "unclosed_brackets": ("f(" * 10000, "error"),
    "nested_comprehensions_50": (nested_comprehensions(50), "ok"),
    "nested_comprehensions_300": (nested_comprehensions(300), "error"),
    "many_generators": ("x = [0 " + "for a in b " * 3000 + "]\n", "either"),
    "deep_lambdas": ("f = " + "lambda: " * 3000 + "0\n", "either"),
    "deep_attributes": ("x = a" + ".b" * 100000 + "\n", "either"),
    "deep_indentation_99": ("".join("    " * i + "if c:\n" for i in range(99)) + "    " * 99 + "x = 1\n", "ok"),
    "deep_indentation_120": ("".join("    " * i + "if c:\n" for i in range(120)) + "    " * 120 + "x = 1\n", "error"),
    "deep_functions": ("".join("    " * i + f"def f{i}():\n" for i in range(90)) + "    " * 90 + "return g\n", "ok"),
    "nul_byte": ("x = 1\x00y = 2\n", "error"),
    "control_characters": ("".join(chr(i) for i in range(1, 32)), "error"),
    "lone_backslash": ("\\", "error"),
    "thousand_magics": ("%time x = f()\n" * 1000, "ok"),
    "unterminated_string": ("s = '''never closed\n" * 3, "error"),
    "bad_magic_code": ("%time def (\n", "ok"),
}


def analyse_one(source):
    proc = subprocess.run([*ANALYZE, "--json", "-"],
                          input=json.dumps(notebook([{"code": source}])),
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name):
    source, expect = CASES[name]
    rc, doc = analyse_one(source)
    cell = doc["cells"][0]
    error = cell["facts"]["error"]
    if error is None:
        assert rc == 0 and "closure" in cell
        assert cell["closure"]["label"] in ("cpu", "gpu")
    else:
        assert rc == 1 and "closure" not in cell
        assert ":" in error and len(error) < 600, error  # "Kind: message"
    if expect == "ok":
        assert error is None, error
    elif expect == "error":
        assert error is not None


def test_nul_byte_is_named():
    _, doc = analyse_one("x = 1\x00")
    assert "null" in doc["cells"][0]["facts"]["error"]


def test_bad_magic_code_is_opaque_not_fatal():
    _, doc = analyse_one("%time def (\n")
    assert doc["cells"][0]["closure"]["opaque"] is True


@pytest.mark.parametrize("stack_kib", [256, 512, 1024])
def test_deep_cell_on_a_small_stack(stack_kib):
    """The walk measures the C stack it has left (the gateway's threads may
    have less than the CLI's main thread): a deep tree is an error, never a
    stack overflow."""
    def small_stack():
        _limit()
        resource.setrlimit(resource.RLIMIT_STACK, (stack_kib << 10, stack_kib << 10))

    cells = [{"code": "x = " + "-" * n + "1\n"} for n in (100, 1000, 1490, 2500)]
    proc = subprocess.run([*ANALYZE, "--json", "-"], input=json.dumps(notebook(cells)),
                          capture_output=True, text=True, timeout=120, preexec_fn=small_stack)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    doc = json.loads(proc.stdout)
    assert doc["cells"][0]["facts"]["error"] is None  # shallow cells still work
    for cell in doc["cells"][1:]:
        error = cell["facts"]["error"]
        assert error is None or error.startswith(("RecursionError", "MemoryError")), error

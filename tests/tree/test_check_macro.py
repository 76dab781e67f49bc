"""The C self-tests check with one header's macros: S_CHECK (count and go on) and S_REQUIRE (stop: jump to a
label named at the call site), both in base/ll_check.h.  A file that defines its own check macro drifts in
what it prints and hides control flow (one hid a `return`, six a `goto`); this test keeps them in one place.
"""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = "base/ll_check.h"
# A check macro of a self-test: S_CHECK, S_REQUIRE, or the like under another prefix or none (T_CHECK, CHECK).
DEFINE = re.compile(r"^\s*#\s*define\s+((?:[A-Z]_)?(?:CHECK|REQUIRE))\b", re.M)


def _module_c_files(repo):
    """Every .c and .h of the modules (top-level directories with a make fragment), tests/ aside."""
    out = []
    for mod in sorted(os.listdir(repo)):
        d = os.path.join(repo, mod)
        if mod.startswith(".") or mod in ("tests", "build") or not os.path.isdir(d):
            continue
        if not any(f.endswith(".mk") for f in os.listdir(d)):
            continue
        for root, _dirs, files in os.walk(d):
            out += [os.path.relpath(os.path.join(root, f), repo) for f in sorted(files) if f.endswith((".c", ".h"))]
    return out


def check_macro_definitions(repo):
    """[(file, macro)] of every check macro defined outside base/ll_check.h."""
    out = []
    for rel in _module_c_files(repo):
        if rel == HEADER:
            continue
        with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as f:
            out += [(rel, name) for name in DEFINE.findall(f.read())]
    return out


def test_check_macros_are_defined_once():
    bad = check_macro_definitions(REPO)
    assert not bad, "check macros defined outside %s (include it instead):\n  %s" % (
        HEADER, "\n  ".join("%s: %s" % b for b in bad))


def test_the_header_defines_both_and_neither_returns():
    with open(os.path.join(REPO, HEADER)) as f:
        text = f.read()
    assert sorted(DEFINE.findall(text)) == ["S_CHECK", "S_REQUIRE"]
    check = text[text.index("#define S_CHECK"):text.index("#define S_REQUIRE")]
    assert "goto" not in check and "return" not in check
    require = text[text.index("#define S_REQUIRE"):]
    assert "goto label" in require and "return" not in require.split("#endif")[0]

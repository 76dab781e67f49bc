"""Comments say why, not which ticket: a reader of the code has no issue tracker, so a comment that says
"(issue 16)" where it should say what the code is for tells them nothing.  Checked over every tracked source
file: C, headers, Python, makefiles and shell scripts, and in tests/ the comments of test code (a test's
docstring may name the issue it checks, as long as it also says what it checks).
"""
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TICKET = re.compile(r"\bissues? #?\d+", re.I)
SOURCE = (".c", ".h", ".py", ".mk", ".sh")


def _tracked():
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if p.endswith(SOURCE) or os.path.basename(p) == "Makefile"]


def _offending_lines(rel, text):
    in_tests = rel.startswith("tests/")
    for no, line in enumerate(text.splitlines(), 1):
        if not TICKET.search(line):
            continue
        if in_tests and rel.endswith(".py") and "#" not in line.split(TICKET.search(line).group(0))[0]:
            continue  # a test's docstring (or a string it prints) may name the issue it checks
        yield "%s:%d: %s" % (rel, no, line.strip())


def test_no_comment_cites_a_ticket():
    bad = []
    for rel in _tracked():
        path = os.path.join(REPO, rel)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            bad.extend(_offending_lines(rel, f.read()))
    assert not bad, "comments citing an issue number instead of saying why:\n  " + "\n  ".join(bad)


def test_the_check_sees_a_ticket():
    ticket = "iss" + "ue 16"  # spelled apart, so this file passes its own check
    assert list(_offending_lines("gateway/x.c", "/* retried (%s) */" % ticket))
    assert list(_offending_lines("tests/x.py", "    x = 1  # (%s)" % ticket))
    assert not list(_offending_lines("tests/x.py", '"""Warm workers (%s): reused."""' % ticket))

"""CI runs what README.md tells a new user, in its order (issue 23): the README's two commands are `make run`
(`make setup`, then JupyterLab) and `make test`; CI runs `make setup`, which starts nothing, in place of
`make run`, then `make test`, then the browser suites (`make test-browser`).  A suite that only passes on CI's own preparation (and fails after the
README's `make setup`) is then seen on CI.

Reads README.md, .ci/run and the Makefile (`make -n`: commands printed, none run).
"""
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_LINE = re.compile(r"^[ \t]*(make(?:[ \t]+[a-z][a-z-]*)+)", re.M)


def _readme_commands():
    """The make commands of the first shell block of README's "Set up and test" section, in order."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Set up and test"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [" ".join(m.split()) for m in MAKE_LINE.findall(block)]


def _ci_commands():
    with open(os.path.join(REPO, ".ci", "run")) as f:
        lines = [line.split("#")[0] for line in f]
    return [" ".join(m.split()) for m in MAKE_LINE.findall("\n".join(lines))]


def test_ci_runs_the_readme_commands_in_order():
    readme, ci = _readme_commands(), _ci_commands()
    assert readme == ["make run", "make test"], readme
    # `make run` is `make setup` and then JupyterLab, which a CI machine cannot use: CI runs its first half.
    told = ["make setup" if c == "make run" else c for c in readme]
    assert ci[:len(told)] == told, (ci, readme)
    assert ci[len(told):] == ["make test-browser", "make test-cluster"], ci


def _dry_run(target):
    r = subprocess.run(["make", "-n", "--no-print-directory", "-C", REPO, target], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_setup_starts_no_jupyterlab_and_make_run_does():
    setup = _dry_run("setup")
    assert "looseleaf install --sys-prefix" in setup
    assert not re.search(r"jupyter\S*\s+lab", setup), setup
    assert re.search(r"jupyter\s+lab", _dry_run("run"))

"""looseleaf_kernel.modindex: the index of package names that completion answers from without importing the
package into the kernel (issue 29, item 3).  A small package made here stands for torch; each check runs in a
fresh Python so that what is imported is known."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

MODINDEX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "kernel", "py", "looseleaf_kernel", "modindex.py")

PRELUDE = textwrap.dedent("""
    import importlib.util as u, json, sys, time
    s = u.spec_from_file_location('modindex', %r)
    mi = u.module_from_spec(s); s.loader.exec_module(mi)
""" % MODINDEX)


@pytest.fixture
def env(tmp_path):
    pkg = tmp_path / "site" / "fakepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\nimport os as _os\n"
                                     "class Tensor: pass\ndef arange(n): return n\nanswer = 42\n")
    (pkg / "sub" / "__init__.py").write_text("def linear(): pass\n")
    (pkg / "lazy.py").write_text("x = 1\n")
    e = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(tmp_path / "site"))
    return e, pkg


def py(env, code):
    out = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_written_by_a_process_that_imported_the_package_read_by_one_that_did_not(env):
    e, pkg = env
    assert py(e, "import fakepkg\nprint(json.dumps(mi.write_for(['fakepkg', 'json', 'notthere'])))") == \
        ["fakepkg", "json"]
    got = py(e, "print(json.dumps([mi.lookup('fakepkg'), mi.lookup('fakepkg.sub'), mi.lookup('fakepkg.lazy'),"
                " 'fakepkg' in sys.modules]))")
    top, sub, lazy, imported = got
    assert {k: top[k] for k in ("Tensor", "arange", "answer", "sub", "_os")} == \
        {"Tensor": "class", "arange": "function", "answer": "instance", "sub": "module", "_os": "module"}
    assert sub["linear"] == "function"
    assert lazy is None  # never imported by the writer: not indexed
    assert imported is False


def test_an_index_of_another_version_of_the_package_is_not_used(env):
    e, pkg = env
    py(e, "import fakepkg\nprint(json.dumps(mi.write_for(['fakepkg'])))")
    st = os.stat(pkg / "__init__.py")
    os.utime(pkg / "__init__.py", (st.st_atime, st.st_mtime + 10))  # upgraded
    assert py(e, "print(json.dumps(mi.lookup('fakepkg')))") is None
    # missing_only writes it again since the one there is stale; a current one is kept.
    assert py(e, "import fakepkg\nprint(json.dumps(mi.write_for(['fakepkg'], missing_only=True)))") == ["fakepkg"]
    assert py(e, "import fakepkg\nprint(json.dumps(mi.write_for(['fakepkg'], missing_only=True)))") == []


def test_ensure_writes_the_index_in_another_process(env):
    e, pkg = env
    got = py(e, """
        mi.ensure('fakepkg')
        deadline = time.monotonic() + 60
        while mi.lookup('fakepkg') is None and time.monotonic() < deadline:
            time.sleep(0.05)
        mi.ensure('fakepkg')  # done: nothing started again
        print(json.dumps([sorted(mi.lookup('fakepkg') or {}), 'fakepkg' in sys.modules]))
    """)
    names, imported = got
    assert "arange" in names and "Tensor" in names
    assert imported is False

"""The environment's interpreter, whatever PATH says (issue 22, item 4): processes the pool starts in the
session's Python (zygotes and their workers, the CUDA-safety probes) run it by its absolute path, so
sys.executable, its prefix and site-packages are the configured environment's, even when PATH names another
python3 first."""
import os
import sys

from zyghelp import wait_for

RECORD = ("import os, sys\n"
          "with open(os.environ['LL_TEST_WHERE'], 'a') as f:\n"
          "    f.write('%s %s %s\\n' % (os.path.basename(sys.argv[0]) if sys.argv else '-', sys.executable,\n"
          "                             sys.prefix))\n")


def test_workers_and_probes_run_the_configured_interpreter_with_another_python3_first_on_path(env):
    configured = os.environ.get("LOOSELEAF_PYTHON") or sys.executable
    # Another python3 first on PATH: a Python of its own prefix (a venv's layout, whose pyvenv.cfg points to
    # the same base Python) that is not the configured environment.
    other = os.path.join(env.tmp, "other")
    os.makedirs(os.path.join(other, "bin"))
    os.symlink(os.path.realpath(configured), os.path.join(other, "bin", "python3"))
    with open(os.path.join(other, "pyvenv.cfg"), "w") as f:
        f.write("home = %s\ninclude-system-site-packages = false\nversion = %d.%d.%d\n"
                % ((os.path.dirname(os.path.realpath(configured)),) + tuple(sys.version_info[:3])))
    env.environ["PATH"] = os.path.join(other, "bin") + ":" + env.environ.get("PATH", "/usr/bin:/bin")
    where = os.path.join(env.tmp, "where.txt")
    # LL_* passes the pool's environment allow-list, so the probe the pool runs sees it too.
    env.environ["LL_TEST_WHERE"] = where
    mods = os.path.join(env.tmp, "mods")
    os.makedirs(mods)
    with open(os.path.join(mods, "llz_where.py"), "w") as f:
        f.write(RECORD)
    env.environ["PYTHONPATH"] = mods
    c = env.client()
    r = c.run("a", "import sys\nprint(sys.executable)", import_closure=["llz_where"], import_stmts=["import llz_where"])
    assert r.ok and r.stdout.strip() == configured, r.events
    # The probe of llz_where (before it may grow a node) imported it too.
    wait_for(lambda: "llz_where" in c.stats()["safety"], 60, "the probe of llz_where")
    with open(where) as f:
        lines = [ln.split() for ln in f if ln.strip()]
    assert any(ln[0] == "probe.py" for ln in lines), lines
    assert len(lines) >= 2 and all(ln[1] == configured for ln in lines), (configured, lines)
    assert all(ln[2] == sys.prefix for ln in lines), (sys.prefix, lines)

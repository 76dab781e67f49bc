"""Helpers for the C store's tests, in a uniquely named module: in one pytest run over every
test directory, `from conftest import ...` would get whichever conftest was imported first."""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYEXT_DIR = os.path.join(ROOT, "build", "py")
if PYEXT_DIR not in sys.path:
    sys.path.insert(0, PYEXT_DIR)


def child_env(**extra):
    """The environment for a child Python (this one) that imports _llstore."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYEXT_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env

"""Shared pytest fixtures: a private Jupyter environment for the whole test run.

Runs in the pytest process, whose Python is the stack under test: the
project's venv (`make test`: the current Jupyter stack from PyPI, torch 2.x)
or Debian's /usr/bin/python3 (`make test-debian`: Debian's packages).  Every
test that starts a kernel does so through the kernelspecs registered here, in
a temp directory put first on JUPYTER_PATH, so no test depends on (or
disturbs) a kernelspec, history database or runtime directory of the user who
runs the tests, nor on what `make setup` installed into the venv (the private
data directory is looked in before the venv's share/jupyter):

  looseleaf         argv [<repo>/build/looseleaf, -f, {connection_file}],
                    interrupt_mode signal, env LOOSELEAF_PYTHON = this
                    Python (as `looseleaf install` writes it for an
                    environment): the kernel, its pool and workers import
                    from the same environment as this process
  looseleaf-msgint  the same with interrupt_mode message
  looseleaf-unsigned  the same with --allow-empty-key (an empty key is refused otherwise)
  python3           the reference: ipykernel of this same Python
  python3-msgint    the same with interrupt_mode message
"""
import json
import os
import shutil
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from llpool_util import stop_pool  # noqa: E402

# LL_TEST_LOOSELEAF runs the suite against another build of the kernel (e.g. a
# snapshot while the tree is being rebuilt); the default is the tree's own.
LOOSELEAF_BIN = os.environ.get("LL_TEST_LOOSELEAF", os.path.join(REPO, "build", "looseleaf"))
# The Python of the stack under test (never the python3 first on PATH, which may be another interpreter).
PYTHON = sys.executable

def _kernelspecs():
    looseleaf_argv = [LOOSELEAF_BIN, "-f", "{connection_file}"]
    python_argv = [PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    env = {"LOOSELEAF_PYTHON": PYTHON}
    return {
        "looseleaf": {"argv": looseleaf_argv, "display_name": "LooseLeaf (GPU)",
                      "language": "python", "interrupt_mode": "signal", "env": env},
        "looseleaf-msgint": {"argv": looseleaf_argv, "display_name": "LooseLeaf (message interrupt)",
                             "language": "python", "interrupt_mode": "message", "env": env},
        "looseleaf-unsigned": {"argv": looseleaf_argv + ["--allow-empty-key"],
                               "display_name": "LooseLeaf (empty key allowed)", "language": "python",
                               "interrupt_mode": "signal", "env": env},
        "python3": {"argv": python_argv, "display_name": "Python 3 (ipykernel)",
                    "language": "python", "interrupt_mode": "signal"},
        "python3-msgint": {"argv": python_argv, "display_name": "Python 3 (message interrupt)",
                           "language": "python", "interrupt_mode": "message"},
    }


# The environment is set up at import time (and torn down at session end) so
# that even code which reads JUPYTER_PATH or IPYTHONDIR once at import sees the
# private directories.
_ROOT = tempfile.mkdtemp(prefix="ll-jupyter-")
_ENV = {
    "JUPYTER_PATH": os.path.join(_ROOT, "share"),
    "JUPYTER_DATA_DIR": os.path.join(_ROOT, "data"),
    "JUPYTER_RUNTIME_DIR": os.path.join(_ROOT, "runtime"),
    "JUPYTER_CONFIG_DIR": os.path.join(_ROOT, "config"),
    "IPYTHONDIR": os.path.join(_ROOT, "ipython"),
    # Inside a virtual environment jupyter_core looks in the environment's share/jupyter before the user's
    # data directory (JUPYTER_PREFER_ENV_PATH defaults to on there), so what `make setup` installs into the
    # project's venv (its LooseLeaf kernelspec, its JupyterLab extension) would shadow what a test puts in
    # the private JUPYTER_DATA_DIR.  The run's own directories come first, as for a user outside a venv.
    "JUPYTER_PREFER_ENV_PATH": "0",
    # ipykernel's debugger prints a frozen-modules warning on stderr at start
    # unless told not to; it is noise, not kernel output.
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    # Kernels, pools, zygotes and the tests' own drivers run in this process's environment.
    "LOOSELEAF_PYTHON": PYTHON,
    # GPU cells run on workers of a host pool that kernels start on demand and share; the tests' pool
    # is a private one, stopped at the end of the run (pytest_sessionfinish).
    "LOOSELEAF_POOL_DIR": os.path.join(_ROOT, "pool"),
    # Many kernels of the run share that pool: enough virtual slots that one test's idle warm workers
    # rarely make another test's GPU cell wait (which would add a "LooseLeaf: every GPU slot ..." line).
    "LL_POOL_SLOTS": "4",
    # (MPLCONFIGDIR is deliberately left alone: a fresh one per run makes
    # every process that imports matplotlib rebuild the font cache under one
    # lock at once, and some then time out.)
}
_SAVED_ENV = {k: os.environ.get(k) for k in _ENV}


def _install_environment():
    for key, path in _ENV.items():
        # (the pool makes its own directory, 0700, and refuses any other)
        if path.startswith(_ROOT) and key != "LOOSELEAF_POOL_DIR":
            os.makedirs(path, exist_ok=True)
    for name, spec in _kernelspecs().items():
        kdir = os.path.join(_ENV["JUPYTER_PATH"], "kernels", name)
        os.makedirs(kdir, exist_ok=True)
        with open(os.path.join(kdir, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=1)
    os.environ.update(_ENV)


_install_environment()


def pytest_sessionfinish(session, exitstatus):
    try:
        # Wait for it (and its zygotes and workers) to be gone before its directory is removed.
        stop_pool(_ENV["LOOSELEAF_POOL_DIR"])
    finally:
        for key, value in _SAVED_ENV.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def jupyter_env():
    """The private Jupyter environment: dict of the variables set (JUPYTER_PATH, ...)."""
    return dict(_ENV)


@pytest.fixture(scope="session")
def kernel_dir(jupyter_env):
    """The directory holding the private kernelspecs."""
    return os.path.join(jupyter_env["JUPYTER_PATH"], "kernels")


@pytest.fixture(scope="session")
def looseleaf_bin():
    """Absolute path of the built kernel binary; the test fails if it is missing."""
    if not os.access(LOOSELEAF_BIN, os.X_OK):
        pytest.fail("%s is not built (run `make all`)" % LOOSELEAF_BIN)
    return LOOSELEAF_BIN

"""Fixtures of the GPU-routing tests: one looseleaf kernel and one ipykernel reference per test module (the
tests of a module share them and use names of their own), on the run's shared host pool (tests/conftest.py)."""
import os

import pytest

from routehelp import Kernel, Pair


@pytest.fixture(scope="session", autouse=True)
def private_pool_dir(jupyter_env):
    """The run's pool dir must be private (0700) or the pool refuses it and every GPU cell falls back to the
    kernel.  Older tests/conftest.py created it with the umask's mode; now the pool creates it itself."""
    if os.path.isdir(jupyter_env["LOOSELEAF_POOL_DIR"]):
        os.chmod(jupyter_env["LOOSELEAF_POOL_DIR"], 0o700)
    return jupyter_env["LOOSELEAF_POOL_DIR"]


@pytest.fixture(scope="module")
def ll(jupyter_env):
    k = Kernel("looseleaf")
    yield k
    k.stop()


@pytest.fixture(scope="module")
def ref(jupyter_env):
    k = Kernel("python3")
    yield k
    k.stop()


@pytest.fixture(scope="module")
def pair(ll, ref):
    return Pair(ll, ref)

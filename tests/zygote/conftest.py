"""The zygote tests' fixture: a private store (redis) and pool runtime dir per test (zyghelp.Env)."""
import tempfile

import pytest

from zyghelp import Env


@pytest.fixture
def env():
    with tempfile.TemporaryDirectory(prefix="ll-zyg-") as tmp:
        e = Env(tmp)
        try:
            yield e
        finally:
            e.close()

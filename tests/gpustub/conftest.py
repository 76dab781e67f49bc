"""The stub-driver suite's fixtures: a pool (zyghelp.Env, tests/zygote/) whose processes find the stub CUDA driver
(build/cudastub/libcuda.so.1) first on LD_LIBRARY_PATH, as a GPU host's libcuda, with the venv's CUDA build of
torch.  Skipped, saying why, where this Python's torch is not a CUDA build (Debian's torch in test-debian) or
there is no torch."""
import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "zygote"))

from stubhelp import REPO, STUB, StubEnv, torch_cuda_build  # noqa: E402


@pytest.fixture(autouse=True)
def _needs_a_cuda_torch():
    cuda, where = torch_cuda_build()
    if not cuda:
        pytest.skip("torch of %s is not a CUDA build (%s): the stub driver is met only through a CUDA build's "
                    "libraries (cuBLASLt, cuSPARSELt, cudart)" % (sys.executable, where))
    # The stub is built by `make test` (TEST_DEPS): a missing one is a broken build, not a reason to skip.
    assert os.path.exists(STUB), "%s is not built: make %s" % (STUB, os.path.relpath(STUB, REPO))


@pytest.fixture
def env():
    with tempfile.TemporaryDirectory(prefix="ll-gs-") as tmp:
        e = StubEnv(tmp)
        try:
            yield e
        finally:
            e.close()

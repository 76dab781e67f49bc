"""Fixtures for the integration tests: kernels started through jupyter_client
with the private kernelspecs of tests/conftest.py.

`kernel` is one kernel per test module and kernel name (parametrized over
looseleaf and ipykernel), shared by tests that leave it usable; `fresh_kernel`
is a kernel of the test's own, for tests that interrupt, restart or stop it.
"""
import pytest

from itest_util import Kernel, selected_kernels


@pytest.fixture(scope="module", params=selected_kernels())
def kernel_name(request):
    return request.param


@pytest.fixture(scope="module")
def kernel(kernel_name, jupyter_env):
    k = Kernel(kernel_name)
    yield k
    k.stop()


@pytest.fixture
def fresh_kernel(kernel_name, jupyter_env):
    k = Kernel(kernel_name)
    yield k
    k.stop()


@pytest.fixture(scope="module")
def reference(kernel_name, jupyter_env):
    """An ipykernel to compare answers with, whatever kernel is under test.
    One per module and kernel under test, so that the reference has run
    exactly the cells the kernel under test has (magics and extensions
    leave state behind)."""
    k = Kernel("python3")
    yield k
    k.stop()

"""looseleaf_zygote.gpu.broken (issue 22, item 3): after each cell a worker asks the frameworks that started
CUDA in it whether its context still works; a sticky error (a device-side assert) must be seen, and asking
must never start CUDA in a worker that has not.  Fake torch and CuPy modules stand in for the real ones (no
GPU here); tests/routing/test_route_faults.py checks the whole path through the kernel."""
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "zygote", "py"))
from looseleaf_zygote import gpu  # noqa: E402

STICKY = "CUDA error: device-side assert triggered"


def _torch(initialized, sync_error=None):
    calls = []

    def synchronize(device=None):
        calls.append("synchronize")
        if sync_error:
            raise RuntimeError(sync_error)
    cuda = types.SimpleNamespace(is_initialized=lambda: initialized, synchronize=synchronize)
    return types.SimpleNamespace(cuda=cuda), calls


def _cupy(ctx, sync_error=None):
    calls = []

    def ctx_get_current():
        calls.append("ctxGetCurrent")
        if ctx is None:
            raise RuntimeError("CUDA_ERROR_NOT_INITIALIZED: initialization error")
        return ctx

    def device_synchronize():
        calls.append("deviceSynchronize")
        if sync_error:
            raise RuntimeError(sync_error)
    cuda = types.SimpleNamespace(driver=types.SimpleNamespace(ctxGetCurrent=ctx_get_current),
                                 runtime=types.SimpleNamespace(deviceSynchronize=device_synchronize))
    return types.SimpleNamespace(cuda=cuda), calls


@pytest.fixture(autouse=True)
def no_frameworks(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)


def test_no_framework_is_never_broken():
    assert gpu.broken() is None


def test_torch_without_cuda_started_is_not_asked(monkeypatch):
    torch, calls = _torch(False, STICKY)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu.broken() is None and calls == []


def test_torch_sticky_error_is_seen(monkeypatch):
    torch, calls = _torch(True, STICKY)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu.broken() == "RuntimeError: " + STICKY and calls == ["synchronize"]


def test_torch_healthy_context(monkeypatch):
    torch, calls = _torch(True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert gpu.broken() is None and calls == ["synchronize"]


def test_cupy_without_a_context_is_not_synchronised(monkeypatch):
    for ctx in (None, 0):  # CUDA never initialised / initialised without a context
        cupy, calls = _cupy(ctx, STICKY)
        monkeypatch.setitem(sys.modules, "cupy", cupy)
        assert gpu.broken() is None and calls == ["ctxGetCurrent"]


def test_cupy_sticky_error_is_seen(monkeypatch):
    torch, _ = _torch(True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    cupy, calls = _cupy(0x55aa, STICKY)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert gpu.broken() == "RuntimeError: " + STICKY and calls == ["ctxGetCurrent", "deviceSynchronize"]

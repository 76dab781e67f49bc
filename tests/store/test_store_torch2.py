"""What torch 2.x asks of the store (issue 15, part 1), checkable without a GPU:

- every tensor is saved through its UntypedStorage, with no TypedStorage deprecation warning into the cell's
  output, and sharing is keyed on the storage itself (two Python wrappers of one storage are one payload);
- a device tensor restored where there is no device (the kernel restores CUDA tensors on the CPU) goes back
  as a device tensor when saved from there: the next worker gets it on its GPU, not a CPU copy;
- the CUDA generators' states travel with the process state through processes that have no CUDA, and a
  seed set in such a process (torch.manual_seed in a CPU cell) replaces them, as it would in one process.

Runs on whatever torch the stack has (torch 2.x in the project's venv, 1.13 on Debian's).
"""
import warnings

import pytest
import torch

from looseleaf_store import Checkpointer, procstate, serial
from test_store_checkpoint import fresh, restore_ok, run, save_ok


def test_tensor_save_warns_nothing_and_keys_sharing_on_the_storage(store):
    ns, cp = fresh(store)
    run(ns, """
        import torch
        base = torch.arange(8, dtype=torch.float32)
        head = base[:4]
    """)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a TypedStorage deprecation warning would fail the save
        save_ok(cp, ["base", "head"])
    t = ns["base"]
    assert serial.storage_key(serial.untyped_storage(t)) == serial.storage_key(serial.untyped_storage(ns["head"]))
    ns2, cp2 = fresh(store)
    restore_ok(cp2, ["head", "base"])
    ns2["base"][1] = 42.0
    assert ns2["head"][1].item() == 42.0


def _payload_devices(cp, name):
    """The devices recorded for NAME's storage payloads in the store."""
    entry = cp.store.fetch([name])[name]
    hdr, _ = serial.split_blob(entry[1])
    return [m[3] for m in hdr["pay"] if m[0] == "s"]


def test_a_device_tensor_restored_on_the_cpu_is_saved_back_as_one(store, monkeypatch):
    ns, cp = fresh(store)
    run(ns, "import torch\nw = torch.ones(4)")
    # Saved as a worker with a GPU saves it (no GPU here: the device is what the payload records).
    monkeypatch.setattr(serial, "storage_device", lambda s: "cuda:0")
    save_ok(cp, ["w"])
    monkeypatch.undo()
    assert _payload_devices(cp, "w") == ["cuda:0"]
    # The kernel: no CUDA, restores on the CPU ...
    kns, kcp = fresh(store)
    kcp.cpu_only = True
    restore_ok(kcp, ["w"])
    assert kns["w"].device.type == "cpu"
    # ... and a CPU cell there changes it; saved again, it is still the session's CUDA tensor.
    kns["w"].mul_(3)
    save_ok(kcp, ["w"])
    assert _payload_devices(kcp, "w") == ["cuda:0"]
    # A tensor the kernel made itself stays a CPU tensor.
    run(kns, "import torch\nv = torch.zeros(2)")
    save_ok(kcp, ["v"])
    assert _payload_devices(kcp, "v") == ["cpu"]


@pytest.fixture
def no_cuda_carry(monkeypatch):
    monkeypatch.setattr(procstate, "_cuda_carry", (None, None))


def test_cuda_generator_states_travel_through_processes_without_cuda(no_cuda_carry):
    if torch.cuda.is_initialized():
        pytest.skip("this process has CUDA")
    states = [b"\x01\x02\x03"]
    torch.manual_seed(11)
    # A worker's state arrives (taken with seed 11 in effect) ...
    st = procstate.capture()
    st["torch_cuda_rng"] = (11, states)
    assert procstate.apply(st) == []
    # ... and is handed on unchanged by this process, which has no CUDA.
    seed, carried = procstate.capture()["torch_cuda_rng"]
    assert seed == 11 and carried is states
    # A seed set here (a CPU cell's torch.manual_seed) replaces them: the next process with CUDA seeds its
    # generators with it, as torch.manual_seed reseeds CUDA in one process.
    torch.manual_seed(12)
    assert procstate.capture()["torch_cuda_rng"] == (12, None)

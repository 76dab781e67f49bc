"""CUDA tensors through the store (pinned host memory both ways).  Needs a CUDA device: skipped cleanly
on hosts without one (such as the development machines); run on a GPU host."""
import builtins

import pytest
import torch

from looseleaf_store import Checkpointer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this host")


def test_cuda_tensors_views_and_module_round_trip(store):
    ns = {"__name__": "__main__", "__builtins__": builtins}
    exec("""
import torch
torch.manual_seed(0)
big = torch.rand(40 << 20, device="cuda")            # 160 MiB: several staging chunks
view = big[1000:2000].view(10, 100)
model = torch.nn.Linear(8, 4).cuda()
opt = torch.optim.Adam(model.parameters())
model(torch.randn(2, 8, device="cuda")).sum().backward()
opt.step()
""", ns)
    cp = Checkpointer(store, ns)
    rep = cp.save(["big", "view", "model", "opt"])
    assert not rep.failed and rep.error is None, rep
    ns2 = {"__name__": "__main__", "__builtins__": builtins}
    r = Checkpointer(store, ns2).restore(["view", "opt"])
    assert not r.failed and not r.warnings, r
    assert ns2["big"].is_cuda and torch.equal(ns2["big"], ns["big"])
    assert ns2["view"].data_ptr() == ns2["big"].data_ptr() + 1000 * 4
    assert ns2["opt"].param_groups[0]["params"][0] is ns2["model"].weight
    assert ns2["model"].weight.is_cuda and torch.equal(ns2["model"].weight, ns["model"].weight)

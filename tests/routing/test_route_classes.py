"""Instances of classes defined in cells (issue 13, item 8), compared with ipykernel cell by cell, on cold
workers (every GPU cell a fresh fork restoring its closure) and warm ones: a GPU cell that uses an instance of a
class an earlier CPU cell defined gets the class and what its methods read (a module-level constant, a helper
function), and a redefined class leaves the old instances on the old class.
"""
import pytest

from routehelp import Kernel, Pair, stop_pool

GPU, CPU = "gpu", "cpu"


@pytest.fixture(scope="module", params=["cold", "warm"])
def pair(request, jupyter_env, tmp_path_factory, ref):
    pool_dir = str(tmp_path_factory.mktemp("pool-classes-" + request.param) / "pool")
    k = Kernel("looseleaf", env={"LOOSELEAF_POOL_DIR": pool_dir,
                                 "LL_POOL_WARM_IDLE_S": "0" if request.param == "cold" else "300"})
    yield Pair(k, ref)
    k.stop()
    stop_pool(pool_dir)


def test_an_instance_of_a_cell_class_on_a_worker(pair):
    pair.cells([
        ("class Scale:\n    def __init__(self, k):\n        self.k = k\n"
         "    def __call__(self, t):\n        return bump(t * self.k) * FACTOR", CPU),
        ("FACTOR = 2\ndef bump(v):\n    return v + 1", CPU),
        ("s = Scale(3)", CPU),
        ("import torch\nprint(s(torch.ones(2)))", GPU),
        ("FACTOR = 10\nprint(s(torch.ones(1)))", GPU),
        # Redefined: the old instance keeps the old class, as in one process.
        ("class Scale:\n    def __call__(self, t):\n        return -1", CPU),
        ("print(s(torch.ones(1)), isinstance(s, Scale), type(s).__name__)", GPU),
        ("s2 = Scale()\nprint(s2(torch.ones(1)), type(s2) is type(s))", GPU),
    ])


def test_a_torch_module_subclass_with_state_across_routes(pair):
    pair.cells([
        ("import torch\nclass Acc(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
         "        self.register_buffer('total', torch.zeros(1))\n"
         "    def forward(self, v):\n        self.total += v * STEP\n        return self.total", GPU),
        ("STEP = 3", CPU),
        ("acc = Acc()\nacc(torch.ones(1))", GPU),
        ("print(acc.total, sorted(dict(acc.named_buffers())))", None),
        ("acc(torch.ones(1) * 2)", GPU),
    ])

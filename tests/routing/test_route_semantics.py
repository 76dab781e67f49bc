"""Notebooks mixing CPU and GPU cells give the same outputs as ipykernel: a model and optimizer trained across
GPU cells with CPU cells between, tensor views, in-place mutation in a later cell, functions defined in a CPU
cell used in a GPU cell, redefinition, del, exceptions (what a failing cell did before the raise is kept),
object identity across variables, process state (cwd, environment, RNGs, torch default dtype) across
GPU -> CPU -> GPU, and a real PyTorch notebook.

Every cell runs on a looseleaf kernel and on ipykernel; the frontend-visible results (status, error, outputs,
normalised as in tests/integration) must be equal, and the routing report must show the GPU-labelled cells
really ran on a worker ("gpu") and the others in the kernel ("cpu"): otherwise a test would prove nothing.
The tests share one kernel pair and use names of their own.

The module runs twice, on a pool of its own each time: "cold" (LL_POOL_WARM_IDLE_S=0: every GPU cell is a
fresh fork that restores its closure from the store, the path these tests are mainly about) and "warm" (warm
workers, issue 6: a session's next GPU cell reuses its worker, which drops and restores only what moved).
"""
import os
import tempfile

import nbformat
import pytest

from routehelp import cold_warm_fixtures, ll_md, run_route, stream_text

GPU, CPU = "gpu", "cpu"
NOTEBOOK = "/work/shared/notebooks/mrdbourke_01_pytorch_workflow.ipynb"


pool_mode, ll, ref = cold_warm_fixtures("pool-")


def test_pool_mode_is_what_the_module_asked_for(pair, pool_mode):
    run_route(pair.ll, "import torch\npm_t = torch.ones(1)", "gpu")
    reply, _ = run_route(pair.ll, "pm_t.add_(1)", "gpu")
    assert bool(ll_md(reply).get("warm_hit")) == (pool_mode == "warm"), ll_md(reply)


def test_training_across_gpu_cells_with_cpu_cells_between(pair):
    pair.cells([
        ("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(3, 1)\n"
         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         "X = torch.randn(32, 3)\ny = X @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3", GPU),
        ("def train(n):\n    out = []\n    for _ in range(n):\n        opt.zero_grad()\n"
         "        loss = ((model(X) - y) ** 2).mean()\n        loss.backward()\n        opt.step()\n"
         "        out.append(round(loss.item(), 4))\n    return out\n", None),
        ("print(train(5))", GPU),
        ("history = []\nepochs = 3\nprint('epochs', epochs)", CPU),
        ("history += train(epochs)\nprint(history)", GPU),
        ("print(len(history), epochs)", None),
        ("history += train(epochs)\nprint(history[-3:])\nopt.param_groups[0]['params'][0] is model.weight", GPU),
        ("print(model.weight.detach().numpy().round(3), round(model.bias.item(), 3))", GPU),
        ("opt.state_dict()['param_groups'][0]['lr']", GPU),
    ])


def test_tensor_view_shares_storage_with_its_base(pair):
    pair.cells([
        ("import torch\nbase_t = torch.arange(6.0)\nview_t = base_t[1:]", GPU),
        ("marker = 'cpu cell between'", CPU),
        ("base_t.add_(1)", GPU),
        ("print(view_t)\nprint(view_t.data_ptr() == base_t.data_ptr() + 4, view_t.is_contiguous())", GPU),
        ("view_t[0] = 100\nprint(base_t)", GPU),
        ("print(base_t.sum().item(), view_t[:2])", GPU),
    ])


def test_restored_view_keeps_its_base(pair, pool_mode, request):
    # (cold: restored from the store; warm: the worker holds the view itself)
    pair.cells([
        ("import torch\nbase_u = torch.arange(6.0)\nview_u = base_u[1:]\nprint(view_u._base is base_u)", GPU),
        ("print(view_u._base is base_u)", GPU),
    ])


def test_in_place_mutation_in_later_cells(pair):
    pair.cells([
        ("import torch\nt_src = torch.ones(2)\nitems = [1, 2]\nconf = {'a': 1}", GPU),
        ("print(items, conf)", CPU),
        ("items.append(3)\nconf['a'] += 10", CPU),
        ("print(items, conf, t_src)", GPU),
        ("items.append(int(t_src.sum()))\nconf['b'] = 'set on gpu'\nt_src.mul_(3)", GPU),
        ("print(items, conf)", None),
        ("print(t_src, items[-1])", GPU),
    ])


def test_functions_defined_on_cpu_used_on_gpu_and_redefined(pair):
    pair.cells([
        ("def scale(a, k=2):\n    return a * k", CPU),
        ("import torch\nprint(scale(torch.ones(2)))", GPU),
        ("def scale(a, k=3):\n    return a * k", CPU),
        ("print(scale(torch.ones(2)))", GPU),
        ("def scale(a):\n    return torch.zeros_like(a) - 1", CPU),
        ("print(scale(torch.ones(2)))", GPU),
        ("class Acc:\n    def __init__(self):\n        self.n = 0\n    def add(self, k):\n        self.n += k\n"
         "        return self\nacc = Acc()", CPU),
        ("acc.add(int(torch.ones(3).sum()))\nprint(acc.n, type(acc).__name__, isinstance(acc, Acc))", GPU),
        ("print(acc.add(1).n)", None),
    ])


def test_del_then_name_error(pair):
    pair.cells([
        ("import torch\ngone_t = torch.ones(2)\nkept_t = torch.zeros(1)", GPU),
        ("del gone_t", None),
        ("print(kept_t)\nprint(gone_t)", GPU),
        ("plain = 5", CPU),
        ("print(plain, torch.ones(1))", GPU),
        ("del plain", CPU),
        ("print(plain, torch.ones(1))", GPU),
        ("print(kept_t, plain)", GPU),
    ])


def test_exceptions_keep_what_the_cell_did_before_the_raise(pair):
    pair.cells([
        ("import torch\nerr_t = torch.zeros(2)\nerr_n = 1\nraise ValueError('boom')", GPU),
        ("print(err_t, err_n)", GPU),
        ("err_t.add_(5)\nerr_n = 2\nerr_new = 'set before the raise'\n1 / 0", GPU),
        ("print(err_n, err_new)", CPU),
        ("print(err_t, err_n, err_new)", GPU),
        ("def fails(t):\n    raise KeyError(t.shape)", CPU),
        ("try:\n    fails(err_t)\nexcept KeyError as e:\n    print('caught', e)", GPU),
    ])


def test_traceback_shows_source_of_functions_from_earlier_cells(pair):
    pair.cells([
        ("def fails_tb(t):\n    return t.undefined_attribute", CPU),
        ("import torch\nfails_tb(torch.zeros(1))", GPU),
        # and the other way: defined by a worker, failing in the kernel
        ("z_tb = torch.zeros(1)\ndef fails_tb2(x):\n    return x.undefined_attribute", GPU),
        ("fails_tb2(1)", CPU),
    ])


def test_names_imported_by_a_gpu_cell_reach_cpu_cells(pair):
    pair.cells([
        ("import torch, json\nimport numpy as np_gpu\nfrom os import path as os_path\nt_imp = torch.ones(1)", GPU),
        ("print(json.dumps([1]), np_gpu.int64(2), os_path.basename('/a/b'))", CPU),
        ("import collections\nprint(collections.Counter('aab')['a'], t_imp)", GPU),
        ("print(collections.OrderedDict(a=1))", CPU),
    ])


def test_identity_across_variables(pair):
    pair.cells([
        ("import torch\nnet = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())\n"
         "sgd = torch.optim.SGD(net.parameters(), lr=0.01)\nfirst = net[0]\nalias = net[0].weight\n"
         "pair_list = [alias, alias]", GPU),
        ("same = [sgd.param_groups[0]['params'][0] is net[0].weight, first is net[0], alias is first.weight,\n"
         "        pair_list[0] is pair_list[1]]\nprint(same)", GPU),
        ("print(first is net[0], pair_list[0] is pair_list[1], alias is first.weight)", GPU),
        ("sgd.param_groups[0]['params'][0] is net[0].weight", GPU),
    ])


def test_alias_made_on_cpu_sees_gpu_mutation(pair):
    pair.cells([
        ("al_a = [1]\nal_b = al_a", CPU),
        ("import torch\nal_a.append(torch.ones(1).item())", GPU),
        ("print(al_b)", CPU),
    ])


def test_gpu_mutation_survives_a_cell_reading_an_alias(pair):
    pair.cells([
        ("lu_a = [1]\nlu_b = lu_a", CPU),
        ("import torch\nlu_a.append(torch.ones(1).item())", GPU),
        ("print(lu_b, lu_a, lu_a is lu_b)", GPU),
        ("lu_b.append(2)", CPU),
        ("print(lu_a, torch.ones(1))", GPU),
        ("lu_c = {'k': lu_a}\nlu_a.append(3)", None),
        ("lu_c['k'].append(int(torch.ones(1)))\nprint(lu_b is lu_c['k'])", GPU),
        ("print(lu_a, lu_b, lu_c)", None),
    ])


def _comm_stream(k, msg_type, content):
    """Send a comm message to K (no reply comes), wait for its idle; returns what its handler printed."""
    return stream_text(k.iopub_until_idle(k.send(msg_type, content)))


def test_widget_callback_sees_what_gpu_cells_changed(pair):
    """A comm handler (a widget's callback) runs in the kernel outside any cell, on no analysed closure: it
    reads the values GPU cells left (a tensor, a rebound int, a new variable), as on ipykernel, and what it
    rebinds reaches the next GPU cell."""
    pair.cells([
        ("cb_n = 1\n"
         "def _cb_target(comm, msg):\n"
         "    @comm.on_msg\n"
         "    def _(m):\n"
         "        global cb_n\n"
         "        print('callback sees', cb_t.tolist(), cb_n, globals().get('cb_new'))\n"
         "        cb_n = cb_n + m['content']['data']['add']\n"
         "get_ipython().kernel.comm_manager.register_target('ll.cb', _cb_target)", CPU),
        ("import torch\ncb_t = torch.zeros(2)\nprint(cb_t)", GPU),
    ])
    for k in (pair.ll, pair.ref):
        assert _comm_stream(k, "comm_open", {"comm_id": "cb-" + k.name, "target_name": "ll.cb", "data": {}}) == ""
    seen = []
    for step, (cell, add) in enumerate([("cb_t.add_(2)\ncb_n = cb_n * 10", 5),
                                        ("cb_t.mul_(3)\ncb_new = torch.ones(1)", 1)]):
        pair.cell(cell, GPU)
        got = [_comm_stream(k, "comm_msg", {"comm_id": "cb-" + k.name, "data": {"add": add}})
               for k in (pair.ll, pair.ref)]
        assert got[0] == got[1], "step %d: looseleaf %r, ipykernel %r" % (step, got[0], got[1])
        seen.append(got[0])
    assert seen == ["callback sees [2.0, 2.0] 10 None\n", "callback sees [6.0, 6.0] 15 tensor([1.])\n"], seen
    pair.cell("print(cb_n, cb_t * cb_n)", GPU)


def test_gpu_cell_result_enters_output_history(pair):
    reply, _ = pair.ll.execute("pass")
    pair.ref.execute("pass")
    pair.cells([
        ("import torch\noh_t = torch.ones(2)\noh_t * 3", GPU),
        ("print(_)", None),
        ("oh_t.sum()", GPU),
        ("print(_, __)", None),
    ])
    # Out[n] by the cell's own number (the two kernels count differently: each looks up its own).
    for k in (pair.ll, pair.ref):
        reply, _ = k.execute("import torch\ntorch.zeros(1) + 5")
        n = reply["content"]["execution_count"]
        _, msgs = k.execute("print(Out[%d], _%d)" % (n, n))
        assert stream_text(msgs) == "tensor([5.]) tensor([5.])\n", (k.name, stream_text(msgs))


def test_capture_magic_in_gpu_cell(pair):
    pair.cells([
        ("%%capture cap_gpu\nimport torch\nprint('captured', torch.ones(2).sum())", GPU),
        ("print(cap_gpu.stdout)", None),
    ])


def test_syntax_error_and_system_exit_in_torch_cells(pair):
    pair.cells([
        ("import torch\nbroken = (", None),
        ("import torch\nraise SystemExit('bye')", None),
        ("import torch, warnings\nwarned = torch.ones(1)\nwarnings.warn('careful')\nwarned.tolist()", GPU),
        ("print(torch.cuda.is_available())", GPU),
    ])


def test_cells_queued_at_once(pair):
    """Run All: the next cells are queued (and may be prepared ahead) while one runs; each still sees what the
    cells before it did; after an error the rest are aborted."""
    pair.burst([
        ("import torch\nqa_t = torch.zeros(2)\nqa_n = 1", GPU),
        ("qa_n = qa_n + 1", CPU),
        ("qa_t.add_(qa_n)\nprint(qa_t)", GPU),
        ("qa_n = 10\nqa_l = [qa_n]", CPU),
        ("print(qa_t + qa_n, qa_l)", GPU),
        ("qa_t.mul_(2)", GPU),
        ("del qa_n", CPU),
        ("print(qa_t)\nprint(qa_n)", GPU),
        ("print('aborted')", None),
    ])
    _, msgs = pair.cell("print(qa_t, qa_l)", GPU)
    assert stream_text(msgs) == "tensor([4., 4.]) [10]\n"


def test_process_state_follows_the_session(pair, tmp_path):
    here = os.getcwd()
    work = str(tmp_path)
    try:
        pair.cells([
            ("import os, numpy as np", CPU),
            ("import torch\nos.chdir(%r)\nos.environ['LL_ROUTE_VAR'] = 'set on gpu'\n"
             "np.random.seed(3)\ntorch.manual_seed(3)\ntorch.set_default_dtype(torch.float64)\n"
             "import random, sys\nrandom.seed(7)\nsys.path.append('/nonexistent/ll-route')\n"
             "torch.set_grad_enabled(False)\nprint(torch.ones(1).dtype)" % work, GPU),
            ("print(os.getcwd() == %r, os.environ.get('LL_ROUTE_VAR'), np.random.randint(1000))" % work, None),
            ("print(torch.rand(2), torch.ones(1).dtype, np.random.randint(1000), os.getcwd() == %r)" % work, GPU),
            ("os.environ['LL_ROUTE_VAR'] = 'set on cpu'\nnp.random.seed(5)\nos.chdir('..')", None),
            ("print(os.environ['LL_ROUTE_VAR'], np.random.randint(1000), os.getcwd() == %r, torch.rand(1))"
             % os.path.dirname(work), GPU),
            ("print(torch.rand(1), torch.is_grad_enabled(), torch.ones(1, requires_grad=True).mul(2).requires_grad)",
             GPU),
            ("import random, sys\nprint(random.random(), sys.path[-1])", CPU),
            ("print(random.random(), sys.path[-1], torch.is_grad_enabled())", GPU),
            ("sys.path.remove('/nonexistent/ll-route')\ntorch.set_grad_enabled(True)", GPU),
            ("print('/nonexistent/ll-route' in sys.path, torch.is_grad_enabled())", GPU),
            ("torch.set_default_dtype(torch.float32)\nos.chdir(%r)\ndel os.environ['LL_ROUTE_VAR']" % here, GPU),
            ("print(os.getcwd() == %r, 'LL_ROUTE_VAR' in os.environ, torch.ones(1).dtype)" % here, GPU),
        ])
    finally:
        for k in (pair.ll, pair.ref):
            k.execute("import os\nos.chdir(%r)" % here)


def test_real_pytorch_notebook(pair, pool_mode):
    """mrdbourke_01_pytorch_workflow (see /work/shared/notebooks/SOURCES.md), cell by cell, in a directory of
    its own (it saves a model file): same outputs, and most of its cells ran on workers.  On the cold pool
    only, where every GPU cell restores from the store (the slow path; it keeps the directory's time down)."""
    if pool_mode != "cold":
        pytest.skip("the notebook runs on the cold pool only")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    work = tempfile.mkdtemp(prefix="ll-route-nb-")
    routes = []
    for k in (pair.ll, pair.ref):
        k.execute("import os\n_nb_prev_cwd = os.getcwd()\nos.chdir(%r)" % work)
    try:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            if cell.source.lstrip().startswith("!ls"):
                continue  # the file's mtime differs between the two runs
            reply, _ = pair.cell(cell.source, None)
            routes.append(ll_md(reply)["route"])
    finally:
        for k in (pair.ll, pair.ref):
            k.execute("os.chdir(_nb_prev_cwd)")
    assert routes.count(GPU) >= len(routes) // 2 and CPU in routes, routes

"""ipywidgets through the wire, as a frontend's widget manager sees them: the slider's comm_open with its state,
a frontend update of `value` running an `observe` callback that writes to an Output widget, the
`jupyter.widget.control` comm (ipywidgets 8), and comms made through `ipykernel.comm.Comm`, which libraries
written for ipykernel use (Debian's ipywidgets among them) and which send nothing unless an
`ipykernel.kernelbase.Kernel` instance exists.

Runs in the pytest process against both kernels.  The widget protocol depends on the ipywidgets of the stack
under test (the kernels import from this same Python): protocol 2 (ipywidgets >= 7: comm_open data
{state, buffer_paths}, updates {method: update, state}) in the venv, protocol 1 (Debian's ipywidgets 6: comm_open
data is the state, updates {method: backbone, sync_data}) under `make test-debian`.
"""
import uuid

import pytest

from itest_util import of_type, stream_text

ipywidgets = pytest.importorskip("ipywidgets")
WIDGETS_MAJOR = int(ipywidgets.__version__.split(".")[0])
VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def _state(open_msg):
    data = open_msg["content"]["data"]
    return data["state"] if WIDGETS_MAJOR >= 7 else data


def _update(comm_id, **state):
    if WIDGETS_MAJOR >= 7:
        data = {"method": "update", "state": state, "buffer_paths": []}
    else:
        data = {"method": "backbone", "sync_data": state}
    return {"comm_id": comm_id, "data": data}


def _opens(msgs, model_name):
    return [m for m in of_type(msgs, "comm_open")
            if m["content"]["target_name"] == "jupyter.widget" and _state(m).get("_model_name") == model_name]


def _shell_no_reply(k, msg_type, content, metadata=None):
    msg = k.kc.session.msg(msg_type, content, metadata=metadata)
    k.kc.shell_channel.send(msg)
    return k.iopub_until_idle(msg["header"]["msg_id"])


SLIDER_CELL = """
import ipywidgets as _w
wt_log = []
wt_out = _w.Output()
wt_slider = _w.IntSlider(value=3, min=0, max=10, description='n')
def _wt_changed(change):
    wt_log.append(change['new'])
    print('slider at', change['new'])
    if int(_w.__version__.split('.')[0]) >= 7:  # (6's Output context fails on ipykernel 6.17 itself)
        with wt_out:  # the frontend shows what is printed here in the Output widget
            print('value', change['new'])
wt_slider.observe(_wt_changed, names='value')
display(wt_slider, wt_out)
"""


@pytest.fixture(scope="module")
def slider(kernel):
    """The slider cell's messages, run once per kernel: (comm_id of the slider, of the output, messages)."""
    msgs = kernel.run_ok(SLIDER_CELL)
    sliders, outs = _opens(msgs, "IntSliderModel"), _opens(msgs, "OutputModel")
    assert len(sliders) == 1 and len(outs) == 1, [m["content"] for m in of_type(msgs, "comm_open")]
    return sliders[0]["content"]["comm_id"], outs[0]["content"]["comm_id"], msgs


def test_slider_opens_with_its_state(kernel, slider):
    slider_id, out_id, msgs = slider
    opened = _opens(msgs, "IntSliderModel")[0]
    state = _state(opened)
    assert (state["value"], state["min"], state["max"], state["description"]) == (3, 0, 10, "n")
    # The view the frontend renders: display_data naming the slider's model, after its comm_open.
    views = [m["content"]["data"][VIEW_MIME]["model_id"] for m in of_type(msgs, "display_data")
             if VIEW_MIME in m["content"]["data"]]
    assert views == [slider_id, out_id]
    order = [m["msg_type"] for m in msgs]
    assert order.index("comm_open") < order.index("display_data")
    assert opened["parent_header"]["msg_type"] == "execute_request"


def test_frontend_update_runs_observe_callback(kernel, slider):
    slider_id, out_id, _ = slider
    msgs = _shell_no_reply(kernel, "comm_msg", _update(slider_id, value=7))
    comm_msg_id = msgs[0]["parent_header"]["msg_id"]
    assert kernel.eval_text("(wt_slider.value, wt_log)") == "(7, [7])"
    if WIDGETS_MAJOR < 7:
        assert stream_text(msgs) == "slider at 7\n"
        return
    assert stream_text(msgs) == "slider at 7\nvalue 7\n"
    # The Output widget captures by naming the request whose output it takes (the comm_msg), then lets go.
    out_msg_ids = [m["content"]["data"].get("state", {}).get("msg_id") for m in of_type(msgs, "comm_msg")
                   if m["content"]["comm_id"] == out_id]
    assert out_msg_ids == [comm_msg_id, ""]


def test_kernel_side_change_reaches_frontend(kernel, slider):
    slider_id, _, _ = slider
    msgs = kernel.run_ok("wt_slider.value = 9")
    updates = [m["content"]["data"] for m in of_type(msgs, "comm_msg") if m["content"]["comm_id"] == slider_id]
    assert any(u.get("state", {}).get("value") == 9 for u in updates), updates
    assert stream_text(msgs).startswith("slider at 9\n")


@pytest.mark.skipif(WIDGETS_MAJOR < 8, reason="jupyter.widget.control is ipywidgets 8's")
def test_widget_control_comm(kernel, slider):
    """What JupyterLab's widget manager does on reconnecting: open a control comm, ask for every state."""
    slider_id, out_id, _ = slider
    comm_id = uuid.uuid4().hex
    msgs = _shell_no_reply(kernel, "comm_open", {"comm_id": comm_id, "target_name": "jupyter.widget.control",
                                                 "data": {}}, metadata={"version": "1.0.0"})
    assert not of_type(msgs, "comm_close")
    msgs = _shell_no_reply(kernel, "comm_msg", {"comm_id": comm_id, "data": {"method": "request_states"}})
    replies = [m["content"]["data"] for m in of_type(msgs, "comm_msg") if m["content"]["comm_id"] == comm_id]
    assert len(replies) == 1 and replies[0]["method"] == "update_states", replies
    states = replies[0]["states"]
    assert states[slider_id]["model_name"] == "IntSliderModel"
    assert states[slider_id]["state"]["value"] == kernel_value(kernel)
    assert out_id in states


def kernel_value(kernel):
    return int(kernel.eval_text("wt_slider.value"))


IPYKERNEL_COMM_CELL = """
import warnings
from ipykernel.comm import Comm as _IPKComm
wt_got = []
with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)  # ipykernel 7 deprecates the class, still used
    wt_ipk = _IPKComm(target_name='ll.ipk', data={'a': 1})
wt_ipk.on_msg(lambda msg: (wt_got.append(msg['content']['data']), print('ipk got', msg['content']['data'])))
wt_ipk.send({'b': 2})
"""


def test_ipykernel_comm_class(kernel):
    """ipykernel.comm.Comm opens, sends and hears the frontend as on ipykernel."""
    msgs = kernel.run_ok(IPYKERNEL_COMM_CELL)
    opens = [m["content"] for m in of_type(msgs, "comm_open") if m["content"]["target_name"] == "ll.ipk"]
    assert len(opens) == 1 and opens[0]["data"] == {"a": 1}
    comm_id = opens[0]["comm_id"]
    assert [m["content"] for m in of_type(msgs, "comm_msg")] == [{"comm_id": comm_id, "data": {"b": 2}}]
    msgs = _shell_no_reply(kernel, "comm_msg", {"comm_id": comm_id, "data": {"c": 3}})
    assert stream_text(msgs) == "ipk got {'c': 3}\n"
    msgs = kernel.run_ok("from ipykernel.kernelbase import Kernel as _K\n"
                         "print(_K.initialized(), get_ipython().kernel.comm_manager.get_comm(%r) is wt_ipk)\n"
                         "wt_ipk.close()" % comm_id)
    assert stream_text(msgs) == "True True\n"
    assert [m["content"]["comm_id"] for m in of_type(msgs, "comm_close")] == [comm_id]


def test_ipykernel_ipkernel_import_keeps_comms_working(kernel):
    """Importing ipykernel.ipkernel (some libraries do) swaps the comm package's factory for ipykernel's; a
    widget made afterwards must still open, and hear the frontend."""
    msgs = kernel.run_ok("import ipywidgets as _w\nimport ipykernel.ipkernel\nwt_late = _w.IntSlider(value=1)\n"
                         "wt_late.observe(lambda ch: print('late', ch['new']), names='value')")
    opened = _opens(msgs, "IntSliderModel")
    assert len(opened) == 1
    msgs = _shell_no_reply(kernel, "comm_msg", _update(opened[0]["content"]["comm_id"], value=4))
    assert stream_text(msgs) == "late 4\n"


def test_widget_cell_touching_gpu_state_runs_in_the_kernel(kernel):
    """A cell that makes a widget from GPU-framework state is labelled CPU (README, "Cell analysis"): the comm
    must live in the kernel, which hears the frontend; on a worker it would go dead with the worker.  Its
    callback, which reads the tensor, then runs in the kernel too."""
    pytest.importorskip("torch")
    kernel.run_ok("import torch\nwt_t = torch.ones(4) * 2")  # a GPU cell on LooseLeaf
    reply, msgs = kernel.execute(
        "import ipywidgets as _w\nwt_gs = _w.IntSlider(value=int(wt_t.sum()))\n"
        "wt_gs.observe(lambda ch: print('scaled', (wt_t * ch['new']).sum().item()), names='value')\nwt_gs")
    assert reply["content"]["status"] == "ok"
    if kernel.name == "looseleaf":
        md = reply["metadata"]["looseleaf"]
        assert md["route"] == "cpu" and md["label"] == "cpu", md
    opened = _opens(msgs, "IntSliderModel")
    assert len(opened) == 1 and _state(opened[0])["value"] == 8
    msgs = _shell_no_reply(kernel, "comm_msg", _update(opened[0]["content"]["comm_id"], value=3))
    assert stream_text(msgs) == "scaled 24.0\n"

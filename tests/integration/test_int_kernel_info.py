"""kernel_info_request: the reply's fields, and language_info equal to what
ipykernel reports for the same interpreter."""
import sys

from itest_util import check_envelope


def test_kernel_info_fields(kernel):
    msg_id = kernel.send("kernel_info_request", {})
    reply = kernel.reply(msg_id)
    msgs = kernel.iopub_until_idle(msg_id)
    check_envelope(kernel, msg_id, msgs)
    assert reply["msg_type"] == "kernel_info_reply"
    c = reply["content"]
    assert c["status"] == "ok"
    major, minor = (int(v) for v in c["protocol_version"].split(".")[:2])
    assert major == 5 and minor >= 3
    impl = {"looseleaf": "looseleaf", "python3": "ipython"}[kernel.name]
    if kernel.name == "looseleaf":
        # Protocol 5.5 (iopub_welcome included); the optional features implemented, as
        # ipykernel 7.4 lists them: the debugger and kernel subshells.
        assert c["protocol_version"] == "5.5"
        assert c["supported_features"] == ["kernel subshells", "debugger"]
        assert c["debugger"] is True
    assert c["implementation"] == impl
    assert isinstance(c["implementation_version"], str) and c["implementation_version"]
    assert isinstance(c["banner"], str) and c["banner"].strip()
    assert isinstance(c.get("help_links"), list)
    for link in c["help_links"]:
        assert set(link) >= {"text", "url"}
    li = c["language_info"]
    assert li["name"] == "python"
    # The kernels under test run this process's Python.
    assert li["version"] == "%d.%d.%d" % sys.version_info[:3]
    assert li["mimetype"] == "text/x-python"
    assert li["file_extension"] == ".py"


def test_language_info_matches_ipykernel(kernel, reference):
    mine = kernel.reply(kernel.send("kernel_info_request", {}))["content"]
    ref = reference.reply(reference.send("kernel_info_request", {}))["content"]
    assert mine["language_info"] == ref["language_info"]
    # (ipykernel 7.4 still reports 5.3 in kernel_info while its kernelspec and its XPUB iopub say 5.5;
    # LooseLeaf reports 5.5 in both.)
    assert mine["protocol_version"] >= ref["protocol_version"]


def test_kernel_info_on_control(kernel):
    """Frontends (JupyterLab) also ask on the control channel."""
    msg_id = kernel.send("kernel_info_request", {}, channel="control")
    reply = kernel.reply(msg_id, channel="control")
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["language_info"]["name"] == "python"
    # Control requests are framed by busy/idle too (as ipykernel does).
    check_envelope(kernel, msg_id, kernel.iopub_until_idle(msg_id))

"""Kernels in the cluster's server namespace, driven from the tests (which run outside it).

Run as a script in the server namespace (``ip netns exec``), reading JSON commands from stdin, one a line,
and answering each with one JSON line:
    {"op": "start", "name": KERNELSPEC, "env": {...}}    -> {"kernel": K}
    {"op": "exec", "kernel": K, "code": CODE}             -> {"status", "reply_md", "outputs": [...]}
    {"op": "send", "kernel": K, "code": CODE}             -> {"msg_id"}
    {"op": "collect", "kernel": K, "msg_id": M}           -> as exec, for that request
    {"op": "interrupt", "kernel": K}                      -> {}  (as the frontend's interrupt button)
    {"op": "stop", "kernel": K}                           -> {}
Outputs are what a notebook shows, normalised for comparison between kernels: ["stream", name, text],
["result", text/plain], ["display", text/plain], ["error", ename, evalue].
The kernels are the tests' private kernelspecs (tests/conftest.py: JUPYTER_PATH in the environment).
"""
import json
import os
import queue
import shutil
import sys
import tempfile
import time

from jupyter_client import KernelManager

REPLY_TIMEOUT = 180


def run_cell(kc, code=None, msg_id=None):
    """CODE's (or the sent request MSG_ID's) reply and outputs."""
    if msg_id is None:
        msg_id = kc.execute(code)
    deadline = time.monotonic() + REPLY_TIMEOUT
    reply = None
    outputs = []
    idle = False
    while reply is None or not idle:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError("no reply/idle for %r within %ss (outputs so far %s)" % (code, REPLY_TIMEOUT,
                                                                                       outputs))
        if reply is None:
            try:
                m = kc.get_shell_msg(timeout=0.05)
                if m["parent_header"].get("msg_id") == msg_id:
                    reply = m
            except queue.Empty:
                pass
        try:
            m = kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        t, c = m["msg_type"], m["content"]
        if t == "status" and c.get("execution_state") == "idle":
            idle = True
        elif t == "stream":
            if outputs and outputs[-1][0] == "stream" and outputs[-1][1] == c["name"]:
                outputs[-1][2] += c["text"]
            else:
                outputs.append(["stream", c["name"], c["text"]])
        elif t == "execute_result":
            outputs.append(["result", c["data"].get("text/plain")])
        elif t == "display_data":
            outputs.append(["display", c["data"].get("text/plain")])
        elif t == "error":
            outputs.append(["error", c["ename"], c["evalue"]])
    return {"status": reply["content"]["status"], "reply_md": reply.get("metadata", {}),
            "reply": {k: reply["content"].get(k) for k in ("ename", "evalue")}, "outputs": outputs}


def main():
    kernels = {}
    dirs = []
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "start":
                ipy = tempfile.mkdtemp(prefix="ll-ipython-")
                dirs.append(ipy)
                env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
                env.update(IPYTHONDIR=ipy)
                env.update(cmd.get("env") or {})
                km = KernelManager(kernel_name=cmd["name"])
                km.start_kernel(env=env)
                kc = km.client()
                kc.start_channels()
                kc.wait_for_ready(timeout=120)
                k = "k%d" % len(kernels)
                kernels[k] = (km, kc)
                out = {"kernel": k, "pid": km.provisioner.process.pid}
            elif cmd["op"] == "exec":
                out = run_cell(kernels[cmd["kernel"]][1], cmd["code"])
            elif cmd["op"] == "send":  # the reply is collected later (the test acts meanwhile)
                out = {"msg_id": kernels[cmd["kernel"]][1].execute(cmd["code"])}
            elif cmd["op"] == "interrupt":
                kernels[cmd["kernel"]][0].interrupt_kernel()
                out = {}
            elif cmd["op"] == "collect":
                out = run_cell(kernels[cmd["kernel"]][1], msg_id=cmd["msg_id"])
            elif cmd["op"] == "stop":
                km, kc = kernels.pop(cmd["kernel"])
                kc.stop_channels()
                km.shutdown_kernel(now=False)
                out = {}
            else:
                out = {"error": "unknown op"}
        except Exception as e:  # noqa: BLE001 - the test shows it
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out), flush=True)
    for km, kc in kernels.values():
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Kernel benchmark (`make bench`): looseleaf against ipykernel, measured in
the same run with the same client, printed as ours/ipykernel ratios.

  start      launch (KernelManager.start_kernel) to the first kernel_info_reply
  roundtrip  execute_request for `pass` until its status idle on iopub
  stream     `for i in range(N): print(i)` until idle, every line received

The client is raw pyzmq plus jupyter_client's Session for signing (no
jupyter_client channel threads), identical for both kernels.  Measurements
alternate between the kernels in small blocks so that load from other
processes on this shared machine hits both alike.  Exit status: 0 when every
measurement was taken (whatever the ratios), 1 when a kernel failed (did not
start, lost output, answered wrongly).
"""
import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import zmq
from jupyter_client import KernelManager
from jupyter_client.session import Session

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Kernels, pools and workers run in the environment of the Python running the bench (kernel/ll_pyenv.h).
os.environ.setdefault("LOOSELEAF_PYTHON", sys.executable)
LOOSELEAF = os.environ.get("LL_TEST_LOOSELEAF", os.path.join(REPO, "build", "looseleaf"))
KERNELS = {
    "looseleaf": [LOOSELEAF, "-f", "{connection_file}"],
    # The reference: ipykernel of the Python running the bench (make bench: the project's venv).
    "ipykernel": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
}
TIMEOUT = 120.0


class BenchError(Exception):
    pass


def private_jupyter_env():
    """Kernelspecs for both kernels in a temp JUPYTER_PATH; private history
    and runtime dirs, so nothing of the user's is read or written."""
    root = tempfile.mkdtemp(prefix="ll-bench-")
    for name, argv in KERNELS.items():
        kdir = os.path.join(root, "share", "kernels", name)
        os.makedirs(kdir)
        with open(os.path.join(kdir, "kernel.json"), "w") as f:
            # LooseLeaf runs in the same environment (kernel/ll_pyenv.h).
            json.dump({"argv": argv, "display_name": name, "language": "python",
                       "interrupt_mode": "signal", "env": {"LOOSELEAF_PYTHON": sys.executable}}, f)
    os.environ.update({
        "JUPYTER_PATH": os.path.join(root, "share"),
        "JUPYTER_DATA_DIR": os.path.join(root, "data"),
        "JUPYTER_RUNTIME_DIR": os.path.join(root, "runtime"),
        "IPYTHONDIR": os.path.join(root, "ipython"),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    })
    return root


class RawClient:
    """DEALER on shell, SUB on iopub, Session for signing."""

    def __init__(self, km):
        info = km.get_connection_info(session=False)
        self.session = Session(key=info["key"], signature_scheme=info["signature_scheme"])
        self.ctx = zmq.Context.instance()
        url = "%s://%s:%%d" % (info["transport"], info["ip"])
        self.shell = self.ctx.socket(zmq.DEALER)
        # Retry the connect often while the kernel is still starting (the
        # default 100 ms would quantise the start measurement).
        self.shell.setsockopt(zmq.RECONNECT_IVL, 2)
        self.shell.linger = 0
        self.shell.connect(url % info["shell_port"])
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.RCVHWM, 0)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.setsockopt(zmq.RECONNECT_IVL, 2)
        self.iopub.linger = 0
        self.iopub.connect(url % info["iopub_port"])

    def close(self):
        self.shell.close()
        self.iopub.close()

    def send(self, msg_type, content):
        msg = self.session.msg(msg_type, content)
        self.session.send(self.shell, msg)
        return msg["header"]["msg_id"]

    def _recv(self, sock):
        idents, frames = self.session.feed_identities(sock.recv_multipart(copy=False), copy=False)
        return self.session.deserialize(frames, content=True, copy=False)

    def shell_reply(self, msg_id, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while self.shell.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            msg = self._recv(self.shell)
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        raise BenchError("no reply to %s" % msg_id)

    def until_idle(self, msg_id, on_msg=None, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while self.iopub.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            msg = self._recv(self.iopub)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if on_msg is not None:
                on_msg(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return
        raise BenchError("no idle for %s" % msg_id)

    def wait_iopub_ready(self):
        """A SUB socket misses what is published before it connects: probe
        with kernel_info requests until their status reaches us."""
        for _ in range(200):
            msg_id = self.send("kernel_info_request", {})
            self.shell_reply(msg_id)
            try:
                self.until_idle(msg_id, timeout=0.2)
                return
            except BenchError:
                continue
        raise BenchError("iopub never delivered")


@contextlib.contextmanager
def kernels_on_a_private_pool(prefix):
    """One started kernel of each of KERNELS ({name: RawClient}, iopub ready) in a private Jupyter environment,
    LooseLeaf's on a host pool of its own (a temp dir named PREFIX...); on exit the clients are closed, the
    kernels shut down, the pool stopped and the directories removed."""
    root = private_jupyter_env()
    pool_dir = tempfile.mkdtemp(prefix=prefix)
    os.rmdir(pool_dir)  # the pool makes its own (0700)
    os.environ["LOOSELEAF_POOL_DIR"] = pool_dir
    kms, clients = {}, {}
    try:
        for name in KERNELS:
            km = KernelManager(kernel_name=name)
            km.start_kernel()
            kms[name] = km
            clients[name] = RawClient(km)
            clients[name].wait_iopub_ready()
        yield clients
    finally:
        for c in clients.values():
            c.close()
        for km in kms.values():
            km.shutdown_kernel(now=True)
        sys.path.insert(0, os.path.join(REPO, "tests"))
        from llpool_util import stop_pool
        stop_pool(pool_dir)
        shutil.rmtree(pool_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def execute_content(code):
    return {"code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True}


def start_once(name):
    """Seconds from launch to the first kernel_info_reply; the kernel is shut down after."""
    km = KernelManager(kernel_name=name)
    t0 = time.perf_counter()
    km.start_kernel()
    client = RawClient(km)
    try:
        reply = client.shell_reply(client.send("kernel_info_request", {}))
        elapsed = time.perf_counter() - t0
        if reply["content"].get("status") != "ok":
            raise BenchError("%s: kernel_info_reply %s" % (name, reply["content"]))
        return elapsed
    finally:
        client.close()
        km.shutdown_kernel(now=True)


def bench_start(starts):
    times = {name: [] for name in KERNELS}
    for _ in range(starts):
        for name in KERNELS:
            times[name].append(start_once(name))
    return {name: statistics.median(v) for name, v in times.items()}


def roundtrip_block(client, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        msg_id = client.send("execute_request", execute_content("pass"))
        client.until_idle(msg_id)
        out.append(time.perf_counter() - t0)
        if client.shell_reply(msg_id)["content"]["status"] != "ok":
            raise BenchError("execute of `pass` failed")
    return out


def stream_once(client, lines):
    received = []
    code = "for i in range(%d):\n    print(i)" % lines

    def collect(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            received.append(msg["content"]["text"])

    t0 = time.perf_counter()
    msg_id = client.send("execute_request", execute_content(code))
    client.until_idle(msg_id, on_msg=collect, timeout=600)
    elapsed = time.perf_counter() - t0
    client.shell_reply(msg_id)
    text = "".join(received)
    # Only the count and the ends are checked here (the integration tests
    # check the text exactly); a kernel that drops output fails the bench.
    count = text.count("\n")
    if count != lines or not text.startswith("0\n") or not text.endswith("%d\n" % (lines - 1)):
        raise BenchError("received %d of %d lines" % (count, lines))
    return elapsed


def ratio_line(what, results, unit_scale, unit):
    ours, theirs = results["looseleaf"], results["ipykernel"]
    ratio = ours / theirs
    verdict = "met" if ratio <= 1.0 else "MISSED"
    print("%-44s looseleaf %9.2f %s  ipykernel %9.2f %s  ratio %.2f (target <= 1.0: %s)"
          % (what, ours * unit_scale, unit, theirs * unit_scale, unit, ratio, verdict))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--roundtrips", type=int, default=300)
    ap.add_argument("--lines", type=int, default=1000000)
    ap.add_argument("--stream-runs", type=int, default=2)
    args = ap.parse_args()
    if not os.access(LOOSELEAF, os.X_OK):
        print("bench_kernel: %s is not built (make all)" % LOOSELEAF, file=sys.stderr)
        return 1
    root = private_jupyter_env()
    kms, clients = {}, {}
    try:
        ratio_line("start to first kernel_info_reply (median of %d)" % args.starts,
                   bench_start(args.starts), 1e3, "ms")

        for name in KERNELS:
            kms[name] = KernelManager(kernel_name=name)
            kms[name].start_kernel()
            clients[name] = RawClient(kms[name])
            clients[name].wait_iopub_ready()
            roundtrip_block(clients[name], 20)  # warm-up
        rt = {name: [] for name in KERNELS}
        block = 50
        done = 0
        while done < args.roundtrips:
            n = min(block, args.roundtrips - done)
            for name in KERNELS:
                rt[name] += roundtrip_block(clients[name], n)
            done += n
        ratio_line("execute `pass` to idle (median of %d)" % args.roundtrips,
                   {n: statistics.median(v) for n, v in rt.items()}, 1e3, "ms")

        st = {name: [] for name in KERNELS}
        for _ in range(args.stream_runs):
            for name in KERNELS:
                st[name].append(stream_once(clients[name], args.lines))
        ratio_line("stream %s printed lines (median of %d)" % (format(args.lines, ","), args.stream_runs),
                   {n: statistics.median(v) for n, v in st.items()}, 1.0, "s ")
        return 0
    except BenchError as e:
        print("bench_kernel: FAILED: %s" % e, file=sys.stderr)
        return 1
    finally:
        for c in clients.values():
            c.close()
        for km in kms.values():
            if km.has_kernel:
                km.shutdown_kernel(now=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

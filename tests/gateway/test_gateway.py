"""Tests of the kernel process itself (gateway/): command line, kernelspec,
connection-file errors, unsigned mode, signals, shutdown, the kernel's own
log staying off iopub, stream coalescing, interrupt of shell children.

Runs in the pytest process.  Each test starts
build/looseleaf itself from a connection file it writes (so it can see the
kernel's stderr and exit status) and talks to it with jupyter_client's
BlockingKernelClient.  Every wait polls with a deadline; none sleeps a fixed
time.  The message-level behaviour shared with ipykernel is covered by
tests/integration.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILT = os.path.join(REPO, "build", "looseleaf")
# LL_TEST_LOOSELEAF runs the suite against a copy (e.g. while the tree rebuilds).
BIN = os.environ.get("LL_TEST_LOOSELEAF", BUILT)
TIMEOUT = 30


def _poll(cond, timeout=TIMEOUT, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


class Proc:
    """build/looseleaf started on a fresh connection file, stderr to a file."""

    def __init__(self, tmp_path, key=b"secret-key", new_session=True, env=None, ip="127.0.0.1", args=()):
        self.cf = str(tmp_path / "kernel.json")
        write_connection_file(self.cf, key=key, transport="tcp", ip=ip)
        self.errpath = tmp_path / "kernel.stderr"
        env = dict(os.environ, **(env or {}))
        env.pop("PYTEST_CURRENT_TEST", None)
        with open(self.errpath, "wb") as err:
            self.p = subprocess.Popen([BIN, "-f", self.cf, *args], stdout=subprocess.DEVNULL, stderr=err,
                                      stdin=subprocess.DEVNULL, env=env,
                                      start_new_session=new_session)
        self.kc = BlockingKernelClient(connection_file=self.cf)
        self.kc.load_connection_file()
        if ip == "0.0.0.0":
            self.kc.ip = "127.0.0.1"
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def stderr(self):
        return self.errpath.read_text(errors="replace")

    def execute(self, code, **kw):
        """Run CODE; returns (reply content, iopub messages of the request)."""
        msg_id = self.kc.execute(code, **kw)
        return self.reply(msg_id), self.iopub_until_idle(msg_id)

    def reply(self, msg_id):
        while True:
            m = self.kc.get_shell_msg(timeout=TIMEOUT)
            if m["parent_header"].get("msg_id") == msg_id:
                return m["content"]

    def iopub_until_idle(self, msg_id):
        got = []
        while True:
            m = self.kc.get_iopub_msg(timeout=TIMEOUT)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            got.append(m)
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                return got

    def wait_exit(self, timeout=TIMEOUT):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("kernel did not exit within %ss" % timeout)

    def close(self):
        self.kc.stop_channels()
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def proc(tmp_path):
    p = Proc(tmp_path)
    yield p
    p.close()


def _stream_text(msgs, name=None):
    return "".join(m["content"]["text"] for m in msgs
                   if m["msg_type"] == "stream" and (name is None or m["content"]["name"] == name))


def _run(*args, env=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env=dict(os.environ, **(env or {})))


# ---- command line ---------------------------------------------------------------------------

def test_version_and_help():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.startswith("looseleaf ")
    r = _run("--help")
    assert r.returncode == 0 and "install" in r.stdout and "-f CONNECTION_FILE" in r.stdout


def test_bad_command_line():
    for args in (["frobnicate"], [], ["-f"], ["kernel"], ["install", "--prefix"],
                 ["install", "--bogus"]):
        r = _run(*args)
        assert r.returncode == 2, args
        assert "usage" in r.stderr or "needs" in r.stderr, args


def test_analyze_subcommand_does_not_crash():
    # Either the analysis module is linked in and handles --help, or the
    # binary says clearly that it is missing; never a crash.
    r = _run("analyze", "--help")
    assert r.returncode in (0, 1, 2)
    if r.returncode == 1:
        assert "analysis" in r.stderr


# ---- kernelspec -------------------------------------------------------------------------------

def _check_spec(path, binary=BIN):
    with open(path) as f:
        spec = json.load(f)
    assert spec["argv"] == [os.path.realpath(binary), "-f", "{connection_file}"]
    assert spec["display_name"] == "LooseLeaf (GPU)"
    assert spec["language"] == "python"
    assert spec["interrupt_mode"] == "signal"
    # JupyterLab shows its debugger panel for kernels whose spec says so.
    metadata = dict(spec["metadata"])
    # Transport encryption: "curve" where libzmq has it (test_int_encryption.py checks which).
    assert metadata.pop("supported_encryption", ["curve"]) == ["curve"]
    assert metadata == {"debugger": True}
    with open(os.path.join(os.path.dirname(path), "logo-svg.svg")) as f:
        assert f.read().startswith("<svg")


def test_build_produces_kernelspec_dir():
    _check_spec(os.path.join(REPO, "build", "kernelspec", "looseleaf", "kernel.json"), BUILT)


def test_install_user_honours_jupyter_data_dir(tmp_path):
    data = tmp_path / "data"
    r = _run("install", "--user", env={"JUPYTER_DATA_DIR": str(data)})
    assert r.returncode == 0, r.stderr
    _check_spec(data / "kernels" / "looseleaf" / "kernel.json")
    # jupyter itself finds it there (the user's data directory ahead of the venv's share/jupyter, where
    # `make setup` installed a kernelspec of the same name: tests/conftest.py sets JUPYTER_PREFER_ENV_PATH=0).
    assert os.environ.get("JUPYTER_PREFER_ENV_PATH") == "0"
    env = dict(os.environ, JUPYTER_DATA_DIR=str(data), JUPYTER_PATH="")
    out = subprocess.run([sys.executable, "-m", "jupyter_client.kernelspecapp", "list", "--json"],
                         capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    specs = json.loads(out.stdout)["kernelspecs"]
    assert specs["looseleaf"]["resource_dir"] == str(data / "kernels" / "looseleaf")


def test_install_prefix_and_name(tmp_path):
    r = _run("install", "--prefix", str(tmp_path), "--name", "ll-test", "--display-name", "X Y")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "share" / "jupyter" / "kernels" / "ll-test" / "kernel.json") as f:
        spec = json.load(f)
    assert spec["display_name"] == "X Y"
    # An installed kernel starts the user's host pool ahead of its first GPU cell (tests/prefetch/test_pf_start.py).
    assert spec["env"]["LOOSELEAF_POOL_START_MS"] == "200"
    r = _run("install", "--prefix", str(tmp_path), "--name", "bad/name")
    assert r.returncode == 1 and "invalid kernel name" in r.stderr


def _federated_extensions(jupyter_dir):
    config = pytest.importorskip("jupyterlab_server.config")
    return config.get_federated_extensions([os.path.join(jupyter_dir, "labextensions")])


def test_install_writes_the_hints_extension_and_drops_the_old_override(tmp_path):
    """Edit-time hints come from a JupyterLab extension that sends the cell being edited on a comm; the
    continuous-hinting settings override of earlier releases (its completer accepted on Enter and rewrote
    code) is removed by every install, and --no-hints removes the extension."""
    jdir = tmp_path / "share" / "jupyter"
    old = jdir / "lab" / "settings" / "overrides.d" / "looseleaf.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"@jupyterlab/completer-extension:manager": {"autoCompletion": true}}\n')
    r = _run("install", "--prefix", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert not old.exists()
    # JupyterLab's own discovery finds it, and the script it would load is there.
    ext = _federated_extensions(str(jdir))["looseleaf-hints"]
    build = ext["jupyterlab"]["_build"]
    assert build["extension"] == "./extension"
    script = os.path.join(ext["ext_path"], build["load"])
    with open(script) as f, open(os.path.join(REPO, "gateway", "ll_labext.js")) as src:
        assert f.read() == src.read()
    r = _run("install", "--prefix", str(tmp_path), "--no-hints")
    assert r.returncode == 0, r.stderr
    assert "looseleaf-hints" not in _federated_extensions(str(jdir)) and not os.path.exists(script)
    assert (jdir / "kernels" / "looseleaf" / "kernel.json").exists()


def test_jupyter_kernelspec_install_from_build_dir(tmp_path):
    env = dict(os.environ, JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_PATH="")
    src = os.path.join(REPO, "build", "kernelspec", "looseleaf")
    r = subprocess.run([sys.executable, "-m", "jupyter_client.kernelspecapp", "install", src,
                        "--user"], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    _check_spec(tmp_path / "data" / "kernels" / "looseleaf" / "kernel.json", BUILT)


# ---- connection file errors -------------------------------------------------------------------

GOOD = {"transport": "tcp", "ip": "127.0.0.1", "shell_port": 50001, "iopub_port": 50002,
        "stdin_port": 50003, "control_port": 50004, "hb_port": 50005, "key": "k",
        "signature_scheme": "hmac-sha256"}


@pytest.mark.parametrize("change, field", [
    ({"shell_port": None}, "shell_port"),
    ({"hb_port": 70000}, "hb_port"),
    ({"transport": "udp"}, "transport"),
    ({"signature_scheme": "hmac-md5"}, "signature_scheme"),
])
def test_bad_connection_file_names_the_field(tmp_path, change, field):
    cf = dict(GOOD)
    for k, v in change.items():
        if v is None:
            del cf[k]
        else:
            cf[k] = v
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cf))
    path.chmod(0o600)  # (as Jupyter writes it: a file others may read is refused first)
    r = _run("-f", str(path))
    assert r.returncode == 1
    assert field in r.stderr
    assert "Traceback" not in r.stderr


def test_unreadable_connection_file(tmp_path):
    r = _run("-f", str(tmp_path / "missing.json"))
    assert r.returncode == 1 and "missing.json" in r.stderr
    bad = tmp_path / "garbage.json"
    bad.write_text("{not json")
    bad.chmod(0o600)
    r = _run("-f", str(bad))
    assert r.returncode == 1 and "garbage.json" in r.stderr


def test_port_in_use_is_reported(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    cf = dict(GOOD, shell_port=s.getsockname()[1])
    path = tmp_path / "busy.json"
    path.write_text(json.dumps(cf))
    path.chmod(0o600)
    try:
        r = _run("-f", str(path))
    finally:
        s.close()
    assert r.returncode == 1 and "shell" in r.stderr


# ---- running kernel ---------------------------------------------------------------------------

def test_empty_key_runs_unsigned_with_warning(tmp_path):
    p = Proc(tmp_path, key=b"", args=["--allow-empty-key"])
    try:
        reply, msgs = p.execute("print(6 * 7)")
        assert reply["status"] == "ok" and _stream_text(msgs) == "42\n"
        assert "EMPTY KEY" in p.stderr()
    finally:
        p.close()


def test_log_goes_to_original_stderr_not_iopub(proc):
    # A bad message makes the kernel log a warning.  With fds 1/2 captured for
    # the cells, that line must still go to the kernel's real stderr.
    import zmq
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.connect("tcp://127.0.0.1:%d" % proc.kc.shell_port)
    s.send_multipart([b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"])
    _poll(lambda: "dropped a message on shell" in proc.stderr(), what="the warning")
    s.close(linger=0)
    reply, msgs = proc.execute("import os; os.write(2, b'cell-stderr\\n'); None")
    assert reply["status"] == "ok"
    assert _stream_text(msgs, "stderr") == "cell-stderr\n"
    assert "cell-stderr" not in proc.stderr()
    assert "secret-key" not in proc.stderr()


def test_stream_text_is_coalesced(proc):
    reply, msgs = proc.execute("for i in range(20000): print(i)")
    assert reply["status"] == "ok"
    text = _stream_text(msgs, "stdout")
    assert text == "".join("%d\n" % i for i in range(20000))
    # One message per ~50 ms or 256 KiB, not one per line (bound loose
    # enough for a loaded machine: 2000 messages would take 100 s).
    assert sum(m["msg_type"] == "stream" for m in msgs) < 2000


def test_stream_order_between_stdout_and_stderr(proc):
    code = ("import sys\n"
            "for i in range(50):\n"
            "    print('o%d' % i); print('e%d' % i, file=sys.stderr)\n")
    reply, msgs = proc.execute(code)
    assert reply["status"] == "ok"
    seq = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    assert seq == "".join("o%d\ne%d\n" % (i, i) for i in range(50))


def _gated_cell(marker, before="pass"):
    """Code that runs BEFORE, then waits (up to 60 s) until the test creates
    MARKER: the test decides when the cell may end, so nothing depends on
    how fast this machine is."""
    return ("import os, time\n%s\n"
            "t0 = time.monotonic()\n"
            "while not os.path.exists(%r) and time.monotonic() - t0 < 60:\n"
            "    time.sleep(0.02)\n"
            "print('late')\n" % (before, str(marker)))


def test_output_while_cell_runs(proc, tmp_path):
    # The first line reaches the frontend while the cell still runs (the
    # flush timer sends it, not the end of the cell): the cell only ends
    # once the test has seen that line.
    marker = tmp_path / "go"
    msg_id = proc.kc.execute(_gated_cell(marker, "print('early')"))
    while True:
        m = proc.kc.get_iopub_msg(timeout=TIMEOUT)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            break
    assert m["content"]["text"] == "early\n"
    marker.write_text("")
    assert _stream_text(proc.iopub_until_idle(msg_id)) == "late\n"
    assert proc.reply(msg_id)["status"] == "ok"


def test_invalid_utf8_from_fd_becomes_replacement(proc):
    reply, msgs = proc.execute("import os; os.write(1, b'a\\xffb\\xe2\\x82\\xac\\n'); None")
    assert reply["status"] == "ok"
    assert _stream_text(msgs) == "a\ufffdb\u20ac\n"


def test_sigterm_while_idle_exits_cleanly(proc):
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait_exit() == 0


def test_sigterm_during_cell_exits_cleanly(proc):
    msg_id = proc.kc.execute("import time; time.sleep(60)")
    _poll(lambda: any(m["msg_type"] == "execute_input"
                      for m in [proc.kc.get_iopub_msg(timeout=TIMEOUT)]), what="execute_input")
    proc.p.send_signal(signal.SIGTERM)
    assert proc.wait_exit(timeout=15) == 0


def test_shutdown_on_control_during_cell(proc):
    msg_id = proc.kc.execute("import time; time.sleep(60)")
    _poll(lambda: any(m["msg_type"] == "execute_input"
                      for m in [proc.kc.get_iopub_msg(timeout=TIMEOUT)]), what="execute_input")
    proc.kc.shutdown()
    m = proc.kc.get_control_msg(timeout=TIMEOUT)
    assert m["msg_type"] == "shutdown_reply"
    assert m["content"] == {"status": "ok", "restart": False}
    assert proc.wait_exit(timeout=15) == 0


def test_shutdown_reply_on_iopub(proc):
    proc.kc.shutdown(restart=True)
    got = []
    _poll(lambda: got.append(proc.kc.get_iopub_msg(timeout=TIMEOUT)) or
          got[-1]["msg_type"] == "shutdown_reply", what="shutdown_reply on iopub")
    assert got[-1]["content"] == {"status": "ok", "restart": True}
    assert proc.wait_exit() == 0


def test_interrupt_message_stops_shell_child(tmp_path):
    # interrupt_request raises SIGINT on the kernel's process group, so a `!`
    # command stops too (not only Python code).  os.system is the hard case:
    # C's system() ignores SIGINT in the caller and retries its wait, so only
    # the signal reaching the child itself ends the cell early.
    p = Proc(tmp_path)
    try:
        msg_id = p.kc.execute("import os; rc = os.system('sleep 60'); print('rc', rc)")
        _poll(lambda: subprocess.run(["pgrep", "-g", str(os.getpgid(p.p.pid)), "-x", "sleep"],
                                     capture_output=True).returncode == 0, what="sleep to start")
        t0 = time.monotonic()
        msg = p.kc.session.msg("interrupt_request", {})
        p.kc.control_channel.send(msg)
        reply = p.reply(msg_id)
        assert time.monotonic() - t0 < 15
        assert reply["status"] in ("ok", "error")
    finally:
        p.close()


def test_unknown_and_bad_requests_keep_kernel_alive(proc):
    msg = proc.kc.session.msg("no_such_request", {})
    proc.kc.shell_channel.send(msg)
    idle = proc.iopub_until_idle(msg["header"]["msg_id"])
    assert [m["content"]["execution_state"] for m in idle] == ["busy", "idle"]
    msg = proc.kc.session.msg("execute_request", {"silent": False})
    proc.kc.shell_channel.send(msg)
    assert proc.reply(msg["header"]["msg_id"])["status"] == "error"
    reply, msgs = proc.execute("print('still here')")
    assert _stream_text(msgs) == "still here\n"
    assert "unknown message type 'no_such_request'" in proc.stderr()


def test_request_on_the_other_channel_gets_an_error_reply(proc):
    # Shell requests run Python on the main thread, so on control they are refused, with a reply rather than
    # silence (a client waiting for it would wait for ever); the kernel lives on and nothing ran.
    msg = proc.kc.session.msg("execute_request", {"code": "print('ran on control')", "silent": False})
    proc.kc.control_channel.send(msg)
    rep = proc.kc.get_control_msg(timeout=TIMEOUT)
    assert rep["msg_type"] == "execute_reply" and rep["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    assert rep["content"]["status"] == "error" and rep["content"]["ename"] == "ChannelError"
    assert "shell" in rep["content"]["evalue"]
    states = proc.iopub_until_idle(msg["header"]["msg_id"])
    assert [m["content"]["execution_state"] for m in states] == ["busy", "idle"]
    msg = proc.kc.session.msg("usage_request", {})
    proc.kc.shell_channel.send(msg)
    assert proc.reply(msg["header"]["msg_id"])["ename"] == "ChannelError"
    reply, msgs = proc.execute("print('still here')")
    assert _stream_text(msgs) == "still here\n"


def test_control_answers_while_cell_runs(proc, tmp_path):
    # The cell ends only after the control reply arrived.
    marker = tmp_path / "go"
    msg_id = proc.kc.execute(_gated_cell(marker, "print('running', flush=True)"))
    _poll(lambda: any(m["msg_type"] == "stream"
                      for m in [proc.kc.get_iopub_msg(timeout=TIMEOUT)]), what="the cell to start")
    msg = proc.kc.session.msg("kernel_info_request", {})
    proc.kc.control_channel.send(msg)
    rep = proc.kc.get_control_msg(timeout=TIMEOUT)
    assert rep["msg_type"] == "kernel_info_reply"
    assert rep["content"]["implementation"] == "looseleaf"
    marker.write_text("")
    assert proc.reply(msg_id)["status"] == "ok"


def test_shutdown_with_a_never_ending_thread(proc):
    # Python waits for non-daemon threads when it finalizes; the kernel must
    # exit anyway.
    reply, _ = proc.execute("import threading, time\n"
                            "threading.Thread(target=lambda: time.sleep(3600)).start()")
    assert reply["status"] == "ok"
    proc.kc.shutdown()
    assert proc.wait_exit(timeout=20) == 0


def test_shutdown_with_a_hanging_atexit_handler(proc):
    # An atexit handler that never returns: the exit watchdog ends the
    # process a few seconds after the shutdown.
    reply, _ = proc.execute("import atexit, time; atexit.register(time.sleep, 3600)")
    assert reply["status"] == "ok"
    proc.kc.shutdown()
    assert proc.wait_exit(timeout=20) == 0
    assert "exit took over" in proc.stderr()


def test_input_without_a_stdin_channel_fails_fast(tmp_path):
    # allow_stdin true but the client has no stdin socket: the kernel cannot
    # deliver input_request, so input() fails at once instead of hanging.
    import zmq
    from jupyter_client.session import Session
    p = Proc(tmp_path)
    try:
        cf = json.load(open(p.cf))
        ctx = zmq.Context.instance()
        sh = ctx.socket(zmq.DEALER)
        sh.setsockopt(zmq.IDENTITY, b"no-stdin-client")
        sh.connect("tcp://127.0.0.1:%d" % cf["shell_port"])
        session = Session(key=cf["key"].encode())
        session.send(sh, "execute_request", {"code": "input('?')", "silent": False,
                                             "store_history": False, "user_expressions": {},
                                             "allow_stdin": True})
        assert sh.poll(TIMEOUT * 1000), "no execute_reply"
        _, reply = session.recv(sh)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "StdinNotImplementedError"
        sh.close(linger=0)
        assert "no frontend on stdin" in p.stderr()
    finally:
        p.close()


def test_interrupt_after_user_code_took_sigint(proc):
    # asyncio.run installs its own SIGINT handler and, when done, Python's
    # default one, which only sets a flag: a SIGINT that lands on another
    # thread than the one running the cell would then not wake time.sleep.
    # The kernel takes SIGINT back after each request, so its handler (which
    # wakes the cell's thread) gets it, whichever thread the kernel picks.
    import ctypes
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("uses the x86_64 tgkill system call number")
    reply, _ = proc.execute("import asyncio; asyncio.run(asyncio.sleep(0))")
    assert reply["status"] == "ok"
    msg_id = proc.kc.execute("import time\nprint('started', flush=True)\ntime.sleep(60)")
    _poll(lambda: any(m["msg_type"] == "stream"
                      for m in [proc.kc.get_iopub_msg(timeout=TIMEOUT)]), what="the cell to start")
    pid = proc.p.pid
    others = []
    for tid in sorted(int(t) for t in os.listdir("/proc/%d/task" % pid)):
        with open("/proc/%d/task/%d/status" % (pid, tid)) as f:
            blocked = int([l.split()[1] for l in f if l.startswith("SigBlk")][0], 16)
        if tid != pid and not blocked & (1 << (signal.SIGINT - 1)):
            others.append(tid)
    assert others, "expected a Python thread (IPython's history) that accepts SIGINT"
    t0 = time.monotonic()
    ctypes.CDLL(None, use_errno=True).syscall(234, pid, others[0], signal.SIGINT)  # tgkill
    reply = proc.reply(msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 30


def test_usage_request_on_control(proc):
    # The fields ipykernel 6.17 sends (psutil figures), here read from /proc.
    for _ in range(2):
        msg = proc.kc.session.msg("usage_request", {})
        proc.kc.control_channel.send(msg)
        rep = proc.kc.get_control_msg(timeout=TIMEOUT)
        assert rep["msg_type"] == "usage_reply"
        assert rep["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    c = rep["content"]
    assert set(c) - {"host_cpu_percent"} == {"hostname", "pid", "kernel_cpu", "kernel_memory",
                                             "cpu_count", "host_virtual_memory"}
    assert c["pid"] == proc.p.pid
    assert c["kernel_memory"] > 10 * 2**20      # an embedded IPython is tens of MB
    assert c["cpu_count"] == os.cpu_count()
    vm = c["host_virtual_memory"]
    assert set(vm) == {"total", "available", "percent", "used", "free", "active", "inactive",
                       "buffers", "cached", "shared", "slab"}
    assert 0 < vm["available"] <= vm["total"]


def test_store_module_is_built_in(proc):
    # The kernel binary registers the store's extension before
    # starting Python: importable in a cell without any .so on sys.path.
    reply, msgs = proc.execute("import sys, _llstore\n"
                               "print('_llstore' in sys.builtin_module_names, _llstore.__name__)")
    assert reply["status"] == "ok", reply
    assert _stream_text(msgs) == "True _llstore\n"


def test_routing_reports_route_and_analysis(tmp_path):
    # Routing is on by default: every cell is analysed, the reply metadata
    # carries route, label and closures, and GPU-labelled cells run on a
    # worker of the host pool (tests/routing covers that path in depth).
    # (the run's private pool: tests/conftest.py)
    p = Proc(tmp_path)
    try:
        def meta(code):
            msg_id = p.kc.execute(code)
            while True:
                m = p.kc.get_shell_msg(timeout=TIMEOUT)
                if m["parent_header"].get("msg_id") == msg_id:
                    assert m["content"]["status"] == "ok", m["content"]
                    return m["metadata"]["looseleaf"]
        first = meta("w = 2\ny = 3")
        assert first["route"] == "cpu" and first["label"] == "cpu"
        second = meta("z = y + 1")
        assert second["closure"]["state_closure"] == ["y"]
        gpu = meta("import torch\nt = torch.zeros(2) + z")
        assert gpu["label"] == "gpu" and gpu["route"] == "gpu", gpu
        assert gpu["worker_pid"] != p.p.pid
        bad = meta("%%cpu\nprint(1)")
        assert bad["label"] == "cpu"
    finally:
        p.close()


def test_routing_can_be_turned_off(tmp_path):
    p = Proc(tmp_path, env={"LOOSELEAF_GPU_ROUTING": "0"})
    try:
        msg_id = p.kc.execute("import torch\nx = torch.ones(1)")
        while True:
            m = p.kc.get_shell_msg(timeout=TIMEOUT)
            if m["parent_header"].get("msg_id") == msg_id:
                break
    finally:
        p.close()
    assert m["content"]["status"] == "ok" and "looseleaf" not in m["metadata"]


def test_looseleaf_magic_and_usage_report_gpu_time(tmp_path):
    # %looseleaf says where each variable lives and which warm worker holds the session's slot;
    # usage_request (what JupyterLab's resource panels poll) carries the GPU-seconds held vs connected.
    p = Proc(tmp_path)
    try:
        reply, _ = p.execute("import torch\ng = torch.ones(4)\nc = 1")
        assert reply["status"] == "ok", reply
        reply, _ = p.execute("k = 2")
        reply, msgs = p.execute("%looseleaf")
        assert reply["status"] == "ok", reply
        text = _stream_text(msgs)
        assert "LooseLeaf session" in text and "GPU held" in text, text
        lines = {l.split()[0]: l for l in text.splitlines() if l.startswith("  ") and l.split()}
        assert "store only" in lines["g"] and "kernel only" in lines["k"], text
        assert "Warm workers:" in text, text
        reply, _ = p.execute("r = %looseleaf --json\nassert r['variables']['g']['version'] >= 1")
        assert reply["status"] == "ok", reply
        msg = p.kc.session.msg("usage_request", {})
        p.kc.control_channel.send(msg)
        while True:
            m = p.kc.get_control_msg(timeout=TIMEOUT)
            if m["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                break
        ll = m["content"].get("looseleaf")
        assert ll and ll["connected_s"] > 0 and 0 <= ll["gpu_held_s"] <= ll["connected_s"] + 1, m["content"]
    finally:
        p.close()

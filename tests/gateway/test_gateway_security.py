"""What the kernel refuses (issue 16, items 4 and 5 and the stdin partial result): a connection file that
others may read or that is a symbolic link (the key in it lets its reader run code as the user), an empty
key, each without its explicit flag; a warning for a kernel that listens on every interface; a frame larger
than the limit (disconnected before it is held in memory); an input_reply from a frontend that was not
asked.  Starts build/looseleaf itself (tests/gateway/test_gateway.py's Proc) so it sees its stderr."""
import json
import os
import queue
import subprocess
import time
import uuid

import zmq
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from test_gateway import BIN, TIMEOUT, Proc, _stream_text

FLAG = "--allow-insecure-connection-file"


def _start(path, *args):
    """Run the kernel on connection file PATH; returns (exit status or None if it runs, stderr)."""
    p = subprocess.Popen([BIN, "-f", str(path), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    try:
        rc = p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        rc = None  # it started (no refusal comes this late)
        p.terminate()
    _, err = p.communicate(timeout=TIMEOUT)
    return rc, err


def _connection_file(tmp_path, name="kernel.json", key=b"secret-key", mode=0o600):
    path = tmp_path / name
    write_connection_file(str(path), key=key, transport="tcp", ip="127.0.0.1")
    os.chmod(path, mode)
    return path


def test_connection_file_others_may_read_is_refused(tmp_path):
    path = _connection_file(tmp_path, mode=0o644)
    rc, err = _start(path)
    assert rc == 1, err
    assert str(path) in err and "mode 0644" in err and "others" in err and FLAG in err, err
    assert "Traceback" not in err
    rc, err = _start(path, FLAG)
    assert rc is None, err


def test_connection_file_symlink_is_refused(tmp_path):
    real = _connection_file(tmp_path, "real.json")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    rc, err = _start(link)
    assert rc == 1 and "symbolic link" in err and FLAG in err, err
    rc, err = _start(link, FLAG)
    assert rc is None, err


def test_empty_key_needs_its_flag(tmp_path):
    path = _connection_file(tmp_path, key=b"")
    rc, err = _start(path)
    assert rc == 1 and "key is empty" in err and "--allow-empty-key" in err, err
    rc, err = _start(path, "--allow-empty-key")
    assert rc is None and "EMPTY KEY" in err, err


def test_listening_on_every_interface_warns(tmp_path):
    p = Proc(tmp_path, ip="0.0.0.0")
    try:
        reply, msgs = p.execute("print(1)")
        assert reply["status"] == "ok"
        assert "every network interface" in p.stderr(), p.stderr()
    finally:
        p.close()


def test_input_reply_only_from_the_asking_frontend(tmp_path):
    p = Proc(tmp_path)
    other = BlockingKernelClient(connection_file=p.cf)
    other.load_connection_file()
    other.session.session = uuid.uuid4().hex  # another frontend: another identity
    other.start_channels()
    try:
        msg_id = p.kc.execute("x = input('name? ')\nprint('got', x)", allow_stdin=True)
        req = p.kc.get_stdin_msg(timeout=TIMEOUT)
        assert req["msg_type"] == "input_request", req
        other.input("eve")            # the wrong frontend answers first: dropped
        time.sleep(0.5)
        p.kc.input("ada")
        reply = p.reply(msg_id)
        msgs = p.iopub_until_idle(msg_id)
        assert reply["status"] == "ok", reply
        assert _stream_text(msgs) == "got ada\n"
        assert "was not asked" in p.stderr(), p.stderr()
    finally:
        other.stop_channels()
        p.close()


def _peak_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def test_oversized_frame_is_refused_before_it_is_held(tmp_path):
    """With a 1 MiB limit, a 64 MiB frame (unsigned garbage) disconnects its sender before the kernel
    holds it: the kernel's peak memory does not grow by its size, and the kernel answers on."""
    p = Proc(tmp_path, env={"LOOSELEAF_MAX_FRAME_BYTES": str(1 << 20)})
    try:
        reply, _ = p.execute("print(2)")
        assert reply["status"] == "ok"
        before = _peak_rss_kb(p.p.pid)
        with open(p.cf) as f:
            cf = json.load(f)
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 2000)
        s.connect("tcp://127.0.0.1:%d" % cf["shell_port"])
        s.send_multipart([b"<IDS|MSG>", b"0" * 64, b"x" * (64 << 20), b"{}", b"{}", b"{}"])
        time.sleep(1.5)
        s.close()
        ctx.term()
        # A frame below the limit still gets through, and the kernel is alive.
        reply, msgs = p.execute("print('x' * 1000)")
        assert reply["status"] == "ok" and _stream_text(msgs) == "x" * 1000 + "\n"
        grew_mb = (_peak_rss_kb(p.p.pid) - before) / 1024
        assert grew_mb < 32, "the kernel's peak memory grew by %.0f MB" % grew_mb
    finally:
        p.close()


def _with_curve(path, public, secret):
    """Put a CurveZMQ keypair into the connection file at PATH (None leaves a field out)."""
    with open(path) as f:
        info = json.load(f)
    for field, value in (("curve_publickey", public), ("curve_secretkey", secret)):
        if value is not None:
            info[field] = value.decode()
    with open(path, "w") as f:
        json.dump(info, f)


def test_curve_keys_that_do_not_pair_are_refused(tmp_path):
    """(Transport encryption, issue 27.)  A public key that is not the secret key's would fail every
    client's handshake with nothing said; the kernel says it and exits."""
    path = _connection_file(tmp_path)
    _with_curve(path, zmq.curve_keypair()[0], zmq.curve_keypair()[1])
    rc, err = _start(path)
    assert rc == 1 and "curve_publickey is not the public key of its curve_secretkey" in err, err
    assert "Traceback" not in err


def test_half_a_curve_keypair_is_refused(tmp_path):
    """Encryption the frontend asked for is never dropped silently: half a keypair stops the kernel,
    naming the missing field."""
    path = _connection_file(tmp_path)
    _with_curve(path, zmq.curve_keypair()[0], None)
    rc, err = _start(path)
    assert rc == 1 and '"curve_secretkey" is missing' in err, err
    public, secret = zmq.curve_keypair()
    _with_curve(path, public, secret)
    rc, err = _start(path)
    assert rc is None, err  # a good pair: it runs

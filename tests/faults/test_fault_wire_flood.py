"""A flood of junk frames on the kernel's shell socket costs a few log lines, not one per frame (issue 23,
3.6): 20,000 unsigned messages used to write 20,000 WARN lines to the kernel's log.  Lines about dropped
messages are written at most once per interval (base/ll_log.h, LL_LOG_LIMIT_MS, 5 s), and the next one says
how many were left out.  The kernel answers a signed request sent after the junk on the same socket (so all
of it was read first).  ~10 s; LL_TEST_LOOSELEAF runs it against another binary."""
import os
import re
import subprocess
import time

import zmq
from jupyter_client.connect import write_connection_file
from jupyter_client.session import Session

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("LL_TEST_LOOSELEAF", os.path.join(REPO, "build", "looseleaf"))
JUNK = 20000


def test_junk_flood_logs_a_few_lines_with_a_count(tmp_path):
    cf = str(tmp_path / "kernel.json")
    _, cfg = write_connection_file(cf, key=b"flood-key", transport="tcp", ip="127.0.0.1")
    errpath = tmp_path / "kernel.stderr"
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    with open(errpath, "wb") as err:
        p = subprocess.Popen([BIN, "-f", cf], stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect("tcp://127.0.0.1:%d" % cfg["shell_port"])
    session = Session(key=b"flood-key", signature_scheme="hmac-sha256")
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)

    def execute():
        """A signed execute_request after whatever went before on this socket: its reply means the kernel read
        everything before it (one socket, in order)."""
        msg = session.send(dealer, "execute_request", {"code": "1 + 1", "silent": True, "store_history": False,
                                                       "user_expressions": {}, "allow_stdin": False})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if poller.poll(1000):
                _, reply = session.recv(dealer, mode=0)
                if reply and reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    return reply["content"]
        raise AssertionError("no execute_reply")

    def drops():
        return [line for line in errpath.read_text(errors="replace").splitlines()
                if "dropped a message on shell" in line]

    try:
        assert execute()["status"] == "ok"  # the kernel is up
        for _ in range(JUNK):
            dealer.send_multipart([b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"])
        assert execute()["status"] == "ok"
        first = drops()
        assert 1 <= len(first) <= 2, len(first)  # (two if the interval ended during the flood)
        # Once the interval is over, the next dropped message is logged with how many were left out.
        deadline = time.monotonic() + 60
        while len(drops()) == len(first) and time.monotonic() < deadline:
            dealer.send_multipart([b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"])
            execute()
            time.sleep(0.2)
        later = drops()[len(first):]
        assert later, "no line after the interval"
        m = re.search(r"and (\d+) more like it", later[0])
        assert m, later[0]
        assert int(m.group(1)) + len(first) >= JUNK, later[0]
        assert p.poll() is None
    finally:
        dealer.close()
        ctx.term()
        p.kill()
        p.wait()

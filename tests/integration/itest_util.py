"""Helpers for the integration tests: start a kernel through jupyter_client and
talk to it message by message.

Runs in the pytest process.  Every wait is a poll with a deadline (never a
bare sleep): a helper that runs out of time raises AssertionError naming the
request and listing what did arrive, so a failing test says what the kernel
did instead.
"""
import os
import queue
import re
import shutil
import tempfile
import time

from jupyter_client import KernelManager

ALL_KERNELS = ("looseleaf", "python3")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOSELEAF_BIN = os.environ.get("LL_TEST_LOOSELEAF", os.path.join(REPO, "build", "looseleaf"))

# Generous bounds: the suite runs on 2 shared cores next to other builds.
START_TIMEOUT = 60
REPLY_TIMEOUT = 30


# The slowest checks (a 30 s cell, every example notebook) exist to test
# looseleaf; running them on ipykernel as well only re-validates the tests
# themselves, so that is done on request (LL_TEST_VALIDATE=1), keeping
# `make test` lean.
VALIDATE = os.environ.get("LL_TEST_VALIDATE") == "1"


def skip_slow_on_reference(name):
    """Skip a slow test's ipykernel case unless LL_TEST_VALIDATE=1."""
    if name.startswith("python3") and not VALIDATE:
        import pytest
        pytest.skip("slow self-check on ipykernel; LL_TEST_VALIDATE=1 runs it")


def selected_kernels():
    """Kernel names parametrized tests run against (LL_TEST_KERNELS narrows them)."""
    raw = os.environ.get("LL_TEST_KERNELS", ",".join(ALL_KERNELS))
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_KERNELS]
    if unknown:
        raise ValueError("LL_TEST_KERNELS names unknown kernels: %s" % unknown)
    return names


def kernel_env():
    """The environment kernels start with: ours, minus what pytest adds.

    ipykernel turns off its capture of file descriptors 1 and 2 when it sees
    PYTEST_CURRENT_TEST (meant for ipykernel's own tests); a kernel started
    by a test must behave as one started by a user."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


class Kernel:
    """A running kernel and a blocking client connected to it."""

    def __init__(self, name, env=None, **km_options):
        """Start kernel NAME; ENV adds to (or overrides) the environment; KM_OPTIONS go to its
        KernelManager (e.g. transport_encryption="required")."""
        if name.startswith("looseleaf") and not os.access(LOOSELEAF_BIN, os.X_OK):
            raise AssertionError("%s is not built (run `make all`)" % LOOSELEAF_BIN)
        self.name = name
        # Each kernel gets its own IPython directory, so its own history
        # database: two kernels writing one sqlite file can hit "database is
        # locked", which IPython reports on stderr, into some cell's output.
        self._ipython_dir = tempfile.mkdtemp(prefix="ll-ipython-")
        # Completion types come from jedi with a time limit (0.4 s): on a loaded test machine the two kernels
        # would differ by which one hit it.  A generous limit makes the answer the same as on an idle one.
        profile = os.path.join(self._ipython_dir, "profile_default")
        os.makedirs(profile)
        with open(os.path.join(profile, "ipython_config.py"), "w") as f:
            f.write("c.Completer.jedi_compute_type_timeout = 10000\n")
        full_env = dict(kernel_env(), IPYTHONDIR=self._ipython_dir)
        full_env.update(env or {})
        self.km = KernelManager(kernel_name=name, **km_options)
        self.km.start_kernel(env=full_env)
        self.kc = None
        self.connect()

    def connect(self):
        """(Re)connect the client, e.g. after a restart."""
        if self.kc is not None:
            self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=START_TIMEOUT)
        except RuntimeError as e:
            raise AssertionError("kernel %s did not become ready: %s" % (self.name, e))
        # wait_for_ready leaves the kernel_info exchange's iopub status messages
        # behind; they carry their own parents, so later filtering ignores them.

    @property
    def pid(self):
        return self.km.provisioner.process.pid if self.km.provisioner else None

    def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=False)
        shutil.rmtree(self._ipython_dir, ignore_errors=True)

    # ---- sending -------------------------------------------------------
    def send(self, msg_type, content, channel="shell"):
        """Send a request of any type; returns its msg_id."""
        msg = self.kc.session.msg(msg_type, content)
        getattr(self.kc, channel + "_channel").send(msg)
        return msg["header"]["msg_id"]

    # ---- receiving -----------------------------------------------------
    def reply(self, msg_id, channel="shell", timeout=REPLY_TIMEOUT):
        """The reply to MSG_ID on CHANNEL; replies to other requests are skipped."""
        get = getattr(self.kc, "get_%s_msg" % channel)
        deadline = time.monotonic() + timeout
        skipped = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("%s: no %s reply to %s within %ss; skipped: %s"
                                     % (self.name, channel, msg_id, timeout, _summary(skipped)))
            try:
                msg = get(timeout=left)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
            skipped.append(msg)

    def iopub_until_idle(self, msg_id, timeout=REPLY_TIMEOUT, on_msg=None):
        """Every iopub message whose parent is MSG_ID, through its status idle.

        ON_MSG(msg), when given, is called as each message arrives (e.g. to
        answer while the request still runs)."""
        def idle(msg):
            if on_msg is not None:
                on_msg(msg)
            return msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"

        return self._iopub_collect(msg_id, idle, timeout, "no idle for %s" % msg_id)[1]

    def iopub_next(self, msg_id, pred, timeout=REPLY_TIMEOUT):
        """Wait for the first iopub message for MSG_ID that satisfies PRED;
        returns (that message, all messages for MSG_ID seen so far)."""
        return self._iopub_collect(msg_id, pred, timeout,
                                   "expected iopub message for %s not seen" % msg_id)

    def _iopub_collect(self, msg_id, pred, timeout, what):
        """Gather iopub messages whose parent is MSG_ID until one satisfies
        PRED; returns (it, all gathered).  Fails naming WHAT after TIMEOUT."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("%s: %s within %ss; got: %s"
                                     % (self.name, what, timeout, _summary(got)))
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            got.append(msg)
            if pred(msg):
                return msg, got

    def drain_iopub(self):
        """Discard iopub messages already received (leftovers of earlier tests)."""
        while True:
            try:
                self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                return

    # ---- whole exchanges -----------------------------------------------
    def request(self, msg_type, content, channel="shell", timeout=REPLY_TIMEOUT):
        """Send a request, return (reply, iopub messages through idle)."""
        msg_id = self.send(msg_type, content, channel)
        reply = self.reply(msg_id, channel, timeout)
        msgs = self.iopub_until_idle(msg_id, timeout)
        return reply, msgs

    def execute(self, code, timeout=REPLY_TIMEOUT, **kw):
        """Run CODE; returns (execute_reply, iopub messages through idle)."""
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        content.update(kw)
        reply, msgs = self.request("execute_request", content, timeout=timeout)
        if reply["content"]["status"] == "aborted" and self.name.startswith("python3"):
            # ipykernel 6.17 races after an error: a request sent right after
            # the failing one's idle is sometimes aborted as if it had been
            # queued behind it.  The reference is given a second try so tests
            # compare behaviour, not this race; looseleaf gets no second try
            # (test_int_execute.py tests it never does this).
            reply, msgs = self.request("execute_request", content, timeout=timeout)
        return reply, msgs

    def run_ok(self, code, timeout=REPLY_TIMEOUT, **kw):
        """Run CODE, assert it succeeded; returns the iopub messages."""
        reply, msgs = self.execute(code, timeout=timeout, **kw)
        assert reply["content"]["status"] == "ok", (
            "%s: %r failed: %s" % (self.name, code, _error_text(reply, msgs)))
        return msgs

    def eval_text(self, expr):
        """text/plain of EXPR evaluated in the kernel (through user_expressions)."""
        reply, _ = self.execute("", silent=True, store_history=False,
                                user_expressions={"v": expr})
        assert reply["content"]["status"] == "ok", "%s: %r: %s" % (self.name, expr, reply["content"])
        res = reply["content"]["user_expressions"]["v"]
        assert res["status"] == "ok", "%s: %r: %s" % (self.name, expr, res)
        return res["data"]["text/plain"]


def _summary(msgs):
    out = []
    for m in msgs:
        c = m.get("content", {})
        if m["msg_type"] == "status":
            out.append("status:" + c.get("execution_state", "?"))
        elif m["msg_type"] == "stream":
            out.append("stream:%s:%r" % (c.get("name"), c.get("text", "")[:80]))
        elif m["msg_type"] == "error":
            out.append("error:%s:%s" % (c.get("ename"), c.get("evalue")))
        else:
            out.append(m["msg_type"] + ":" + repr(c)[:120])
    return out


def _error_text(reply, msgs):
    c = reply["content"]
    text = "%s %s: %s" % (c.get("status"), c.get("ename"), c.get("evalue"))
    return text + "; iopub: %s" % _summary(msgs)


# ---- looking at collected iopub messages ------------------------------
def of_type(msgs, msg_type):
    return [m for m in msgs if m["msg_type"] == msg_type]


def stream_text(msgs, name="stdout"):
    """All text of stream NAME, concatenated in arrival order."""
    return "".join(m["content"]["text"] for m in msgs
                   if m["msg_type"] == "stream" and m["content"]["name"] == name)


def types(msgs):
    return [m["msg_type"] for m in msgs]


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text):
    return ANSI.sub("", text)


def check_envelope(kernel, msg_id, msgs):
    """Every request is framed on iopub by busy first and idle last, all under
    its parent header."""
    states = [m["content"]["execution_state"] for m in msgs if m["msg_type"] == "status"]
    assert states and states[0] == "busy" and states[-1] == "idle", (
        "%s: status order for %s: %s" % (kernel.name, msg_id, states))
    assert msgs[0]["msg_type"] == "status", "%s: first iopub is %s" % (kernel.name, msgs[0]["msg_type"])
    assert msgs[-1]["msg_type"] == "status"
    for m in msgs:
        assert m["parent_header"]["msg_id"] == msg_id
        assert m["header"]["session"] == msgs[0]["header"]["session"]


# ---- comparing two kernels' answers -----------------------------------
# What legitimately differs between two kernels (or two runs of one kernel)
# running the same code, and nothing else:
#   object addresses in reprs (allocation differs between processes),
#   prompt numbers "In [N]" (each kernel counts its own cells),
#   the generated file names IPython gives cells ("1234567890.py", a hash of
#     the code and the cell number) and the directory they live in (ipykernel
#     uses /tmp/ipykernel_<pid>/, another kernel its own),
#   display ids generated by display_id=True (random uuids).
ADDR = re.compile(r"0x[0-9a-fA-F]{4,}")
PROMPT = re.compile(r"In ?\[\d+\]")
# (The directory part only ever starts at a "/", so the pattern stays linear
# on long outputs.)
CELL_FILE = re.compile(r"(?:/[^\s'\"/]+)*/\d+\.py\b|\b\d+\.py\b")


def norm_text(text):
    text = ADDR.sub("0xADDR", text)
    text = PROMPT.sub("In [N]", text)
    return CELL_FILE.sub("CELL.py", text)


# What also differs between two runs of one notebook cell (tests/integration/test_int_notebooks.py and
# tests/hostd/ compare whole notebooks with it):
VARYING = [
    # %%time / %time report measured times.
    (re.compile(r"CPU times: .*"), "CPU times: T"),
    (re.compile(r"Wall time: .*"), "Wall time: T"),
    # `!ls -l` shows the file's modification time (minute granularity; the
    # two runs may straddle a minute).
    (re.compile(r"\b[A-Z][a-z]{2} +\d{1,2} +\d{1,2}:\d{2}\b"), "MTIME"),
    # display(..., display_id=True) makes a random uuid, shown in the handle's repr.
    (re.compile(r"display_id=[0-9a-f]{32}\b"), "display_id=UUID"),
]


def norm_varying(v):
    """V (a string, or lists and dicts of them) with each of VARYING's patterns replaced."""
    if isinstance(v, str):
        for pattern, repl in VARYING:
            v = pattern.sub(repl, v)
        return v
    if isinstance(v, list):
        return [norm_varying(x) for x in v]
    if isinstance(v, dict):
        return {k: norm_varying(x) for k, x in v.items()}
    return v


def norm_value(v):
    if isinstance(v, str):
        return norm_text(v)
    if isinstance(v, list):
        return [norm_value(x) for x in v]
    if isinstance(v, dict):
        return {k: norm_value(x) for k, x in v.items()}
    return v


def normalized(msgs):
    """The frontend-visible content of a request's iopub messages, in order,
    with adjacent stream chunks of one name merged (how text is cut into
    messages depends on timing) and the differences above normalised."""
    out = []
    ids = {}
    for m in msgs:
        t, c = m["msg_type"], dict(m["content"])
        if t == "status":
            continue
        if t == "stream":
            if out and out[-1][0] == "stream" and out[-1][1]["name"] == c["name"]:
                out[-1][1]["text"] += c["text"]
                continue
            out.append([t, {"name": c["name"], "text": c["text"]}])
            continue
        c.pop("execution_count", None)
        if "transient" in c and "display_id" in c["transient"]:
            did = c["transient"]["display_id"]
            c["transient"] = dict(c["transient"], display_id=ids.setdefault(did, "ID%d" % len(ids)))
        out.append([t, c])
    return [[t, norm_value(c)] for t, c in out]

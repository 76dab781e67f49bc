"""Embedding scenarios of the LooseLeaf interpreter (kernel/ll_interp.c and
kernel/py/looseleaf_kernel), driven through build/tests/kernel/embed_driver:
a C program that starts the interpreter with hooks printing what they get as
JSON lines, and feeds it requests.  No sockets, no gateway.

Each test gets a private IPYTHONDIR (history database), and waits for
conditions (lines from the driver) rather than sleeping.
"""
import sys
import json
import os
import queue
import re
import subprocess
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(REPO, "build", "tests", "kernel", "embed_driver")
ESC = "\x1b["
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["IPYTHONDIR"] = str(tmp_path / "ipython")
    e.pop("MPLBACKEND", None)
    return e


def req(msg_type, **content):
    return "%s %s" % (msg_type, json.dumps(content))


def ex(code, **kw):
    return req("execute_request", code=code, **kw)


def run(env, *lines, timeout=120):
    """Run the driver on LINES; return its events (dicts), checked to end
    with a clean finalize."""
    p = subprocess.run([DRIVER], input="\n".join(lines) + "\n", env=env, capture_output=True,
                       text=True, timeout=timeout)
    events = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert events[0] == {"ev": "init", "ok": True, "t": events[0]["t"]}, events[0]
    assert events[-1]["ev"] == "finalized", p.stderr[-3000:]
    return events


def split_replies(events):
    """Group events by request: a list of (events before the reply, reply)."""
    groups, cur = [], []
    for e in events[1:-1]:
        if e["ev"] == "reply":
            groups.append((cur, e))
            cur = []
        else:
            cur.append(e)
    return groups


def pubs(evs, msg_type):
    return [e["content"] for e in evs if e["ev"] == "publish" and e["msg_type"] == msg_type]


def text(evs, name="stdout"):
    return "".join(e["text"] for e in evs if e["ev"] == "stream" and e["name"] == name)


class Driver:
    """An interactive driver: send lines, read events as they come."""

    def __init__(self, env):
        self.p = subprocess.Popen([DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next()["ev"] == "init"

    def _read(self):
        for line in self.p.stdout:
            self.q.put(json.loads(line))
        self.q.put(None)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def next(self, timeout=60):
        e = self.q.get(timeout=timeout)
        assert e is not None, "driver exited"
        return e

    def until(self, pred, timeout=60):
        seen = []
        while True:
            e = self.next(timeout)
            seen.append(e)
            if pred(e):
                return seen

    def close(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=60)
        assert rc == 0


# ---------------------------------------------------------------- execute

def test_execute_result_and_counts(env):
    evs = run(env, ex("x = 6 * 7"), ex("x"), ex("x", silent=True), ex("x", store_history=False),
              ex("x"))
    (g1, r1), (g2, r2), (g3, r3), (g4, r4), (g5, r5) = split_replies(evs)
    assert r1["content"]["status"] == "ok" and r1["content"]["execution_count"] == 1
    assert pubs(g1, "execute_input") == [{"code": "x = 6 * 7", "execution_count": 1}]
    assert pubs(g1, "execute_result") == []
    assert pubs(g2, "execute_result") == [
        {"data": {"text/plain": "42"}, "metadata": {}, "execution_count": 2}]
    assert r2["content"] == {"status": "ok", "execution_count": 2, "user_expressions": {},
                             "payload": []}
    assert r2["metadata"]["status"] == "ok" and "started" in r2["metadata"]
    # silent: no execute_input, no result, counter unchanged (ipykernel's semantics)
    assert pubs(g3, "execute_input") == [] and pubs(g3, "execute_result") == []
    assert r3["content"]["execution_count"] == 2
    # store_history false: shown, but the counter does not move
    assert pubs(g4, "execute_input") == [{"code": "x", "execution_count": 3}]
    assert r4["content"]["execution_count"] == 2
    assert pubs(g5, "execute_result")[0]["execution_count"] == 3
    assert r5["content"]["execution_count"] == 3


def test_parent_is_the_request(env):
    evs = run(env, ex("k = get_ipython().kernel\np = k.get_parent()\n"
                      "(p['header']['msg_id'], p['msg_type'], p['content']['code'][:5],"
                      " k._parent_header is p, get_ipython().get_parent() is p)"))
    ((g, r),) = split_replies(evs)
    assert pubs(g, "execute_result")[0]["data"]["text/plain"] == \
        "('driver-1', 'execute_request', 'k = g', True, True)"


def test_handlers_are_the_gateways_request_types(env):
    """The interpreter serves exactly the types proto/ll_msgtype.c flags for it: its handler table is built
    from that list, every method shaped like a handler (content, parent) is in it, and a type without a
    handler stops the Kernel with a message naming it."""
    evs = run(env, ex(
        "import _looseleaf_kernel, inspect\n"
        "from looseleaf_kernel import kernel as kmod\n"
        "k = get_ipython().kernel\n"
        "types = _looseleaf_kernel.request_types()\n"
        "shaped = {n for n, f in inspect.getmembers(type(k), inspect.isfunction)\n"
        "          if list(inspect.signature(f).parameters) == ['self', 'content', 'parent']}\n"
        "try:\n"
        "    kmod._request_handlers(k, types + ('no_such_request',))\n"
        "    err = None\n"
        "except RuntimeError as e:\n"
        "    err = str(e)\n"
        "(sorted(k.handlers) == sorted(types), sorted(shaped - set(types)), 'execute_request' in types,\n"
        " 'debug_request' in types, 'no_such_request' in (err or ''))"))
    ((g, r),) = split_replies(evs)
    assert pubs(g, "execute_result")[0]["data"]["text/plain"] == "(True, [], True, False, True)"


def test_user_expressions_and_payload(env):
    evs = run(env, ex("a = 1", user_expressions={"ok": "a + 1", "bad": "1/0"}),
              ex("get_ipython().set_next_input('next')"), ex("exit"))
    (_, r1), (_, r2), (_, r3) = split_replies(evs)
    ue = r1["content"]["user_expressions"]
    assert ue["ok"] == {"status": "ok", "data": {"text/plain": "2"}, "metadata": {}}
    assert ue["bad"]["status"] == "error" and ue["bad"]["ename"] == "ZeroDivisionError"
    assert r2["content"]["payload"] == [{"source": "set_next_input", "text": "next",
                                         "replace": False}]
    assert r3["content"]["payload"] == [{"source": "ask_exit", "keepkernel": False}]


def test_streams_arrive_while_cell_runs(env, tmp_path):
    flag = tmp_path / "go"
    code = ("import os, time, sys\n"
            "print('first')\n"
            "print('err-line', file=sys.stderr)\n"
            "while not os.path.exists(%r):\n"
            "    time.sleep(0.01)\n"
            "print('second')\n" % str(flag))
    d = Driver(env)
    try:
        d.send(ex(code))
        seen = d.until(lambda e: e["ev"] == "stream" and e["text"] == "first")
        assert not any(e["ev"] == "reply" for e in seen)
        seen = d.until(lambda e: e["ev"] == "stream" and e["name"] == "stderr")
        assert not any(e["ev"] == "reply" for e in seen)
        flag.write_text("x")  # only now may the cell finish
        seen = d.until(lambda e: e["ev"] == "reply")
        assert text(seen) == "second\n"
        assert seen[-1]["content"]["status"] == "ok"
    finally:
        d.close()


def test_stream_object(env):
    evs = run(env, ex("import sys\n"
                      "print(sys.stdout.isatty(), sys.stdout.fileno(), sys.stderr.fileno(),"
                      " sys.stdout.writable(), sys.stdout.encoding)\n"
                      "print(sys.stdout.write('abc'))\n"
                      "sys.stdout.writelines(['x', 'y\\n'])\n"
                      "print('\\udcff-surrogate')"))
    ((g, r),) = split_replies(evs)
    assert text(g) == "False 1 2 True UTF-8\nabc3\nxy\n?-surrogate\n"


def test_error_traceback(env):
    evs = run(env, ex("print('before')\ndef f():\n    1/0\nf()"), ex("x = )"), ex("1"))
    (g1, r1), (g2, r2), (g3, r3) = split_replies(evs)
    (err,) = pubs(g1, "error")
    assert err["ename"] == "ZeroDivisionError" and err["evalue"] == "division by zero"
    tb = err["traceback"]
    assert isinstance(tb, list) and len(tb) >= 4 and all(isinstance(l, str) for l in tb)
    assert ESC in tb[0] and "ZeroDivisionError" in tb[1] and "Traceback" in tb[1]
    plain = ANSI.sub("", "\n".join(tb))
    assert "----> 4 f()" in plain and "1/0" in plain and plain.endswith("division by zero")
    # the output before the error comes first
    order = [e.get("msg_type", e["ev"]) for e in g1 if e["ev"] in ("stream", "publish")]
    assert order.index("stream") < order.index("error")
    c = r1["content"]
    assert c["status"] == "error" and c["ename"] == "ZeroDivisionError"
    assert c["traceback"] == tb and c["execution_count"] == 1
    assert c["user_expressions"] == {} and c["payload"] == []
    assert r1["metadata"]["status"] == "error"
    # a syntax error is published and replied too, and counts as an execution
    (serr,) = pubs(g2, "error")
    assert serr["ename"] == "SyntaxError"
    assert r2["content"]["ename"] == "SyntaxError" and r2["content"]["execution_count"] == 2
    assert r3["content"]["execution_count"] == 3


def test_bad_requests_get_error_replies(env):
    evs = run(env, "execute_request not-json", req("execute_request", silent=False),
              "execute_request [1, 2]", req("no_such_request"), ex("'still alive'"))
    replies = [r["content"] for _, r in split_replies(evs)]
    for r in replies[:4]:
        assert r["status"] == "error", r
    assert replies[1]["ename"] == "BadRequest"
    assert replies[3]["ename"] == "UnknownRequest"
    assert replies[4]["status"] == "ok"


def test_code_with_nul_is_not_truncated(env):
    # Python 3.11 refuses NUL in source: the cell fails like a syntax error,
    # with the code intact, and the kernel goes on.
    evs = run(env, ex("s = 'a\x00b'\nlen(s)"), ex("len('a\\x00b')"))
    (g, r), (g2, r2) = split_replies(evs)
    assert pubs(g, "execute_input")[0]["code"] == "s = 'a\x00b'\nlen(s)"
    assert r["content"]["status"] == "error" and r["content"]["ename"] == "ValueError"
    assert "null bytes" in r["content"]["evalue"] and pubs(g, "error")
    assert pubs(g2, "execute_result")[0]["data"]["text/plain"] == "3"


# ---------------------------------------------------------------- display

def test_display_update_clear(env):
    evs = run(env, ex("from IPython.display import display, HTML, clear_output\n"
                      "print('out')\n"
                      "h = display(HTML('<b>one</b>'), display_id='d1')\n"
                      "h.update(HTML('<b>two</b>'))\n"
                      "display({'text/plain': 'raw'}, raw=True, metadata={'k': 1})\n"
                      "clear_output(wait=True)\n"
                      "clear_output()"))
    ((g, r),) = split_replies(evs)
    order = [(e["msg_type"], e["content"]) for e in g if e["ev"] == "publish"][1:]
    assert order[0] == ("display_data", {"data": {"text/plain": "<IPython.core.display.HTML object>",
                                                  "text/html": "<b>one</b>"},
                                         "metadata": {}, "transient": {"display_id": "d1"}})
    assert order[1][0] == "update_display_data"
    assert order[1][1]["data"]["text/html"] == "<b>two</b>"
    assert order[1][1]["transient"] == {"display_id": "d1"}
    assert order[2] == ("display_data", {"data": {"text/plain": "raw"}, "metadata": {"k": 1},
                                         "transient": {}})
    assert order[3] == ("clear_output", {"wait": True})
    assert order[4] == ("clear_output", {"wait": False})


def test_display_data_is_always_valid_json(env):
    evs = run(env, ex("display({'text/plain': 'a\\udcffb \U0001F600'}, raw=True,"
                      " metadata={'nan': float('nan'), 'when': __import__('datetime').date(2020, 1, 2),"
                      " 'raw': b'hi'})"))
    ((g, r),) = split_replies(evs)
    (d,) = pubs(g, "display_data")
    assert d["data"]["text/plain"] == "a\ufffdb \U0001F600"
    assert d["metadata"] == {"nan": "nan", "when": "2020-01-02", "raw": "aGk="}  # bytes: base64, no newline (jupyter_client 8)


def test_rich_reprs(env):
    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
           "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")
    evs = run(env,
              ex("class H:\n    def _repr_html_(self): return '<p>h</p>'\nH()"),
              ex("class M:\n"
                 "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
                 "        return {'text/plain': 'M!', 'application/json': {'a': [1, 2]}}\nM()"),
              ex("import base64\nfrom IPython.display import Image\n"
                 "Image(data=base64.b64decode(%r))" % png))
    (g1, _), (g2, _), (g3, _) = split_replies(evs)
    (r1,) = pubs(g1, "execute_result")
    assert r1["data"]["text/html"] == "<p>h</p>" and "text/plain" in r1["data"]
    (r2,) = pubs(g2, "execute_result")
    assert r2["data"]["text/plain"] == "M!" and r2["data"]["application/json"] == {"a": [1, 2]}
    (r3,) = pubs(g3, "execute_result")
    assert r3["data"]["image/png"].strip() == png  # base64 text, as ipykernel sends it


def test_matplotlib_inline_figure_at_end_of_cell(env):
    evs = run(env, ex("%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                      "plt.plot([1, 2, 3]);\nprint('drawn')"), timeout=180)
    ((g, r),) = split_replies(evs)
    assert r["content"]["status"] == "ok", r
    (fig,) = pubs(g, "display_data")
    assert fig["data"]["image/png"].startswith("iVBORw0KGgo")
    # flushed at the end: after the cell's own output
    kinds = [e.get("msg_type", e["ev"]) for e in g if e["ev"] in ("stream", "publish")]
    assert kinds.index("stream") < kinds.index("display_data")


# ---------------------------------------------------------------- magics

def test_magics(env):
    evs = run(env, ex("%time x = sum(range(100))"), ex("%timeit -n 2 -r 2 pass"),
              ex("%%capture cap\nprint('hidden')\n'value'"), ex("print(cap.stdout.strip())"),
              ex("!echo from-shell; echo to-stderr 1>&2"), ex("print(_exit_code)"),
              ex("ip = get_ipython()\n(ip.__class__.__name__, 'IPKernelApp' in ip.config,"
                 " ip.__class__.__mro__[1].__name__)"))
    (g1, _), (g2, _), (g3, _), (g4, _), (g5, r5), (g6, _), (g7, _) = split_replies(evs)
    assert "Wall time" in text(g1)
    assert "per loop" in text(g2)
    assert text(g3) == "" and pubs(g3, "execute_result") == []
    assert text(g4) == "hidden\n"
    out = text(g5).replace("\r\n", "\n")
    assert "from-shell\n" in out and "to-stderr\n" in out and r5["content"]["status"] == "ok"
    assert text(g6) == "0\n"
    # named as ipykernel's shell, with its config section: how libraries
    # detect a Jupyter kernel
    assert pubs(g7, "execute_result")[0]["data"]["text/plain"] == \
        "('ZMQInteractiveShell', True, 'LooseLeafShell')"


def test_top_level_await(env):
    evs = run(env, ex("import asyncio\nawait asyncio.sleep(0)\nr = await asyncio.sleep(0, 'done')\nr"))
    ((g, r),) = split_replies(evs)
    assert r["content"]["status"] == "ok", r
    assert pubs(g, "execute_result")[0]["data"]["text/plain"] == "'done'"


# ---------------------------------------------------------------- stdin

def test_input_and_getpass(env):
    evs = run(env,
              '@input "Ada"', ex("n = input('name? ')\nprint('hi', n)", allow_stdin=True),
              '@input "s3cret"',
              ex("import getpass\np = getpass.getpass('pw: ')\nprint(len(p))", allow_stdin=True),
              ex("input('no stdin? ')", allow_stdin=False),
              ex("import getpass\ngetpass.getpass()", allow_stdin=False),
              '@input "\\u0004"', ex("input()", allow_stdin=True),
              "@input-interrupt", ex("input('x')", allow_stdin=True),
              ex("'alive'"))
    (g1, r1), (g2, r2), (g3, r3), (g4, r4), (g5, r5), (g6, r6), (g7, r7) = split_replies(evs)
    assert [e for e in g1 if e["ev"] == "input_request"][0]["prompt"] == "name? "
    assert text(g1) == "hi Ada\n"
    ir = [e for e in g2 if e["ev"] == "input_request"][0]
    assert ir["password"] is True and ir["prompt"] == "pw: "
    assert text(g2) == "6\n"
    assert r3["content"]["ename"] == "StdinNotImplementedError"
    assert not any(e["ev"] == "input_request" for e in g3)
    assert r4["content"]["ename"] == "StdinNotImplementedError"
    assert r5["content"]["ename"] == "EOFError"
    assert r6["content"]["ename"] == "KeyboardInterrupt"
    assert r7["content"]["status"] == "ok"


# ---------------------------------------------------------------- interrupt

@pytest.mark.parametrize("how", ["@interrupt", "@sigint"])
def test_interrupt_sleep(env, how):
    start = time.monotonic()
    evs = run(env, how + " 700", ex("import time\ntime.sleep(30)"), "@busy", ex("'after'"),
              timeout=25)
    assert time.monotonic() - start < 25  # far from the 30 s sleep
    (g1, r1), (g2, r2) = split_replies(evs)
    fired = [e for e in g1 if e["ev"] in ("interrupt", "sigint")]
    assert fired and fired[0]["busy"] is True
    assert r1["content"]["status"] == "error" and r1["content"]["ename"] == "KeyboardInterrupt"
    assert pubs(g1, "error")[0]["ename"] == "KeyboardInterrupt"
    assert [e for e in g2 if e["ev"] == "busy"][0]["busy"] is False
    assert r2["content"]["status"] == "ok"


def test_interrupt_pure_python_loop(env):
    evs = run(env, "@interrupt 700", ex("while True:\n    pass"), ex("1"), timeout=60)
    (g1, r1), (g2, r2) = split_replies(evs)
    assert r1["content"]["ename"] == "KeyboardInterrupt"
    assert r2["content"]["status"] == "ok"


def test_interrupt_when_idle_is_ignored(env):
    d = Driver(env)
    try:
        d.send("@interrupt 10")
        e = d.until(lambda e: e["ev"] == "interrupt")[-1]
        assert e["busy"] is False
        d.send(ex("import time\ntime.sleep(0.2)\n'fine'"))
        reply = d.until(lambda e: e["ev"] == "reply")[-1]
        assert reply["content"]["status"] == "ok"
    finally:
        d.close()


# ---------------------------------------------------------------- edit-time requests

def test_complete(env):
    evs = run(env, ex("import os\nmy_variable = 1"), req("complete_request", code="my_va", cursor_pos=5),
              req("complete_request", code="os.pa", cursor_pos=5),
              req("complete_request", code="x = 1\nos.getcw", cursor_pos=len("x = 1\nos.getcw")),
              req("complete_request", code="zzzq", cursor_pos=4))
    (_, _), (_, c1), (_, c2), (_, c3), (_, c4) = split_replies(evs)
    c1 = c1["content"]
    assert c1["status"] == "ok" and "my_variable" in c1["matches"]
    assert c1["cursor_start"] == 0 and c1["cursor_end"] == 5
    types = c1["metadata"]["_jupyter_types_experimental"]
    assert {"start": 0, "end": 5, "text": "my_variable", "type": "instance",
            "signature": ""} in types or any(t["text"] == "my_variable" for t in types)
    c2 = c2["content"]
    assert "path" in c2["matches"] and c2["cursor_start"] == 3 and c2["cursor_end"] == 5
    c3 = c3["content"]
    assert "getcwd" in c3["matches"] and c3["cursor_start"] == len("x = 1\nos.")
    assert c4["content"]["matches"] == [] and c4["content"]["cursor_start"] == 4


def test_inspect(env):
    evs = run(env, ex("def documented(a, b=2):\n    'The doc string.'\n    return a"),
              req("inspect_request", code="documented(", cursor_pos=10, detail_level=0),
              req("inspect_request", code="documented", cursor_pos=3, detail_level=1),
              req("inspect_request", code="nothing_here", cursor_pos=5, detail_level=0))
    (_, _), (_, i1), (_, i2), (_, i3) = split_replies(evs)
    i1 = i1["content"]
    assert i1["status"] == "ok" and i1["found"] is True
    assert "The doc string." in i1["data"]["text/plain"]
    assert "documented(a, b=2)" in ANSI.sub("", i1["data"]["text/plain"])
    assert "text/html" not in i1["data"]
    assert "return a" in ANSI.sub("", i2["content"]["data"]["text/plain"])  # detail 1: source
    assert i3["content"] == {"status": "ok", "data": {}, "metadata": {}, "found": False}


def test_is_complete(env):
    evs = run(env, req("is_complete_request", code="x = 1"),
              req("is_complete_request", code="def f():"),
              req("is_complete_request", code="for i in range(3):\n    if i:"),
              req("is_complete_request", code="x = )"),
              req("is_complete_request", code="%%time\nx = 1\n"))
    r = [r["content"] for _, r in split_replies(evs)]
    assert r[0] == {"status": "complete"}
    assert r[1] == {"status": "incomplete", "indent": "    "}
    assert r[2] == {"status": "incomplete", "indent": "        "}
    assert r[3] == {"status": "invalid"}
    assert r[4]["status"] in ("complete", "incomplete")


def test_history(env):
    evs = run(env, ex("a = 1"), ex("b = a + 1"), ex("b"), ex("print('not stored')", store_history=False),
              req("history_request", hist_access_type="tail", n=2, output=False, raw=True),
              req("history_request", hist_access_type="range", session=0, start=1, stop=4,
                  output=True, raw=True),
              req("history_request", hist_access_type="search", pattern="b*", n=10,
                  output=False, raw=True, unique=True),
              req("history_request", hist_access_type="bogus"))
    replies = [r["content"] for _, r in split_replies(evs)][4:]
    tail, rng, search, bogus = replies
    assert tail["status"] == "ok"
    assert [h[1:] for h in tail["history"]] == [[2, "b = a + 1"], [3, "b"]]
    assert [h[1:] for h in rng["history"]] == [[1, ["a = 1", None]], [2, ["b = a + 1", None]],
                                              [3, ["b", "2"]]]
    assert [h[2] for h in search["history"]] == ["b = a + 1", "b"]
    assert bogus == {"status": "ok", "history": []}


def test_kernel_info(env):
    import platform
    evs = run(env, req("kernel_info_request"))
    ((_, r),) = split_replies(evs)
    c = r["content"]
    assert c["status"] == "ok" and c["protocol_version"] == "5.5"
    assert c["implementation"] == "looseleaf" and c["implementation_version"]
    assert c["language_info"] == {
        "name": "python", "version": platform.python_version(), "mimetype": "text/x-python",
        "codemirror_mode": {"name": "ipython", "version": 3}, "pygments_lexer": "ipython3",
        "nbconvert_exporter": "python", "file_extension": ".py"}
    assert "IPython" in c["banner"] and c["help_links"]


# ---------------------------------------------------------------- comms

def test_comms_both_ways(env):
    evs = run(env,
              # kernel -> frontend, through the comm package
              ex("import comm\n"
                 "c = comm.create_comm(target_name='from_kernel', data={'hello': 1})\n"
                 "got = []\n"
                 "c.on_msg(lambda m: got.append(m['content']['data']))\n"
                 "c.send({'x': 2}, buffers=[b'\\x00\\x01'])"),
              req("comm_msg", comm_id="__CID__", data={"to": "kernel"}),
              ex("got"),
              # frontend -> kernel: a registered target
              ex("def target(c, msg):\n"
                 "    c.send({'opened_with': msg['content']['data']})\n"
                 "    c.on_msg(lambda m: c.send({'echo': m['content']['data']}))\n"
                 "    c.on_close(lambda m: print('closed', m['content']['data']))\n"
                 "comm.get_comm_manager().register_target('echo', target)"),
              req("comm_open", comm_id="f1", target_name="echo", data={"v": 1}),
              req("comm_info_request"),
              req("comm_info_request", target_name="echo"),
              req("comm_msg", comm_id="f1", data={"ping": 1}),
              req("comm_close", comm_id="f1", data={"bye": 1}),
              req("comm_info_request", target_name="echo"),
              req("comm_open", comm_id="f2", target_name="no_such_target", data={}),
              req("comm_msg", comm_id="unknown", data={}),
              req("comm_open", target_name="missing id"),
              ex("c.close()"), req("comm_info_request"))
    groups = split_replies(evs)
    g_open = groups[0][0]
    (opened,) = pubs(g_open, "comm_open")
    cid = opened["comm_id"]
    assert opened == {"data": {"hello": 1}, "comm_id": cid, "target_name": "from_kernel",
                      "target_module": None}
    sent = [e for e in g_open if e["ev"] == "publish" and e["msg_type"] == "comm_msg"][0]
    assert sent["content"] == {"data": {"x": 2}, "comm_id": cid} and sent["buffers"] == ["0001"]
    # the comm_msg to __CID__ found no comm (the id is made by the kernel) -> no crash
    assert groups[1][1]["content"] is None
    # frontend-opened comm
    g_fopen, r_fopen = groups[4]
    assert r_fopen["content"] is None
    assert pubs(g_fopen, "comm_msg") == [{"data": {"opened_with": {"v": 1}}, "comm_id": "f1"}]
    all_comms = groups[5][1]["content"]["comms"]
    assert all_comms == {cid: {"target_name": "from_kernel"}, "f1": {"target_name": "echo"}}
    assert groups[6][1]["content"] == {"status": "ok", "comms": {"f1": {"target_name": "echo"}}}
    assert pubs(groups[7][0], "comm_msg") == [{"data": {"echo": {"ping": 1}}, "comm_id": "f1"}]
    assert text(groups[8][0]) == "closed {'bye': 1}\n"
    assert groups[9][1]["content"]["comms"] == {}
    # unknown target: the kernel closes the comm it was asked to open
    assert pubs(groups[10][0], "comm_close") == [{"data": {}, "comm_id": "f2"}]
    assert groups[14][1]["content"]["comms"] == {}
    assert pubs(groups[13][0], "comm_close") == [{"data": {}, "comm_id": cid}]


def test_comm_msg_reaches_kernel_comm(env):
    d = Driver(env)
    try:
        d.send(ex("import comm\nc = comm.create_comm(target_name='t')\ngot = []\n"
                  "c.on_msg(lambda m: got.append(m['content']['data']))"))
        seen = d.until(lambda e: e["ev"] == "reply")
        cid = pubs(seen, "comm_open")[0]["comm_id"]
        d.send(req("comm_msg", comm_id=cid, data={"from": "frontend"}))
        d.until(lambda e: e["ev"] == "reply")
        d.send(ex("c.on_msg(lambda m: got.append((m['metadata'], m['buffers'])))"))
        d.until(lambda e: e["ev"] == "reply")
        d.send('@metadata {"k": "v"}')
        d.send("@buffers 6869,00ff")
        d.send(req("comm_msg", comm_id=cid, data={}))
        d.until(lambda e: e["ev"] == "reply")
        d.send(ex("got"))
        seen = d.until(lambda e: e["ev"] == "reply")
        assert pubs(seen, "execute_result")[0]["data"]["text/plain"] == \
            "[{'from': 'frontend'}, ({'k': 'v'}, [b'hi', b'\\x00\\xff'])]"
    finally:
        d.close()


# ---------------------------------------------------------------- process

def test_environment_does_not_break_embedding(env):
    env = dict(env, PYTHONHOME="/nonexistent", PYTHONPATH="/tmp/ll-extra-path")
    evs = run(env, ex("import sys, IPython, numpy\n"
                      "print(sys.executable)\n"
                      "print(sys.prefix == %r," % sys.prefix +
                      " '/tmp/ll-extra-path' in sys.path, sys.path[0] == '')"))
    ((g, r),) = split_replies(evs)
    assert r["content"]["status"] == "ok", r
    # The environment's Python (this process's) is sys.executable, and its prefix sys.prefix.
    assert text(g) == "%s\nTrue True True\n" % env.get("LOOSELEAF_PYTHON", "/usr/bin/python3")


def test_threads_and_fork(env):
    evs = run(env,
              ex("import threading\n"
                 "t = threading.Thread(target=lambda: print('from thread'))\n"
                 "t.start(); t.join()"),
              ex("import multiprocessing as mp\n"
                 "ctx = mp.get_context('fork')\n"
                 "with ctx.Pool(1) as p:\n"
                 "    print(p.map(abs, [-1, -2]))"),
              ex("'ok'"))
    (g1, _), (g2, r2), (g3, r3) = split_replies(evs)
    assert text(g1) == "from thread\n"
    assert r2["content"]["status"] == "ok" and "[1, 2]" in text(g2)
    assert r3["content"]["status"] == "ok"


def test_kernel_magics(env, tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("x = 1\n")
    evs = run(env, ex("%%edit %s" % src),
              ex("%ed " + str(src)),
              ex("v = 5\n%store v"), ex("%store -r v\nv"),
              ex("%connect_info"),
              ex("def f(:\n    pass"))
    (g1, r1), (g2, r2), (g3, r3), (g4, r4), (g5, r5), (g6, r6) = split_replies(evs)
    assert r1["content"]["payload"] == [{"source": "edit_magic", "filename": str(src),
                                         "line_number": None}]
    assert r2["content"]["payload"][0]["filename"] == str(src)
    assert "Stored 'v'" in text(g3)
    assert pubs(g4, "execute_result")[0]["data"]["text/plain"] == "5"
    # no connection file in the driver: a warning, not a crash
    assert r5["content"]["status"] == "ok" and "connection" in text(g5, "stderr")
    # cells are named like ipykernel's, <tmp>/looseleaf_<pid>/<hash>.py
    assert re.search(r"\(\d+\.py, line 1\)$", r6["content"]["evalue"])


def test_fork_a_worker(env):
    """ll_interp_fork + ll_interp_set_hooks: a forked child runs requests on
    the parent's state with its own hooks; the parent is unaffected."""
    evs = run(env, ex("import os\nx = 41\nparent = os.getpid()"),
              "@fork " + ex("print(os.getpid() != parent)\nx += 1\nx"),
              ex("x"),
              "@fork " + ex("y = 'in child'\n%history -l 2"))
    kinds = [e["ev"] for e in evs]
    assert kinds.count("child") == 2 and kinds.count("child_exit") == 2
    child = evs[kinds.index("child"):kinds.index("child_exit")]
    assert text(child) == "True\n"
    assert pubs(child, "execute_result")[0]["data"]["text/plain"] == "42"
    assert [e for e in evs if e["ev"] == "child_exit"][0]["status"] == 0
    after = evs[kinds.index("child_exit"):]
    assert pubs(after, "execute_result")[0]["data"]["text/plain"] == "41"
    # the second child sees the session's history (not the first child's
    # cell, which never happened in the parent)
    second = evs[len(kinds) - 1 - kinds[::-1].index("child"):]
    assert text(second) == "import os\nx = 41\nparent = os.getpid()\nx\n"
    assert [e for e in evs if e["ev"] == "child_exit"][1]["status"] == 0


def test_placement_magics_are_stripped(env):
    evs = run(env, ex("%%gpu\nx = 6\nx * 7"), ex("  %%cpu  \nprint(x)"), ex("%%gpu"),
              req("is_complete_request", code="%%gpu"),
              req("is_complete_request", code="%%cpu\nfor i in x:"),
              req("history_request", hist_access_type="tail", n=3, raw=True, output=False))
    (g1, r1), (g2, r2), (g3, r3), (_, c1), (_, c2), (_, h) = split_replies(evs)
    assert r1["content"]["status"] == "ok" and r1["content"]["execution_count"] == 1
    assert pubs(g1, "execute_result")[0]["data"]["text/plain"] == "42"
    assert text(g2) == "6\n" and r2["content"]["execution_count"] == 2
    assert r3["content"]["status"] == "ok"
    assert c1["content"]["status"] == "complete"
    assert c2["content"] == {"status": "incomplete", "indent": "    "}
    assert [e[2] for e in h["content"]["history"]] == ["%%gpu\nx = 6\nx * 7",
                                                       "  %%cpu  \nprint(x)", "%%gpu"]


def test_profile_config_and_startup_files(env, tmp_path):
    profile = tmp_path / "ipython" / "profile_default"
    (profile / "startup").mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(
        "c.InteractiveShell.ast_node_interactivity = 'all'\n")
    (profile / "startup" / "00-first.py").write_text("from_startup = 'yes'\nseen = [__file__]\n")
    (profile / "startup" / "01-broken.py").write_text("raise RuntimeError('bad startup')\n")
    (profile / "startup" / "02-magic.ipy").write_text("%config InteractiveShell.colors = 'NoColor'\n"
                                                      "after_broken = True\n")
    evs = run(env, ex("from_startup, after_broken, '__file__' in globals()"), ex("1\n2"))
    (g1, r1), (g2, r2) = split_replies(evs)
    assert pubs(g1, "execute_result")[0]["data"]["text/plain"] == "('yes', True, False)"
    # ast_node_interactivity = 'all' from the profile's kernel config
    assert [p["data"]["text/plain"] for p in pubs(g2, "execute_result")] == ["1", "2"]


def test_threads_outliving_finalize_do_not_use_the_hooks(env):
    # (imports inside: the shell's exit handlers clear the user namespace)
    code = ("import threading\n"
            "def chatter(print=print):\n"
            "    import time\n"
            "    for i in range(40):\n"
            "        print('late', i)\n"
            "        time.sleep(0.02)\n"
            "threading.Thread(target=chatter).start()\n")
    p = subprocess.run([DRIVER, ex(code), "@linger 3000"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    events = [json.loads(l) for l in p.stdout.splitlines()]
    assert events[-1]["ev"] == "finalized"  # no hook call after finalize
    assert "not finalizing Python" in p.stderr
    # what the thread printed after finalize went to fd 1 (the driver's stderr)
    assert "late 39\n" in p.stderr


def test_fork_right_after_cells_never_hangs(env):
    """Each cell wakes IPython's history writer, which then works inside
    sqlite with the GIL released; a fork at that instant used to leave the
    child holding sqlite's locked mutex, hanging its first history write
    (about one run in two of the test above).  Many back-to-back
    cell + fork pairs make that window all but certain to be hit."""
    lines = []
    for i in range(25):
        lines.append(ex("v%d = %d" % (i, i)))
        lines.append("@fork " + ex("print(v%d)" % i))
    evs = run(env, *lines, timeout=120)
    exits = [e for e in evs if e["ev"] == "child_exit"]
    assert len(exits) == 25 and all(e["status"] == 0 for e in exits)

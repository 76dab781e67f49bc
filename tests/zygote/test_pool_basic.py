"""Pool, zygote, fork, worker: a cell runs on a forked worker, streams its output as it happens, and its
variables reach the store for the next worker (through the C client API, without the gateway)."""
import os
import stat

from zyghelp import wait_for


def test_cell_runs_on_worker_and_state_flows(env):
    c = env.client()
    a = c.run("c1", "import numpy as np\nx = np.arange(5)\nprint('hi', x)\nx", defines=["x"],
              execution_count=3)
    assert a.ok, a.events
    assert a.types()[0] == "started"
    assert a.stdout == "hi [0 1 2 3 4]\n"
    assert a.result() == "array([0, 1, 2, 3, 4])"
    assert a.content["execution_count"] == 3
    ll = a.ll
    for key in ("worker_pid", "zygote_node", "prep_ms", "exec_ms", "save_ms", "bytes_restored", "bytes_saved"):
        assert key in ll, key
    assert set(ll["prep_ms"]) == {"fork", "import", "restore"}
    # The cell's result is saved as _3 (its execution_count) for the kernel's output history.
    assert ll["route"] == "gpu" and ll["saved"] == ["_3", "x"]
    started = a.events[0]
    assert started["pid"] == ll["worker_pid"] and started["pid"] != env.pool_pid

    # The next cell runs in another worker and sees x through the store, np through its import statement.
    b = c.run("c2", "x += 1\nprint(np.sum(x))", state_closure=["x"], import_stmts=["import numpy as np"])
    assert b.ok, b.events
    assert b.stdout == "15\n"
    assert b.ll["worker_pid"] != ll["worker_pid"]
    # x, and _3 (the first cell's result, the same array) which owns what they share.
    assert "x" in b.ll["restored"] and b.ll["bytes_restored"] > 0
    d = c.run("c3", "x", state_closure=["x"])
    assert d.result() == "array([1, 2, 3, 4, 5])"
    # The worker processes are gone once they replied.
    wait_for(lambda: not os.path.exists("/proc/%d" % ll["worker_pid"]), 10, "worker exit")


def test_runtime_dir_is_private(env):
    env.client()
    st = os.stat(env.pool_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(os.path.join(env.pool_dir, "pool.sock")).st_mode)


def test_streams_arrive_while_the_cell_runs(env):
    c = env.client()
    c.submit("s", "import sys, time\nprint('first', flush=True)\n"
                  "while not __import__('os').path.exists(%r): time.sleep(0.01)\nprint('second')"
             % os.path.join(env.tmp, "go"))
    ev = c.next()
    while ev["type"] != "stream":
        ev = c.next()
    assert ev["text"].startswith("first")
    open(os.path.join(env.tmp, "go"), "w").close()
    rest = c.collect("s")
    assert rest[-1]["content"]["status"] == "ok"
    assert "second" in "".join(e.get("text", "") for e in rest)


def test_bad_requests_get_clear_errors(env):
    c = env.client()
    c.send(op="run", id="b1", session="s", code=1, store_dir="x")
    ev = c.next()
    assert ev["type"] == "driver_error" and "code" in ev["error"]
    c.send(op="run", id="b2", session="s", code="1", store_dir="x", state_closure="notalist")
    ev = c.next()
    assert ev["type"] == "error" and "arrays of strings" in ev["error"]
    # The pool lives on.
    assert c.run("ok", "1+1").result() == "2"


def test_big_output_is_complete_ordered_and_coalesced(env):
    c = env.client()
    r = c.run("big", "import sys\nfor i in range(100000):\n    print(i)\nprint('err', file=sys.stderr)\n"
                     "from IPython.display import display\ndisplay({'a': 1}, raw=True)\nprint('after')")
    assert r.ok, r.events[-1]
    lines = r.stdout.splitlines()
    assert lines[:100000] == [str(i) for i in range(100000)] and lines[-1] == "after"
    assert r.stderr == "err\n"
    streams = [e for e in r.events if e["type"] == "stream"]
    assert len(streams) < 200, len(streams)
    kinds = [(e["type"], e.get("name") or e.get("msg_type")) for e in r.events]
    # stderr before the display, the display before the last stdout line.
    assert kinds.index(("stream", "stderr")) < kinds.index(("iopub", "display_data")) < len(kinds) - 2
    assert r.events[-2]["type"] == "stream" and r.events[-2]["text"].endswith("after\n")


def test_unreachable_store_is_a_clear_error(env):
    c = env.client()
    r = c.run("bad", "x = 1", redis_url="unix://" + env.tmp + "/nope.sock", state_closure=["x"])
    assert r.content["ename"] == "WorkerPrepareError"
    assert "nope.sock" in r.content["evalue"], r.content
    assert c.run("good", "print(2)").stdout == "2\n"


def test_fd_level_output_is_cell_output(env):
    c = env.client()
    r = c.run("fd", "import os\nos.write(1, b'raw1\\n')\nos.system('echo from-shell; echo to-err >&2')\n"
                    "print('py')")
    assert r.ok
    assert "raw1\n" in r.stdout and "from-shell\n" in r.stdout and "py\n" in r.stdout
    assert "to-err\n" in r.stderr
    assert "from-shell" not in env.log()


def test_comm_messages_with_buffers_are_relayed(env):
    import base64
    c = env.client()
    r = c.run("comm", "from comm import create_comm\ncm = create_comm(target_name='llz', data={'a': 1}, "
                      "buffers=[b'\\x00\\x01binary'])\ncm.send({'b': 2}, buffers=[b'xyz'])")
    assert r.ok, r.events[-1]
    msgs = [e for e in r.events if e["type"] == "iopub" and e["msg_type"].startswith("comm_")]
    assert [m["msg_type"] for m in msgs][:2] == ["comm_open", "comm_msg"], msgs
    assert base64.b64decode(msgs[0]["buffers"][0]) == b"\x00\x01binary"
    assert msgs[1]["content"]["data"] == {"b": 2} and base64.b64decode(msgs[1]["buffers"][0]) == b"xyz"


def test_subcommands_reject_bad_arguments_clearly(env):
    import subprocess
    from zyghelp import LOOSELEAF
    p = subprocess.run([LOOSELEAF, "pool", "--slots", "0"], capture_output=True, text=True)
    assert p.returncode == 2 and "--slots must be" in p.stderr
    p = subprocess.run([LOOSELEAF, "pool", "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2 and "usage: looseleaf pool" in p.stderr
    p = subprocess.run([LOOSELEAF, "zygote"], capture_output=True, text=True)
    assert p.returncode == 2 and "control socket" in p.stderr
    open_dir = os.path.join(env.tmp, "open")
    os.mkdir(open_dir, 0o755)
    os.chmod(open_dir, 0o755)
    p = subprocess.run([LOOSELEAF, "pool", "--foreground", "--runtime-dir", open_dir], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1 and "mode 0700" in p.stderr


def test_the_base_zygote_indexes_the_names_of_its_head_for_completion(env):
    # Completion in a kernel that has not imported numpy answers from this index (looseleaf_kernel.modindex)
    # instead of importing numpy there; the zygote writes it since it imported numpy anyway.
    import glob
    import json
    cache = os.path.join(env.tmp, "cache")
    env.environ["XDG_CACHE_HOME"] = cache
    c = env.client()
    assert c.run("i", "print(1)").ok
    pattern = os.path.join(cache, "looseleaf", "modindex", "*", "numpy.json")
    wait_for(lambda: glob.glob(pattern), 60, "the numpy index")
    with open(glob.glob(pattern)[0]) as f:
        index = json.load(f)["modules"]
    assert index["numpy"]["arange"] == "function" and index["numpy"]["ndarray"] == "class"
    assert "numpy.linalg" in index

"""history_request: tail, range and search over the cells a kernel ran,
compared with ipykernel.  Each kernel gets its own IPYTHONDIR (so its own
history database): tail and search read across sessions, and kernels sharing
one database would see each other's cells."""
import pytest

from itest_util import Kernel, check_envelope

CELLS = ["hist_a = 1", "hist_b = 2", "print('hist c')", "hist_a = 1", "hist_b * 10"]


def _start(name, tmp_path_factory):
    k = Kernel(name, env={"IPYTHONDIR": str(tmp_path_factory.mktemp("ipython-" + name))})
    for code in CELLS:
        k.run_ok(code)
    k.run_ok("not_stored = 1", store_history=False)
    return k


@pytest.fixture(scope="module")
def both(kernel_name, tmp_path_factory, jupyter_env):
    k = _start(kernel_name, tmp_path_factory)
    ref = _start("python3", tmp_path_factory)
    yield k, ref
    k.stop()
    ref.stop()


def _history(k, **content):
    base = {"output": False, "raw": True}
    base.update(content)
    msg_id = k.send("history_request", base)
    reply = k.reply(msg_id)
    check_envelope(k, msg_id, k.iopub_until_idle(msg_id))
    assert reply["msg_type"] == "history_reply"
    assert reply["content"]["status"] == "ok"
    # [session, line, input]; sessions are numbered per database.
    return [tuple(e) for e in reply["content"]["history"]]


QUERIES = {
    "tail": {"hist_access_type": "tail", "n": 3},
    "tail_all": {"hist_access_type": "tail", "n": 100},
    "tail_output": {"hist_access_type": "tail", "n": 2, "output": True},
    "range": {"hist_access_type": "range", "session": 0, "start": 2, "stop": 4},
    "range_all": {"hist_access_type": "range", "session": 0, "start": 1, "stop": None},
    "search": {"hist_access_type": "search", "pattern": "hist_a*", "n": 10},
    "search_unique": {"hist_access_type": "search", "pattern": "hist_a*", "unique": True},
    "search_none": {"hist_access_type": "search", "pattern": "nothing_like_this*"},
}


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_history_matches_ipykernel(both, query):
    k, ref = both
    mine, theirs = _history(k, **QUERIES[query]), _history(ref, **QUERIES[query])
    assert [e[1:] for e in mine] == [e[1:] for e in theirs]
    assert len({e[0] for e in mine}) <= 1


def test_history_contents(both):
    k, _ = both
    tail = _history(k, hist_access_type="tail", n=3)
    assert [e[2] for e in tail] == CELLS[-3:]
    rng = _history(k, hist_access_type="range", session=0, start=1, stop=3)
    assert [(e[1], e[2]) for e in rng] == [(1, CELLS[0]), (2, CELLS[1])]
    found = _history(k, hist_access_type="search", pattern="hist_a*", unique=True)
    assert [e[2] for e in found] == ["hist_a = 1"]
    everything = [e[2] for e in _history(k, hist_access_type="tail", n=100)]
    assert "not_stored = 1" not in everything

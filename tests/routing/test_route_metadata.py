"""execute_reply.metadata.looseleaf, the routing report of every cell: route, label, cell facts and closure for
every cell; for a GPU cell also the worker's report (worker pid, zygote node, preparation split into fork,
import and restore, execution and save times, bytes and names restored / saved / deleted, slot wait) and what
the kernel committed before it.  Checked for presence and for sense against what the cells did."""
import os

import pytest

from routehelp import alive, ll_md, run_route, stream_text, wait_for

MIB = 1 << 20


def _num(md, key):
    v = md.get(key)
    assert isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, "%s = %r in %s" % (key, v, md)
    return v


def test_cpu_cell_report(ll):
    reply, _ = run_route(ll, "rm_n = 5\nrm_words = ['a', 'b']", "cpu")
    md = ll_md(reply)
    assert md["label"] == "cpu"
    assert set(md["cell"]["defs"]) == {"rm_n", "rm_words"}, md["cell"]
    assert set(md["closure"]["writes"]) == {"rm_n", "rm_words"}, md["closure"]
    assert "worker_pid" not in md and "fallback" not in md, md


def test_gpu_cell_report(ll):
    # A CPU-side variable the GPU cell reads (the kernel commits it first), a tensor it defines (saved), a
    # name it deletes; the cell prints its own pid.
    run_route(ll, "rm_k = 3\nrm_gone = 'x'", "cpu")
    reply, msgs = run_route(ll, "import os, torch\nrm_t = torch.ones(256 * 1024) * rm_k\ndel rm_gone\n"
                                "print(os.getpid())", "gpu")
    md = ll_md(reply)
    worker = int(stream_text(msgs).strip())
    assert md["label"] == "gpu"
    assert isinstance(md["worker_pid"], int) and md["worker_pid"] == worker, (md["worker_pid"], worker)
    assert worker not in (ll.pid, os.getpid())
    assert isinstance(md["zygote_node"], int) and md["zygote_node"] >= 0, md
    assert set(md["prep_ms"]) == {"fork", "import", "restore"}, md["prep_ms"]
    for key in ("fork", "import", "restore"):
        _num(md["prep_ms"], key)
    assert md["prep_ms"]["fork"] == md["fork_ms"] and md["prep_ms"]["restore"] == md["restore_ms"], md
    for key in ("fork_ms", "import_ms", "restore_ms", "exec_ms", "save_ms", "wait_ms", "bytes_restored",
                "bytes_saved", "kernel_save_ms", "kernel_bytes_saved"):
        _num(md, key)
    assert "rm_k" in md["closure"]["state_closure"], md["closure"]
    assert "torch" in md["closure"]["import_closure"], md["closure"]
    assert "rm_k" in md["kernel_saved"], md            # the kernel committed its newer copy first
    assert "rm_k" in md["restored"], md
    assert "rm_t" in md["saved"] and md["bytes_saved"] >= MIB, md   # a 1 MiB tensor was saved
    assert md["deleted"] == ["rm_gone"], md

    # The next GPU cell gets either a fresh worker (which restores the 1 MiB tensor) or, with warm workers
    # kept, the same worker again (which holds the tensor already and restores nothing that did not move).
    reply, msgs = run_route(ll, "print(rm_t.sum().item(), os.getpid())", "gpu")
    md2 = ll_md(reply)
    total, pid2 = stream_text(msgs).split()
    assert float(total) == 3 * 256 * 1024
    assert int(pid2) == md2["worker_pid"]
    if md2.get("warm_hit"):
        assert int(pid2) == worker and "rm_t" not in md2["restored"], md2
    else:
        assert int(pid2) != worker, md2
        wait_for(lambda: not alive(worker), 30, "the first worker %d to exit" % worker)
        assert "rm_t" in md2["restored"] and md2["bytes_restored"] >= MIB, md2
    assert md2["saved"] == [] and md2["kernel_saved"] == [], md2   # nothing changed on either side


def test_execution_count_is_shared_across_routes(ll):
    counts = []
    for code, route in (("rm_c = 1", "cpu"), ("import torch\nrm_ct = torch.zeros(1)", "gpu"), ("rm_c += 1", "cpu"),
                        ("rm_ct + rm_c", "gpu")):
        reply, msgs = run_route(ll, code, route)
        counts.append(reply["content"]["execution_count"])
        inputs = [m["content"]["execution_count"] for m in msgs if m["msg_type"] == "execute_input"]
        assert inputs == [counts[-1]], (code, inputs, counts)
    assert counts == list(range(counts[0], counts[0] + 4)), counts
    result = [m for m in msgs if m["msg_type"] == "execute_result"]
    assert result and result[0]["content"]["execution_count"] == counts[-1]
    assert result[0]["content"]["data"]["text/plain"] == "tensor([2.])"


def test_forced_routes(ll):
    reply, msgs = run_route(ll, "%%gpu\nrm_forced = 7\nprint(rm_forced)", "gpu")
    assert stream_text(msgs) == "7\n"
    assert ll_md(reply)["worker_pid"] != ll.pid
    reply, msgs = run_route(ll, "%%cpu\nimport torch\nprint(torch.ones(1).sum().item() + rm_forced)", "cpu")
    assert stream_text(msgs) == "8.0\n"


def test_store_history_false_gpu_cell_keeps_the_counter(ll):
    reply, _ = run_route(ll, "import torch\nsh_t = torch.ones(1)", "gpu")
    n = reply["content"]["execution_count"]
    reply, _ = run_route(ll, "sh_u = sh_t + 1\nsh_u", "gpu", store_history=False)
    assert reply["content"]["execution_count"] == n, reply["content"]
    reply, _ = run_route(ll, "print(sh_u)", "gpu")
    assert reply["content"]["execution_count"] == n + 1, reply["content"]


def test_store_history_false_cpu_cell_keeps_the_counter(ll):
    reply, _ = run_route(ll, "sh_c = 1", "cpu")
    n = reply["content"]["execution_count"]
    reply, _ = run_route(ll, "sh_c += 1", "cpu", store_history=False)
    assert reply["content"]["execution_count"] == n, reply["content"]
    reply, _ = run_route(ll, "print(sh_c)", "cpu")
    assert reply["content"]["execution_count"] == n + 1, reply["content"]

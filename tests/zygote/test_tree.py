"""The zygote tree: a cell needing a package the best node lacks imports it after the fork, and the pool grows
a child node with it (asynchronously, only after a CUDA-safety probe); the next such cell forks from that node.
A package whose import touches CUDA (here: calls torch.cuda.is_available()) never enters a node.  At most
max_nodes nodes: least-recently-used leaves are evicted, the base kept."""
import os

from zyghelp import wait_for


def _mods(env):
    mods = os.path.join(env.tmp, "mods")
    os.makedirs(mods)
    for name in ("llz_tail1", "llz_tail2"):
        with open(os.path.join(mods, name + ".py"), "w") as f:
            f.write("VALUE = %r\n" % name)
    with open(os.path.join(mods, "llz_cudaish.py"), "w") as f:
        f.write("import torch\nHAVE_GPU = torch.cuda.is_available()\n")
    env.environ["PYTHONPATH"] = mods


def _node_with(c, module):
    for n in c.stats()["nodes"]:
        if n["ready"] and module in n["modules"]:
            return n
    return None


def test_growth_probe_and_eviction(env):
    _mods(env)
    c = env.client(extra=["--max-nodes", "2"])
    r = c.run("a", "print(llz_tail1.VALUE)", import_closure=["llz_tail1"], import_stmts=["import llz_tail1"])
    assert r.stdout == "llz_tail1\n"
    assert r.ll["zygote_node"] == 0 and r.ll["imported_after_fork"] == ["llz_tail1"]
    node = wait_for(lambda: _node_with(c, "llz_tail1"), 60, "a node with llz_tail1")
    assert node["parent"] == 0
    r = c.run("b", "print(llz_tail1.VALUE)", import_closure=["llz_tail1"], import_stmts=["import llz_tail1"])
    assert r.ll["zygote_node"] == node["id"] and r.ll["imported_after_fork"] == [], r.ll

    # Touches CUDA: probed, refused, imported after the fork every time.
    r = c.run("c", "print(llz_cudaish.HAVE_GPU)", import_closure=["llz_cudaish"],
              import_stmts=["import llz_cudaish"])
    assert r.ok and r.ll["imported_after_fork"] == ["llz_cudaish"]
    wait_for(lambda: c.stats()["safety"].get("llz_cudaish") is False, 60, "the probe's verdict")
    assert "torch.cuda.is_available" in env.log()
    r = c.run("d", "print(llz_cudaish.HAVE_GPU)", import_closure=["llz_cudaish"],
              import_stmts=["import llz_cudaish"])
    assert r.ll["imported_after_fork"] == ["llz_cudaish"]
    assert not _node_with(c, "llz_cudaish")

    # A third node would exceed max_nodes=2: the least recently used leaf goes, the base stays.
    c.run("e", "print(llz_tail2.VALUE)", import_closure=["llz_tail2"], import_stmts=["import llz_tail2"])
    wait_for(lambda: _node_with(c, "llz_tail2"), 60, "a node with llz_tail2")
    nodes = c.stats()["nodes"]
    assert len(nodes) == 2 and any(n["parent"] == -1 for n in nodes)
    assert not _node_with(c, "llz_tail1")
    assert "evicting zygote node %d" % node["id"] in env.log()
    # Cells still run (from the base, importing after the fork).
    r = c.run("f", "print(llz_tail1.VALUE)", import_closure=["llz_tail1"], import_stmts=["import llz_tail1"])
    assert r.stdout == "llz_tail1\n"


def test_no_growth_when_disabled(env):
    _mods(env)
    c = env.client(extra=["--no-grow"])
    c.run("a", "import llz_tail1", import_closure=["llz_tail1"])
    c.run("b", "import llz_tail1", import_closure=["llz_tail1"])
    assert len(c.stats()["nodes"]) == 1


def test_cells_arriving_while_a_node_grows_do_not_grow_it_twice(env):
    _mods(env)
    c = env.client()
    for i in range(6):
        c.run("a%d" % i, "import llz_tail1", import_closure=["llz_tail1"])
    wait_for(lambda: _node_with(c, "llz_tail1"), 60, "a node with llz_tail1")
    assert sum("llz_tail1" in n["modules"] for n in c.stats()["nodes"]) == 1
    assert env.log().count("growing node") == 1

"""Eviction on a CUDA host (the stub's 2 devices, a slot each): warm workers hold both devices; a third
client's cell evicts one of them (GreedyDual: the one holding least), and its fresh worker gets the freed
slot's device, which its driver shows it alone."""
from stubhelp import ASK_DRIVER
from test_warm import WARM, _workers
from zyghelp import pid_alive, wait_for


def test_a_cell_evicts_a_warm_worker_and_gets_its_device(env):
    a = env.client(slots=2, extra=WARM)
    b = env.client(slots=2, extra=WARM)
    ra = a.run("a", "import numpy as np\nbig = np.ones(1 << 20)\n" + ASK_DRIVER, defines=["big"])
    rb = b.run("b", "small = 1\n" + ASK_DRIVER, defines=["small"])
    assert ra.ok and rb.ok, (ra.events, rb.events)
    dev = {ra.ll["worker_pid"]: ra.stdout.split("driver ")[1].strip(),
           rb.ll["worker_pid"]: rb.stdout.split("driver ")[1].strip()}
    assert sorted(dev.values()) == ["0 1 LooseLeaf Stub GPU 0", "0 1 LooseLeaf Stub GPU 1"], dev
    wait_for(lambda: all(w["state"] == "warm" for w in _workers(a).values()) and len(_workers(a)) == 2, 30,
             "both workers warm")
    c = env.client(slots=2, extra=WARM)
    rc = c.run("c", ASK_DRIVER)
    assert rc.ok, rc.events
    # B's worker held less (GreedyDual): it went, and C's worker drives the device it had.
    wait_for(lambda: not pid_alive(rb.ll["worker_pid"]), 30, "B's warm worker evicted for C's cell")
    assert pid_alive(ra.ll["worker_pid"])
    assert rc.stdout.split("driver ")[1].strip() == dev[rb.ll["worker_pid"]], (rc.stdout, dev)
    # B's state was committed before: its next cell restores it on a worker of its own.
    rb2 = b.run("b2", "print(small + 1)", state_closure=["small"])
    assert rb2.ok and rb2.stdout == "2\n", rb2.events

"""Device counting and slots on a host whose libcuda is the stub driver (2 devices): the pool counts through the
driver API, lays its slots over the devices, and each worker sees its slot's device alone, as the driver itself
tells a cell (CUDA_VISIBLE_DEVICES read at cuInit)."""
from stubhelp import ASK_DRIVER
from zyghelp import wait_for


def _driver_line(r):
    assert r.ok, r.events
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("driver ")]
    assert lines, r.events
    return lines[-1]


def test_the_pool_counts_the_stubs_devices_and_gives_each_slot_one(env):
    c = env.client(slots=2)
    st = c.stats()
    g = st["gpus"]
    assert st["cuda"] and g["count"] == 2, g
    assert g["via"].endswith("libcuda.so.1") and g["driver_version"] == 13000, g
    assert [d["name"] for d in g["devices"]] == ["LooseLeaf Stub GPU 0", "LooseLeaf Stub GPU 1"], g
    assert g["devices"][0]["mem_bytes"] == 80 << 30, g
    assert g["slot_device"] == [0, 1], g
    # The pool counted in a child of its own: cuInit there, never in the pool or a zygote.
    inits = {p for p, call in env.calls() if call == "cuInit"}
    assert inits and st["pid"] not in inits and not inits & set(env.zygote_pids(c)), (inits, st)
    wait_for(lambda: "CUDA: 2 device(s) through" in env.log(), 10, "the detection's log line")


def test_two_slots_per_device_and_the_pools_visible_list(env):
    env.environ["CUDA_VISIBLE_DEVICES"] = "1"  # the pool itself sees the host's device 1 alone
    env.environ["LL_POOL_GPU_SLOTS"] = "2"
    c = env.client()
    g = c.stats()["gpus"]
    assert g["count"] == 1 and [d["name"] for d in g["devices"]] == ["LooseLeaf Stub GPU 1"], g
    assert g["slot_device"] == [0, 0] and all(abs(f - 0.475) < 1e-9 for f in g["mem_fraction"]), g
    # Its worker's driver sees that device, under the index 0 (CUDA_VISIBLE_DEVICES=1).
    assert _driver_line(c.run("a", ASK_DRIVER)) == "driver 0 1 LooseLeaf Stub GPU 1"


def test_cells_held_at_once_see_one_device_each(env):
    c = env.client(slots=2)
    for i in range(2):
        c.submit("h%d" % i, ASK_DRIVER + "import time\ntime.sleep(2)\n")
    out, replies = {}, 0
    while replies < 2:
        ev = c.next(120)
        assert ev["type"] not in ("eof", "pool_gone", "error"), ev
        if ev["type"] == "stream":
            out[ev["id"]] = out.get(ev["id"], "") + ev["text"]
        if ev["type"] == "reply":
            assert ev["content"]["status"] == "ok", ev
            replies += 1
    seen = sorted(v.strip() for v in out.values())
    assert seen == ["driver 0 1 LooseLeaf Stub GPU 0", "driver 0 1 LooseLeaf Stub GPU 1"], seen


def test_a_pool_whose_visible_list_names_uuids_hands_them_on(env):
    # Batch systems (Slurm, Kubernetes' device plugin) list devices by UUID: the pool counts what the list
    # shows and gives each worker its device's own entry, which the driver resolves to that device.
    uuid1 = "GPU-4c4c5354-5542-0000-0000-000000000001"
    env.environ["CUDA_VISIBLE_DEVICES"] = uuid1
    c = env.client(slots=1)
    g = c.stats()["gpus"]
    assert g["count"] == 1 and [d["name"] for d in g["devices"]] == ["LooseLeaf Stub GPU 1"], g
    r = c.run("a", "import os\nprint(os.environ['CUDA_VISIBLE_DEVICES'])\n" + ASK_DRIVER)
    assert r.ok and r.stdout.splitlines() == [uuid1, "driver 0 1 LooseLeaf Stub GPU 1"], r.events

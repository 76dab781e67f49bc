"""CUDA slots without a GPU (issue 15, items 8 and 9): the pool counts devices through a fake CUDA driver
(LL_CUDA_DRIVER, a tiny libcuda built here that reports what LL_FAKE_CUDA says), lays several workers over
each device with a memory cap, and shows each worker only its slot's device; a driver that fails, hangs or
crashes leaves the pool serving on virtual slots whose workers see no device at all."""
import os
import subprocess

import pytest

from zyghelp import wait_for

FAKE_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* LL_FAKE_CUDA: "N" devices, or "nodev", "hang", "crash", "fail". */
static const char *mode(void) { const char *m = getenv("LL_FAKE_CUDA"); return m ? m : "1"; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuInit(unsigned flags) {
    (void) flags;
    if (!strcmp(mode(), "hang")) for (;;) pause();
    if (!strcmp(mode(), "crash")) abort();
    if (!strcmp(mode(), "nodev")) return 100;
    if (!strcmp(mode(), "fail")) return 999;
    return 0;
}
int cuDeviceGetCount(int *n) { *n = atoi(mode()); return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *name, int len, int d) { snprintf(name, len, "Fake GPU %d", d); return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int d) { *bytes = (size_t) (80 + d) << 30; return 0; }
int cuGetErrorString(int rc, const char **s) { *s = rc == 100 ? "no CUDA-capable device" : "unknown"; return 0; }
"""


@pytest.fixture
def fake_driver(env):
    src = os.path.join(env.tmp, "fakecuda.c")
    with open(src, "w") as f:
        f.write(FAKE_DRIVER)
    lib = os.path.join(env.tmp, "libcuda.so.1")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, src], check=True)
    env.environ["LL_CUDA_DRIVER"] = lib
    return lib


VISIBLE = "import os\nprint(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"


def _stdout(events):
    assert events[-1]["type"] == "reply" and events[-1]["content"]["status"] == "ok", events
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")


def _visible_of(c, cid):
    r = c.run(cid, VISIBLE)
    assert r.ok, r.events
    return r.stdout.strip()


def test_devices_are_counted_through_the_driver_with_several_workers_each(env, fake_driver):
    env.environ["LL_FAKE_CUDA"] = "2"
    env.environ["LL_POOL_GPU_SLOTS"] = "2"
    c = env.client()
    st = c.stats()
    g = st["gpus"]
    assert st["cuda"] and len(st["slots"]) == 4, st
    assert g["count"] == 2 and g["via"] == fake_driver and g["driver_version"] == 13000
    assert [d["name"] for d in g["devices"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert g["devices"][1]["mem_bytes"] == 81 << 30 and g["devices"][0]["workers"] == 2
    assert g["slot_device"] == [0, 1, 0, 1]
    assert all(abs(f - 0.475) < 1e-9 for f in g["mem_fraction"]), g
    # The detection is logged, the devices named.
    wait_for(lambda: "CUDA: 2 device(s) through" in env.log(), 10, "the detection's log line")
    assert "CUDA device 1: Fake GPU 1, 81.0 GiB, 2 worker(s)" in env.log()
    # A worker sees its slot's device alone (and no torch here, so CUDA itself is never started).
    assert _visible_of(c, "a") == "'0'"


def test_the_total_slots_spread_over_the_devices_and_the_pools_visible_list(env, fake_driver):
    # LL_POOL_SLOTS (here --slots 3) is the total when no per-device count is given; the pool's own
    # CUDA_VISIBLE_DEVICES maps device indices to its entries.
    env.environ["LL_FAKE_CUDA"] = "2"
    env.environ["CUDA_VISIBLE_DEVICES"] = "5,7"
    c = env.client(slots=3)
    g = c.stats()["gpus"]
    assert g["slot_device"] == [0, 1, 0] and g["mem_fraction"] == [0.475, 0.0, 0.475], g
    # Three cells held at once take the three slots: devices 5, 7, 5.
    for i in range(3):
        c.submit("h%d" % i, "import os, time\nprint(os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
                 "time.sleep(3)")
    out, replies = {}, 0
    while replies < 3:
        ev = c.next(120)
        assert ev["type"] not in ("eof", "pool_gone", "error"), ev
        if ev["type"] == "stream":
            out[ev["id"]] = out.get(ev["id"], "") + ev["text"]
        replies += ev["type"] == "reply"
    seen = sorted(v.strip() for v in out.values())
    assert seen == ["5", "5", "7"], seen


def test_an_explicit_memory_fraction_and_one_device_alone(env, fake_driver):
    env.environ["LL_FAKE_CUDA"] = "1"
    env.environ["LL_POOL_GPU_MEM_FRACTION"] = "0.3"
    c = env.client(extra=["--gpu-slots", "1"])
    g = c.stats()["gpus"]
    assert g["slot_device"] == [0] and g["mem_fraction"] == [0.3], g


@pytest.mark.parametrize("mode, why", [("nodev", "no CUDA-capable device (CUresult 100)"),
                                       ("fail", "CUresult 999"),
                                       ("crash", "died of signal 6"),
                                       ("hang", "no answer from")])
def test_a_driver_that_fails_leaves_virtual_slots_without_a_device(env, fake_driver, mode, why):
    env.environ["LL_FAKE_CUDA"] = mode
    env.environ["LL_POOL_GPU_DETECT_MS"] = "1500"
    c = env.client()
    st = c.stats()
    assert not st["cuda"] and len(st["slots"]) == 2 and st["gpus"]["count"] == 0, st
    assert why in st["gpus"]["why"], st["gpus"]
    wait_for(lambda: "CUDA: no device" in env.log(), 10, "the detection's log line")
    # No GPU work without a slot: the worker sees no device at all.
    assert _visible_of(c, "v") == "''"


def test_no_driver_at_all(env):
    env.environ["LL_CUDA_DRIVER"] = os.path.join(env.tmp, "nothing", "libcuda.so.1")
    c = env.client()
    st = c.stats()
    assert not st["cuda"] and "does not load" in st["gpus"]["why"], st["gpus"]
    assert _visible_of(c, "v") == "''"

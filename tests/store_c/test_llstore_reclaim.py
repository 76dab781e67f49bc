"""Superseded versions are reclaimed as soon as no reader can need them, and what a session holds (its
reserve included) counts against the user's cap (issue 23, part 3, item 4).

The reproduction: a "GPU cell" (a worker's Store) writes x, y, n = x + 1, y + 1, n + 1 over live state,
alternating with a "CPU cell" (the kernel's Store, the session's owner) that refreshes them, i.e. maps the
new version and drops the old one.  The pool's memory (the blocks its file holds) must stay near twice the
live state (the committed version, the one being written or still read, the reserve), not grow by a version
per round until the pool is full.  Each test starts its own private redis-server (the owner's)."""
import os
import struct
import time

import numpy as np
import pytest

import _llstore

R = _llstore.REGION_BYTES


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            return v
        time.sleep(0.02)


def pool_memory(st):
    """Bytes of memory the session's pool file holds (its allocated blocks: what /dev/shm or the memfd
    costs the host), read through the path other processes open it by."""
    return os.stat(st.stats()["pool_path"]).st_blocks * 512


@pytest.fixture
def owner(tmp_path, monkeypatch, session):
    monkeypatch.setenv("LL_STORE_LEDGER", str(tmp_path / "ledger"))
    monkeypatch.delenv("LL_STORE_USER_CAP", raising=False)
    d = str(tmp_path / "rt")
    st = _llstore.Store(d, session, pool_bytes=512 << 20)  # the kernel: owns redis and the pool
    yield st, d
    st.close()
    _llstore.stop_redis(d)


def test_alternating_cells_keep_the_pool_bounded(owner, session):
    kernel, d = owner
    worker = _llstore.Store(d, session, reserve_bytes=0)  # a worker saves into the kernel's pool
    try:
        sizes = {"x": 20 * R, "y": 15 * R, "n": 10 * R}  # 90 MiB of live state
        live = sum(sizes.values())
        vals = {k: np.zeros(v, np.uint8) for k, v in sizes.items()}

        def save(st, cell, base):
            refs = {}
            for k in vals:
                refs[k] = st.put_payload(vals[k], base=base.get(k))
                if st is worker:
                    time.sleep(0.3)  # a slow save (a device copy, pickling): the kernel's store idles meanwhile
            st.commit(cell, {k: (b"", [refs[k]], []) for k in vals})
            return {k: str(r) for k, r in refs.items()}

        refs = save(kernel, "c0", {})  # the CPU cell that made them
        held = {}  # what the kernel's namespace maps (a refresh keeps the new version mapped)
        peak = 0
        for rnd in range(8):
            for k in vals:  # the GPU cell: x + 1 changes every region
                vals[k] = vals[k] + 1
            refs = save(worker, "gpu%d" % rnd, refs)
            peak = max(peak, pool_memory(kernel))
            # The CPU cell refreshes: maps the new versions, drops the old mappings.
            entries = kernel.fetch(list(vals))
            new = {k: np.frombuffer(kernel.map_payload(e[2][0]), np.uint8) for k, e in entries.items()}
            for k in vals:
                assert new[k][0] == rnd + 1 and new[k][-1] == rnd + 1
            held = new
            peak = max(peak, pool_memory(kernel))
        # Let the kernel's idle reclaimer see the last refresh.
        wait_for(lambda: pool_memory(kernel) <= 2.5 * live, timeout=10)
        peak = max(peak, pool_memory(kernel))
        assert peak <= 2.5 * live, "pool held %d MiB for %d MiB of live state (%s)" % (
            peak >> 20, live >> 20, kernel.stats())
        # Nothing a reader holds was touched: the kernel's mappings still read the last version.
        for k in vals:
            assert np.array_equal(held[k], vals[k])
        # And the committed versions still restore through the worker.
        for k, (v, blob, prefs, _) in worker.fetch(list(vals)).items():
            assert np.array_equal(np.frombuffer(worker.map_payload(prefs[0]), np.uint8), vals[k])
    finally:
        worker.close()


def ledger_held(path):
    """Bytes the user's ledger (store/ll_quota.c) counts over every live pool: the header is magic, cap,
    source and five spare words; each entry is (pool id, regions, dev, ino, path[96])."""
    with open(path, "rb") as f:
        data = f.read()
    held = 0
    for off in range(64, len(data) - 127, 128):
        pool_id, regions = struct.unpack_from("<QQ", data, off)
        if pool_id:
            held += regions
    return held * R


def test_reserve_counts_against_the_users_cap(tmp_path, monkeypatch):
    """Many kernels of one user, each with its reserve: what their pools hold in memory is what the user's
    ledger counts, it stays within the cap (the reserves leave a quarter of it to saves), and each reserve
    starts small."""
    ledger = str(tmp_path / "ledger")
    monkeypatch.setenv("LL_STORE_LEDGER", ledger)
    monkeypatch.setenv("LL_STORE_USER_CAP", "64M")
    stores = []
    try:
        for i in range(6):
            d = str(tmp_path / ("rt%d" % i))
            stores.append((_llstore.Store(d, "k%d" % i, pool_bytes=256 << 20), d))
        first = stores[0][0]
        assert first.stats()["reserve_bytes"] <= 16 << 20  # starts small

        def settled():
            # every kernel's reserve prefaulted, or the reserves stopped at their share of the cap
            mem = sum(pool_memory(s) for s, _ in stores)
            full = all(s.stats()["reserve_ready_bytes"] >= s.stats()["reserve_bytes"] for s, _ in stores)
            return full or mem >= 48 << 20
        wait_for(settled, timeout=30)
        time.sleep(0.5)  # (a reserve still touching its last region)
        mem = sum(pool_memory(s) for s, _ in stores)
        held = ledger_held(ledger)
        assert mem <= held + 6 * R, (mem >> 20, held >> 20)  # the pools hold no memory the ledger misses
        assert held <= (64 << 20) - (16 << 20), held  # reserves leave a quarter of the cap to saves
        # A save fits: 8 MiB more than its pool's reserve, within the quarter left.
        a = np.ones(12 * R, np.uint8)
        ref = first.put_payload(a)
        first.commit("c1", {"a": (b"", [ref], [])})
        assert ledger_held(ledger) <= 64 << 20
        assert sum(pool_memory(s) for s, _ in stores) <= ledger_held(ledger) + 6 * R
    finally:
        for s, d in stores:
            s.close()
            _llstore.stop_redis(d)


def test_a_save_at_the_cap_gets_what_reserves_hold(tmp_path, monkeypatch):
    """Two kernels of one user under a 64 MiB cap (hostd's store-cap scenario): the first saves 40 MiB, and its
    reserve grows with that save; the second's 40 MiB do not fit (StoreQuotaExceeded) while the first's
    variable lives, however its reserve is sized; once the first deletes it, the space it held, reserve and
    freed space alike, is given back to the ledger and the second's save fits."""
    ledger = str(tmp_path / "ledger")
    monkeypatch.setenv("LL_STORE_LEDGER", ledger)
    monkeypatch.setenv("LL_STORE_USER_CAP", "64M")
    dirs = [str(tmp_path / "rt1"), str(tmp_path / "rt2")]
    k1 = _llstore.Store(dirs[0], "k1", pool_bytes=256 << 20)
    k2 = _llstore.Store(dirs[1], "k2", pool_bytes=256 << 20)
    try:
        x = np.ones(20 * R, np.uint8)
        k1.commit("c1", {"x": (b"", [k1.put_payload(x)], [])})
        wait_for(lambda: k1.stats()["reserve_bytes"] == 20 * R)  # follows the save...
        time.sleep(0.5)
        # ...but grows only within three quarters of the cap: the save and the second kernel's first 16 MiB
        # took more already
        assert ledger_held(ledger) <= (40 + 16) << 20
        with pytest.raises(_llstore.StoreQuotaExceeded):
            k2.put_payload(np.ones(20 * R, np.uint8))
        assert ledger_held(ledger) <= 40 << 20 + 2 * R  # the first kernel gave back its reserve meanwhile
        k1.commit("c2", {}, deletes=["x"])
        ref = k2.put_payload(np.ones(20 * R, np.uint8))  # the first kernel's idle hook gives the space back
        assert ref.nbytes == 20 * R
        assert ledger_held(ledger) <= 64 << 20
    finally:
        for st, d in ((k1, dirs[0]), (k2, dirs[1])):
            st.close()
            _llstore.stop_redis(d)

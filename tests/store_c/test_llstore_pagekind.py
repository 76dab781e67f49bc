"""The page kind of a new pool: LL_STORE_PAGE_KIND (auto | hugetlb | 4k), huge pages counted from the free
ones and the surplus room vm.nr_overcommit_hugepages allows, the fallback to 4 KiB pages when huge pages
counted as available do not come, a hugetlb memfd pool shared with another process through /proc/<pid>/fd,
and running out of surplus huge pages as a PoolFullError (never a SIGBUS).

The tests that need huge pages raise vm.nr_overcommit_hugepages for themselves (root) and put back the value
they found, whatever happens; without root they are skipped."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import _llstore
from llsc_helpers import child_env

R = _llstore.REGION_BYTES
OVERCOMMIT = "/proc/sys/vm/nr_overcommit_hugepages"
POOL = 64 << 20  # 32 regions, plus the header's region


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def free_huge_pages():
    return max(0, meminfo("HugePages_Free") - meminfo("HugePages_Rsvd"))


def overcommit_now():
    try:
        with open(OVERCOMMIT) as f:
            return int(f.read())
    except OSError:  # a kernel without hugetlb
        return 0


@pytest.fixture
def overcommit():
    """set(n_more): allow n_more surplus huge pages beyond those in use now; the old value comes back."""
    try:
        with open(OVERCOMMIT) as f:
            old = f.read().strip()
    except OSError as e:
        pytest.skip("no %s: %s" % (OVERCOMMIT, e))
    if not os.access(OVERCOMMIT, os.W_OK) or meminfo("Hugepagesize") != 2048:
        pytest.skip("needs root (writes %s) and 2 MiB huge pages" % OVERCOMMIT)

    def allow(n_more):
        with open(OVERCOMMIT, "w") as f:
            f.write(str(meminfo("HugePages_Surp") + n_more))

    try:
        yield allow
    finally:
        with open(OVERCOMMIT, "w") as f:
            f.write(old)


@pytest.fixture
def page_kind_env(monkeypatch):
    def set_kind(value):
        monkeypatch.setenv("LL_STORE_PAGE_KIND", value)
    monkeypatch.delenv("LL_STORE_PAGE_KIND", raising=False)
    monkeypatch.delenv("LL_STORE_FAULT", raising=False)
    return set_kind


def close(st):
    try:
        st.delete_session()
    finally:
        st.close()


def save(st, name, arr, cell="c"):
    st.commit(cell, {name: (b"blob-" + name.encode(), [st.put_payload(arr)], [])})


def load(st, name):
    (v, blob, prefs, refs), = st.fetch([name]).values()
    return np.frombuffer(st.map_payload(prefs[0]), dtype=np.uint8)


def _round_trip_on_4k_pages(st, nbytes):
    """ST's pool is a /dev/shm file on 4 KiB pages and an array of NBYTES survives a save and a load; closes ST.
    (The session owner's pool has no name any more (issue 16): it is reached as /proc/<pid>/fd/<n>.)"""
    try:
        s = st.stats()
        where = os.readlink(s["pool_path"]) if s["pool_path"].startswith("/proc/") else s["pool_path"]
        assert s["page_kind"] == "4k" and where.startswith("/dev/shm/"), s
        a = np.arange(nbytes, dtype=np.uint8)
        save(st, "a", a)
        assert np.array_equal(load(st, "a"), a)
    finally:
        close(st)


def test_knob_4k_and_bad_values(runtime_dir, session, page_kind_env):
    page_kind_env("4k")
    assert _llstore.page_kind_choice(POOL)[0] == "4k"
    _round_trip_on_4k_pages(_llstore.Store(runtime_dir, session, pool_bytes=POOL), 3 * R)  # the owner: it starts redis
    page_kind_env("huge")
    with pytest.raises(_llstore.StoreError, match="LL_STORE_PAGE_KIND must be auto, hugetlb or 4k, not 'huge'"):
        _llstore.page_kind_choice(POOL)
    with pytest.raises(_llstore.StoreError, match="LL_STORE_PAGE_KIND must be"):
        _llstore.Store(runtime_dir, session + "b", pool_bytes=POOL)


def test_choice_reports_what_the_host_offers(page_kind_env):
    kind, why = _llstore.page_kind_choice(POOL)
    over = overcommit_now()
    room = free_huge_pages() + max(0, over - meminfo("HugePages_Surp"))
    assert "vm.nr_overcommit_hugepages %d" % over in why
    if meminfo("Hugepagesize") == 2048 and room >= POOL // R + 8:
        assert kind == "hugetlb", why
    elif room < POOL // R and kind == "hugetlb":
        pytest.fail("hugetlb chosen with %d huge pages available: %s" % (room, why))
    # A process other than the session's owner never makes a memfd (it would die with it).
    kind2, why2 = _llstore.page_kind_choice(POOL, owner=False)
    assert kind2 in ("4k", "thp", "hugetlb") and (kind2 != "hugetlb" or "hugetlbfs mount" in why2)


def test_forced_hugetlb_without_huge_pages_is_a_clear_error(runtime_dir, session, page_kind_env):
    room = free_huge_pages() + max(0, overcommit_now() - meminfo("HugePages_Surp"))
    if room > 0:
        pytest.skip("this host has %d huge pages to give" % room)
    page_kind_env("hugetlb")
    # (no space for the pool's header; or no hugetlb memfd at all on a kernel without hugetlb)
    with pytest.raises(_llstore.StoreError, match="memfd:hugetlb.*(No space left on device|Invalid argument)"):
        _llstore.Store(runtime_dir, session, pool_bytes=POOL)
    page_kind_env("auto")
    st = _llstore.Store(runtime_dir, session + "b", pool_bytes=POOL)
    try:
        assert st.stats()["page_kind"] in ("4k", "thp")
    finally:
        close(st)


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import _llstore
    st = _llstore.Store(sys.argv[1], sys.argv[2], reserve_bytes=0)
    s = st.stats()
    assert s["page_kind"] == "hugetlb" and s["pool_path"] == sys.argv[3], s
    (v, blob, prefs, refs), = st.fetch(["a"]).values()
    got = np.frombuffer(st.map_payload(prefs[0]), dtype=np.uint8)
    assert np.array_equal(got, np.arange(got.size, dtype=np.uint8) * 3), "wrong bytes"
    b = np.full(_llstore.REGION_BYTES, 9, np.uint8)
    st.commit("child", {"b": (b"b", [st.put_payload(b)], [])})
    st.close()
    print("child ok")
""")


RESTORE_WRITABLE = textwrap.dedent("""
    import sys
    import numpy as np
    import _llstore
    st = _llstore.Store(sys.argv[1], sys.argv[2], reserve_bytes=0)
    (v, blob, prefs, refs), = st.fetch(["a"]).values()
    w = np.frombuffer(st.map_payload(prefs[0], writable=True), dtype=np.uint8)
    assert np.array_equal(w, np.arange(w.size, dtype=np.uint8) * 3), "wrong bytes"
    w[:] = 7
    del w
    st.close()
    print("restored")
""")


def test_surplus_huge_pages_make_a_shared_hugetlb_pool(runtime_dir, session, overcommit, page_kind_env):
    overcommit(POOL // R + 8)  # the pool, its header and some slack: surplus only, nothing reserved
    kind, why = _llstore.page_kind_choice(POOL)
    assert kind == "hugetlb" and "hugetlb (memfd)" in why, why
    surp0 = meminfo("HugePages_Surp")
    st = _llstore.Store(runtime_dir, session, pool_bytes=POOL, reserve_bytes=0)
    try:
        s = st.stats()
        assert s["page_kind"] == "hugetlb" and s["pool_path"].startswith("/proc/%d/fd/" % os.getpid()), s
        a = np.arange(4 * R, dtype=np.uint8) * 3
        save(st, "a", a)
        assert meminfo("HugePages_Surp") >= surp0 + 5  # header + 4 regions, taken as surplus pages
        # Another process of the session (a worker) opens the same pool through /proc/<pid>/fd, even with
        # LL_STORE_PAGE_KIND=hugetlb in its environment (it makes no pool, so it needs no memfd of its own).
        r = subprocess.run([sys.executable, "-c", CHILD, runtime_dir, session, s["pool_path"]],
                           env=child_env(LL_STORE_PAGE_KIND="hugetlb"), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "child ok" in r.stdout, r.stdout + r.stderr
        assert np.array_equal(load(st, "b"), np.full(R, 9, np.uint8))
        # No surplus room left: a save that needs new huge pages is a PoolFullError, the old versions stay.
        overcommit(0)
        with pytest.raises(_llstore.PoolFullError, match="No space left on device.*no more huge pages"):
            st.put_payload(np.ones(8 * R, np.uint8))
        assert sorted(st.versions()) == ["a", "b"]
        assert np.array_equal(load(st, "a"), a)
        # A private copy-on-write mapping (how a worker restores) would need huge pages reserved for its
        # copies; with none left, restoring committed bytes still works (a private copy), here and in
        # another process, and writes stay private.
        (v, blob, prefs, refs), = st.fetch(["a"]).values()
        w = np.frombuffer(st.map_payload(prefs[0], writable=True), dtype=np.uint8)
        assert np.array_equal(w, a)
        w[0] ^= 1
        assert np.array_equal(load(st, "a"), a)
        r = subprocess.run([sys.executable, "-c", RESTORE_WRITABLE, runtime_dir, session],
                           env=child_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "restored" in r.stdout, r.stdout + r.stderr
        del w
        overcommit(8)
        w = np.frombuffer(st.map_payload(prefs[0], writable=True), dtype=np.uint8)
        w[0] ^= 1
        assert np.array_equal(load(st, "a"), a)
    finally:
        close(st)


def test_auto_falls_back_to_4k_when_huge_pages_do_not_come(runtime_dir, session, overcommit, page_kind_env,
                                                          monkeypatch):
    overcommit(POOL // R + 8)
    assert _llstore.page_kind_choice(POOL)[0] == "hugetlb"
    # Counted as available, yet the pool cannot get them (simulated: the memory could be too fragmented).
    monkeypatch.setenv("LL_STORE_FAULT", "hugetlb_fail")
    _round_trip_on_4k_pages(_llstore.Store(runtime_dir, session, pool_bytes=POOL, reserve_bytes=0), 2 * R)
    # Forced hugetlb has no fallback: the same failure is an error.
    page_kind_env("hugetlb")
    monkeypatch.delenv("LL_STORE_FAULT")
    overcommit(0)
    if free_huge_pages() == 0:
        with pytest.raises(_llstore.StoreError, match="No space left on device"):
            _llstore.Store(runtime_dir, session + "b", pool_bytes=POOL)

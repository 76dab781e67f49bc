"""Several processes at once on one small pool: writers commit cells that write `a` and `b`
together and reclaim eagerly, readers fetch both, map their payloads and keep the mappings
while the pool churns.  Nothing may tear (a and b from different cells), and mapped bytes may
never change or belong to another version: regions are reused all the time, so a mistake in
leases, generations or reclamation shows up here as a wrong byte."""
import subprocess
import sys

import _llstore
from llsc_helpers import child_env

R = _llstore.REGION_BYTES

WRITER = r"""
import sys, time, numpy as np, _llstore
rd, session, url, pool, wid, seconds = sys.argv[1:7]
st = _llstore.Store(rd, session, redis_url=url, pool_path=pool)
R = _llstore.REGION_BYTES
end = time.monotonic() + float(seconds)
n = 0
full = 0
while time.monotonic() < end:
    n += 1
    fill = (int(wid) * 97 + n) % 251 + 1
    blob = bytes([fill]) * 8
    ra = None
    try:
        ra = st.put_payload(np.full(2 * R + 100 * n % R, fill, np.uint8))
        rb = st.put_payload(np.full(R + 7, fill, np.uint8))
    except _llstore.PoolFullError:
        if ra is not None:
            st.discard(ra)
        full += 1
        time.sleep(0.001)  # the readers hold the pool; let them move on
        continue
    st.commit("w%s-%d" % (wid, n), {"a": (blob, [ra], ["b"]), "b": (blob, [rb], [])})
    if n % 3 == 0:
        st.gc()
print("commits", n - full, "full", full, flush=True)
"""

READER = r"""
import sys, time, numpy as np, _llstore
rd, session, url, pool, seconds = sys.argv[1:6]
st = _llstore.Store(rd, session, redis_url=url, pool_path=pool)
end = time.monotonic() + float(seconds)
held = []
reads = gone = 0
while time.monotonic() < end:
    got = st.fetch(["a", "b"])
    if len(got) < 2:
        continue
    (va, ba, pa, _), (vb, bb, pb, _) = got["a"], got["b"]
    assert va == vb and ba == bb, ("torn", got)
    try:
        views = [np.frombuffer(st.map_payload(p), np.uint8) for p in (pa[0], pb[0])]
    except _llstore.PayloadGoneError:
        gone += 1          # superseded and reclaimed between fetch and map: allowed
        continue
    for v in views:
        assert (v == ba[0]).all(), "mapped bytes of another version"
    held.append((ba[0], views))
    if len(held) > 2:
        fill, vs = held.pop(0)
        for v in vs:
            assert (v == fill).all(), "bytes changed under a mapping"
    reads += 1
for fill, vs in held:
    for v in vs:
        assert (v == fill).all(), "bytes changed under a mapping"
print("reads", reads, "gone", gone, flush=True)
"""


def test_concurrent_writers_readers_and_reclamation(runtime_dir, redis_url, session, pool_path):
    # 48 regions: readers hold up to 3 versions each, a version takes 5 regions, so the
    # pool is nearly always full: reclamation and region reuse never stop
    st = _llstore.Store(runtime_dir, session, redis_url=redis_url, pool_path=pool_path,
                        pool_bytes=48 * R)
    try:
        args = [runtime_dir, session, redis_url, pool_path]
        procs = [subprocess.Popen([sys.executable, "-c", WRITER] + args + [str(w), "4"],
                                  env=child_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for w in range(2)]
        procs += [subprocess.Popen([sys.executable, "-c", READER] + args + ["4"],
                                   env=child_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-2000:]
        commits = sum(int(o.split()[1]) for o, _ in outs[:2])
        reads = sum(int(o.split()[1]) for o, _ in outs[2:])
        assert commits >= 10 and reads >= 10, outs
        # afterwards: everything but the current version is reclaimable
        st.gc()
        assert st.stats()["regions_used"] <= 6
        (va, ba, pa, _), = st.fetch(["a"]).values()
        assert (bytes(st.map_payload(pa[0])) == ba[:1] * _llstore.ref_nbytes(pa[0]))
    finally:
        st.delete_session()
        st.close()

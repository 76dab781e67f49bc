"""The user's cap on store memory (ll_quota; hostd/API.md, "Store cap"): two sessions of one user (two pools,
as two kernels have) count in one ledger, and a put that would take the user past the cap fails with
StoreQuotaExceeded (a PoolFullError) saying who may hold how much, what the put needs and what is held;
nothing of it stays held; once the other session frees its space the put fits."""
import numpy as np
import pytest

import _llstore

R = _llstore.REGION_BYTES


@pytest.fixture
def two_sessions(runtime_dir, redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("LL_STORE_LEDGER", str(tmp_path / "ledger"))
    monkeypatch.setenv("LL_STORE_USER_CAP", "16M")
    stores = [_llstore.Store(runtime_dir, s, redis_url=redis_url, pool_bytes=64 << 20,
                             pool_path=str(tmp_path / ("%s.pool" % s)), reserve_bytes=0) for s in ("qa", "qb")]
    yield stores
    for st in stores:
        st.delete_session()
        st.close()


def test_cap_covers_every_pool_of_the_user(two_sessions):
    a, b = two_sessions
    a.commit("c1", {"x": (b"x", [a.put_payload(np.ones(5 * R, np.uint8))], [])})  # 10 MiB of 16
    with pytest.raises(_llstore.StoreQuotaExceeded) as e:
        b.put_payload(np.ones(5 * R, np.uint8))
    assert isinstance(e.value, _llstore.PoolFullError)
    msg = str(e.value)
    assert " may hold 16 MiB in the checkpoint store (LL_STORE_USER_CAP); a payload of 10 MiB needs 10 MiB " \
           "more, 10 MiB held; delete variables or ask the administrator" in msg, msg
    assert b.stats()["regions_used"] == 0  # nothing half-written stays held
    b.commit("c1", {"y": (b"y", [b.put_payload(np.ones(3 * R, np.uint8))], [])})  # 6 MiB still fit
    with pytest.raises(_llstore.StoreQuotaExceeded):
        b.put_payload(np.ones(R, np.uint8))
    # Space the other session gives back counts at once.
    a.commit("c2", {}, deletes=["x"])
    a.gc()
    ref = b.put_payload(np.ones(5 * R, np.uint8))
    assert ref.nbytes == 5 * R

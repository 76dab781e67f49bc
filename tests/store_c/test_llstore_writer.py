"""Store.payload_writer: a payload written in pieces (store/API.md), the path device memory takes through a pair
of staging buffers (looseleaf_store/devsave.py).  Same results as put_payload: fresh regions for what is
written, the base's shared for what is not, a written region equal to the base's shared after all."""
import numpy as np
import pytest

import _llstore

R = _llstore.REGION_BYTES


def _data(nbytes, seed=0):
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _write_all(w, data, regions, per=2):
    """Write REGIONS of DATA through W in groups of PER regions, back to back in one buffer each."""
    for g in range(0, len(regions), per):
        group = regions[g:g + per]
        buf = np.zeros(per * R, dtype=np.uint8)
        for k, i in enumerate(group):
            piece = data[i * R:(i + 1) * R]
            buf[k * R:k * R + len(piece)] = piece
        w.write(group, buf)


def test_pieces_in_any_order_make_the_payload(store):
    data = _data(5 * R + 1234)
    w = store.payload_writer(len(data))
    assert w.needed == [0, 1, 2, 3, 4, 5]
    _write_all(w, data, [4, 1, 5, 0, 3, 2])
    assert w.needed == []
    ref = w.finish()
    assert ref.nbytes == len(data) and ref.written == len(data)
    assert bytes(store.map_payload(ref)) == data.tobytes()


def test_with_a_base_only_the_dirty_regions_are_written(store):
    data = _data(6 * R)
    base = store.put_payload(data)
    new = data.copy()
    new[2 * R + 7] ^= 0xFF
    new[5 * R] ^= 1
    w = store.payload_writer(len(new), base=base, dirty=[2, 5])
    assert w.needed == [2, 5]
    _write_all(w, new, [2, 5])
    ref = w.finish()
    assert ref.written == 2 * R
    assert bytes(store.map_payload(ref)) == new.tobytes()
    # A region named dirty whose bytes did not change is shared after all.
    w = store.payload_writer(len(new), base=ref, dirty=[0, 3])
    _write_all(w, new, w.needed)
    same = w.finish()
    assert same.written == 0 and bytes(store.map_payload(same)) == new.tobytes()
    # Without dirty every region is written and compared.
    w = store.payload_writer(len(new), base=ref)
    assert w.needed == list(range(6))
    _write_all(w, new, w.needed)
    assert w.finish().written == 0


def test_misuse_is_refused(store):
    data = _data(3 * R)
    w = store.payload_writer(len(data))
    with pytest.raises(ValueError, match="still needs written"):
        w.write([7], np.zeros(R, dtype=np.uint8))
    with pytest.raises(ValueError, match="holds no region"):
        w.write([0, 1], np.zeros(R, dtype=np.uint8))
    w.write([0], data[:R])
    with pytest.raises(ValueError, match="still needs written"):
        w.write([0], data[:R])  # written already
    with pytest.raises(_llstore.StoreError, match="still open"):
        store.close()
    with pytest.raises(ValueError, match="never written"):
        w.finish()
    with pytest.raises(ValueError, match="finished"):
        w.write([1], data[R:2 * R])
    with pytest.raises(ValueError, match="dirty needs a base"):
        store.payload_writer(10, dirty=[0])


def test_abort_gives_the_space_back(store):
    used = store.stats()["regions_used"]
    w = store.payload_writer(4 * R)
    assert store.stats()["regions_used"] >= used + 4
    w.write([0], _data(R))
    w.abort()
    w.abort()  # idempotent
    assert store.stats()["regions_used"] == used
    # Dropping an unfinished writer aborts it too.
    w = store.payload_writer(2 * R)
    del w
    assert store.stats()["regions_used"] == used


def test_a_full_pool_is_a_pool_full_error(store):
    with pytest.raises(_llstore.PoolFullError):
        store.payload_writer(store.stats()["pool_bytes"] + R)


def test_a_committed_writer_payload_restores(store):
    data = _data(2 * R + 10)
    w = store.payload_writer(len(data))
    _write_all(w, data, w.needed)
    ref = w.finish()
    store.commit("c", {"v": (b"blob", [ref], [])})
    e = store.fetch(["v"])["v"]
    assert bytes(store.map_payload(e[2][0])) == data.tobytes()

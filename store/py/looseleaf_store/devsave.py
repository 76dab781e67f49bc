"""looseleaf_store.devsave: payloads of device memory (the storages of CUDA tensors), saved and restored through
a pair of fixed pinned staging buffers, and saved incrementally by hashing on the device.

Runs in GPU workers (and, for its tests, in any process on CPU tensors), on the thread that runs cells, called
by checkpoint.Checkpointer; not thread-safe (the staging buffers are the process's).

Save of a storage (a 1-D uint8 view U of n bytes on its device), against BASE, the payload it was last saved as
or restored from:
  1. synchronize() the device: the cell's kernels may still be writing it;
  2. hash every 2 MiB region on the device (region_hashes: one int64 per region, torch operations over chunks of
     _HASH_CHUNK regions, so the pass costs device bandwidth and a bounded temporary, never a copy to the host);
  3. compare with BASE's hashes, kept per payload ref by the caller (Hashes): the changed regions are the dirty
     ones; none changed means the base again, nothing copied (save returns None);
  4. a payload writer (_llstore.PayloadWriter, store/API.md) of the base with those regions; the regions it
     needs (the dirty ones, and any the base lost meanwhile) go through the staging pair: the device copies a
     group of regions into one buffer while the store copies the group before it from the other into the pool
     (on its own threads, GIL released), so the transfer and the pool's copy overlap.
  Without BASE's hashes (first save, a payload restored before this process hashed it) every region goes, and
  the store shares the ones whose host hash matches the base.
Restore (to_device) copies a mapped payload to the device through the same pair, then hashes it there, so an
unchanged restored tensor is saved again without a byte moving.

Why a fixed pair: one pinned buffer sized to the largest storage (what saves did before) is as big as the
biggest tensor, and torch's caching host allocator rounds it up and keeps it for the process's life.

The hash: each 32-bit word w at position i of a region maps to mix(w * P[i]) (P: odd pseudo-random 64-bit
constants, mix: xor-shift and multiply), summed modulo 2**64.  A change of one word always changes the sum (P[i]
odd), and changes of several words are pseudo-random sums of mixed terms, so the chance of an unchanged sum is
about 2**-64 per region; a plain linear sum would miss, for instance, two sign flips of float64 values.  The
same code runs on the CPU (where the tests run it) and on CUDA.
"""
import sys

import numpy as np

REGION = 2 << 20                # the store's region (_llstore.REGION_BYTES)
_WORDS = REGION // 4
_HASH_CHUNK = 16                # regions hashed per step: a 32 MiB slice, 128 MiB of int64 temporaries
_STAGE_REGIONS = 32             # regions per staging buffer: 2 x 64 MiB pinned
_M1 = 0x2545F4914F6CDD1D        # odd multipliers of the mix
_M2 = 0x1B873593A3B2C5D7 & ((1 << 63) - 1) | 1

_constants = {}                 # device -> P (int64 tensor of _WORDS odd values on that device)
_staging = None                 # the process's staging pair (_Staging)


def _p(torch, device):
    p = _constants.get(str(device))
    if p is None:
        g = torch.Generator().manual_seed(0x5EED1EAF)
        p = torch.randint(-(1 << 62), 1 << 62, (_WORDS,), dtype=torch.int64, generator=g).bitwise_or_(1)
        p = _constants[str(device)] = p.to(device)
    return p


def _mixed_sums(torch, words, p):
    """(k, w) int32 WORDS -> k int64 sums of mix(word * P)."""
    v = words.to(torch.int64)
    v.mul_(p[:v.shape[1]])
    v.bitwise_xor_(v >> 29)
    v.mul_(_M1)
    v.bitwise_xor_(v >> 32)
    v.mul_(_M2)
    return v.sum(dim=1)


def region_hashes(torch, u):
    """One int64 per 2 MiB region of the 1-D uint8 tensor U, computed where U lives."""
    n = u.numel()
    nreg = -(-n // REGION)
    out = torch.empty(nreg, dtype=torch.int64, device=u.device)
    if n == 0:
        return out
    p = _p(torch, u.device)
    full = n // REGION
    for c0 in range(0, full, _HASH_CHUNK):
        c1 = min(full, c0 + _HASH_CHUNK)
        out[c0:c1] = _mixed_sums(torch, u[c0 * REGION:c1 * REGION].view(torch.int32).view(c1 - c0, _WORDS), p)
    if n % REGION:
        tail = u[full * REGION:]
        padded = torch.zeros(-(-tail.numel() // 4) * 4, dtype=torch.uint8, device=u.device)
        padded[:tail.numel()] = tail
        out[full] = _mixed_sums(torch, padded.view(torch.int32).view(1, -1), p)[0]
    return out


class Hashes:
    """Device hashes of payloads, by ref: what a storage's save compares with.  Kept only for the refs the
    caller still uses (keep())."""

    def __init__(self):
        self._by_ref = {}

    def get(self, ref, nbytes):
        h = self._by_ref.get(str(ref)) if ref is not None else None
        return h if h is not None and h[0] == nbytes else None

    def put(self, ref, nbytes, hashes):
        self._by_ref[str(ref)] = (nbytes, hashes)

    def keep(self, refs):
        """Forget every ref but REFS."""
        refs = {str(r) for r in refs}
        for r in [r for r in self._by_ref if r not in refs]:
            del self._by_ref[r]

    def __len__(self):
        return len(self._by_ref)


class _Staging:
    """Two host buffers of _STAGE_REGIONS regions each, pinned when the device is a CUDA one."""

    def __init__(self, torch, pinned):
        self.pinned = pinned
        self.bufs = [torch.empty(_STAGE_REGIONS * REGION, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        self.arrays = [b.numpy() for b in self.bufs]


def staging(torch, device):
    """The process's staging pair (made at the first use; pinned once a CUDA device uses it)."""
    global _staging
    cuda = device.type == "cuda"
    if _staging is None or (cuda and not _staging.pinned):
        _staging = _Staging(torch, cuda)
    return _staging


def _runs(regions):
    """Consecutive runs in the sorted REGIONS, as (first, count)."""
    out = []
    for i in regions:
        if out and out[-1][0] + out[-1][1] == i:
            out[-1][1] += 1
        else:
            out.append([i, 1])
    return out


class _Stream:
    """Where the staging copies run: a side stream of a CUDA device (ordered after its current stream), or
    nothing on the CPU (copies are synchronous there)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.stream = None
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.stream.wait_stream(torch.cuda.current_stream(device))

    def copy(self, dst, src):
        """DST.copy_(SRC) on the stream; returns what to wait on (None: done)."""
        if not self.cuda:
            dst.copy_(src)
            return None
        with self.torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            ev = self.torch.cuda.Event()
            ev.record(self.stream)
        return ev


def _copy_out(torch, u, regions, writer):
    """Regions REGIONS (sorted) of device memory U into WRITER, through the staging pair: group k + 1 moves
    to the host while the store copies group k into the pool."""
    n = u.numel()
    st = staging(torch, u.device)
    groups = [regions[i:i + _STAGE_REGIONS] for i in range(0, len(regions), _STAGE_REGIONS)]
    stream = _Stream(torch, u.device)
    pending = [None, None]

    def issue(k, group):
        buf, ev, off = st.bufs[k], None, 0
        for first, count in _runs(group):
            a, b = first * REGION, min(n, (first + count) * REGION)
            ev = stream.copy(buf[off:off + b - a], u[a:b])
            off += count * REGION
        pending[k] = (group, ev)

    for k in range(min(2, len(groups))):
        issue(k, groups[k])
    for gi in range(len(groups)):
        k = gi % 2
        group, ev = pending[k]
        if ev is not None:
            ev.synchronize()
        writer.write(group, st.arrays[k])
        if gi + 2 < len(groups):
            issue(k, groups[gi + 2])


def save(torch, store, u, base, hashes):
    """Put the storage bytes U (1-D uint8, on its device) against BASE (a ref, or None), comparing with the
    device hashes HASHES (Hashes) keeps for BASE.  Returns (PayloadRef, or None when no region changed and BASE
    stands; the new hashes, to record under whichever ref the caller commits, or None when the device had no
    room to compute them)."""
    if u.device.type == "cuda":
        torch.cuda.synchronize(u.device)
    n = u.numel()
    try:
        h = region_hashes(torch, u)
    except RuntimeError:  # out of device memory for the temporaries: every region goes, compared on the host
        h = None
    old = hashes.get(base, n) if h is not None else None
    if old is not None:
        old = old[1].to(h.device)
        dirty = (h != old).nonzero().flatten().tolist()
        if not dirty:
            return None, h
        w = store.payload_writer(n, base=base, dirty=dirty)
    else:
        w = store.payload_writer(n, base=base)
    try:
        _copy_out(torch, u, w.needed, w)
        return w.finish(), h
    except BaseException:
        w.abort()
        raise


def to_device(torch, src, device):
    """The mapped payload SRC (a 1-D uint8 numpy array or CPU tensor) copied to DEVICE through the staging
    pair: the host copies a piece out of the (pageable, shared) pool mapping into one buffer while the device
    takes the other.  Returns the device's uint8 tensor."""
    if isinstance(src, np.ndarray):
        src = torch.from_numpy(src)
    n = src.numel()
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    if n == 0:
        return dev
    st = staging(torch, dev.device)
    stream = _Stream(torch, dev.device)
    size = _STAGE_REGIONS * REGION
    done = [None, None]
    for i, off in enumerate(range(0, n, size)):
        k = i % 2
        m = min(size, n - off)
        if done[k] is not None:
            done[k].synchronize()  # the device has taken what this buffer held
        st.bufs[k][:m].copy_(src[off:off + m])
        done[k] = stream.copy(dev[off:off + m], st.bufs[k][:m])
    for ev in done:
        if ev is not None:
            ev.synchronize()
    return dev


def is_device_payload(obj):
    """Whether payload OBJ (a storage) lives on a device, or is a CPU storage the tests send this way
    (LL_STORE_DEVSAVE=cpu)."""
    dev = getattr(obj, "device", None)
    if dev is None:
        return False
    if dev.type != "cpu":
        return True
    import os
    return os.environ.get("LL_STORE_DEVSAVE") == "cpu"


def _torch():
    return sys.modules.get("torch") or __import__("torch")

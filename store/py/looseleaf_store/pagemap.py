"""looseleaf_store.pagemap: has this process written to a restored payload since it was mapped?

Runs in the saving process.  A restored payload is a private copy-on-write mapping of the pool
(`map_payload(ref, writable=True)`).  A page the process never wrote is either not present or still the
pool file's page; a page it wrote is a present *anonymous* page.  /proc/self/pagemap says which (bit 63
present, bit 62 swapped, bit 61 file-page/shared-anon), 8 bytes per 4 KiB page, so checking 1 GiB reads
2 MiB of pagemap instead of hashing 1 GiB.  Only ever trusted for a range that is known to be such a
mapping (the Checkpointer keeps the mapping alive while it asks); any doubt answers "dirty", which costs
a hash, never correctness.
"""
import os

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")
_fd = None


def _pagemap_fd():
    global _fd
    if _fd is None:
        try:
            _fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _fd = -1
    return _fd


def reset_after_fork():
    """A forked child must read its own pagemap, not its parent's."""
    global _fd
    _fd = None


os.register_at_fork(after_in_child=reset_after_fork)


def written_regions(addr, nbytes, region_bytes):
    """Indices of the REGION_BYTES-sized regions of [addr, addr+nbytes) (a private file mapping starting
    at ADDR) that hold a page this process wrote, or None if that cannot be told."""
    if nbytes <= 0:
        return []
    fd = _pagemap_fd()
    if fd < 0 or addr % _PAGE or region_bytes % _PAGE:
        return None
    per = region_bytes // _PAGE
    p0 = addr // _PAGE
    npages = (nbytes + _PAGE - 1) // _PAGE
    out = []
    chunk = per * max(1, (1 << 18) // per)
    try:
        for a in range(0, npages, chunk):
            n = min(chunk, npages - a)
            raw = os.pread(fd, n * 8, (p0 + a) * 8)
            if len(raw) != n * 8:
                return None
            hi = (np.frombuffer(raw, dtype=np.uint64) >> np.uint64(61)).astype(np.uint8)
            w = ((hi & 6) != 0) & ((hi & 1) == 0)
            if not w.any():
                continue
            idx = np.nonzero(w)[0] // per + a // per
            out.extend(np.unique(idx).tolist())
    except OSError:
        return None
    return out

"""looseleaf_store.pagemap: has this process written to a restored payload since it was mapped?

Runs in the saving process.  A restored payload is a private copy-on-write mapping of the pool
(`map_payload(ref, writable=True)`).  A page the process never wrote is either not present or still the
pool file's page; a page it wrote is a present *anonymous* page.  /proc/self/pagemap says which (bit 63
present, bit 62 swapped, bit 61 file-page/shared-anon), 8 bytes per 4 KiB page, so checking 1 GiB reads
2 MiB of pagemap instead of hashing 1 GiB.  Only ever trusted for a range that is known to be such a
mapping (the Checkpointer keeps the mapping alive while it asks); any doubt answers "dirty", which costs
a hash, never correctness.

Where the kernel has the PAGEMAP_SCAN ioctl (Linux >= 6.7) the kernel itself returns just the ranges of
present-or-swapped non-file pages (about 1 ms for 1 GiB); otherwise the 8-byte entries are read and
tested here.
"""
import ctypes
import fcntl
import os
import struct

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")
_fd = None
_scan_ok = True  # PAGEMAP_SCAN works here (cleared at the first EINVAL/ENOTTY)

_PAGEMAP_SCAN = (3 << 30) | (96 << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, struct pm_scan_arg)
_PAGE_IS_FILE = 1 << 2
_PAGE_IS_PRESENT = 1 << 3
_PAGE_IS_SWAPPED = 1 << 4
VEC_LEN = 4096  # page ranges per PAGEMAP_SCAN call (a scan_regions buffer holds 3 * VEC_LEN uint64)
_vec = (ctypes.c_uint64 * (3 * VEC_LEN))()  # struct page_region {start, end, categories}


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


def scan_regions(fd, addr, start, end, region_bytes, flags, masks, vec):
    """The PAGEMAP_SCAN ioctl on pagemap FD over [START, END), as many calls as the VEC buffer (a ctypes
    array of 3 * VEC_LEN uint64: struct page_region) needs: the set of REGION_BYTES-sized region indices,
    counted from ADDR, holding a page it matched.  FLAGS and MASKS (category_inverted, category_mask,
    category_anyof_mask, return_mask) are the ioctl's.  OSError from the ioctl goes to the caller."""
    out = set()
    pos = start
    while pos < end:
        arg = bytearray(struct.pack("12Q", 96, flags, pos, end, 0, ctypes.addressof(vec), VEC_LEN, 0,
                                    *masks))
        n = fcntl.ioctl(fd, _PAGEMAP_SCAN, arg)
        for i in range(n):
            a, b = vec[3 * i], vec[3 * i + 1]
            out.update(range((a - addr) // region_bytes, (b - 1 - addr) // region_bytes + 1))
        walk_end = struct.unpack_from("Q", arg, 32)[0]
        if n < VEC_LEN or walk_end >= end:
            break
        pos = walk_end
    return out


def _scan(fd, addr, nbytes, region_bytes):
    """written_regions through PAGEMAP_SCAN; None if the ioctl is not there."""
    global _scan_ok
    end = addr + (nbytes + _PAGE - 1) // _PAGE * _PAGE
    try:
        # pages that are NOT file pages and are present or swapped: the ones this process wrote
        return sorted(scan_regions(fd, addr, addr, end, region_bytes, 0,
                                   (_PAGE_IS_FILE, _PAGE_IS_FILE, _PAGE_IS_PRESENT | _PAGE_IS_SWAPPED,
                                    _PAGE_IS_PRESENT), _vec))
    except OSError:
        _scan_ok = False
        return None


def written_regions(addr, nbytes, region_bytes):
    """Indices of the REGION_BYTES-sized regions of [addr, addr+nbytes) (a private file mapping starting
    at ADDR) that hold a page this process wrote, or None if that cannot be told."""
    if nbytes <= 0:
        return []
    fd = _pagemap_fd()
    if fd < 0 or addr % _PAGE or region_bytes % _PAGE:
        return None
    if _scan_ok:
        r = _scan(fd, addr, nbytes, region_bytes)
        if r is not None:
            return r
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

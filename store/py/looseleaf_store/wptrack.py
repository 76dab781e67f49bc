"""looseleaf_store.wptrack: which pages of this process's own big buffers were written since the last save.

Runs in the saving process (kernel interpreter or worker), on the cell thread, called by the Checkpointer.
An unchanged 1 GiB array would otherwise be hashed on every save (~60-150 ms here); with this, the save
asks the kernel which pages were written since the array was last committed (microseconds) and hands only
those 2 MiB regions to put_payload(dirty=...).

How: userfaultfd in asynchronous write-protect mode (UFFD_FEATURE_WP_ASYNC, Linux >= 6.7): pages of a
registered range are write-protected when armed; the first write to a page is resolved by the kernel
itself (no handler thread, a minor fault) and leaves the page "written"; the PAGEMAP_SCAN ioctl on
/proc/self/pagemap lists written pages and re-protects them in the same step (PM_SCAN_WP_MATCHING).
Writes by the kernel on our behalf (read(2) into the buffer, O_DIRECT, process_vm_writev) fault the same
way.  Soft-dirty bits would do the same job but this kernel has no CONFIG_MEM_SOFT_DIRTY.

What must stay true (the Checkpointer guarantees it):
* Only private anonymous memory is tracked (checked in /proc/self/maps before arming): another process
  may write shared memory (shm, memfd, a pool mapping) without faulting here.  Pinned memory (CUDA DMA
  writes without faults) is never offered.
* A range is trusted only while the object that owns its memory is alive and unchanged (same address and
  size); freed memory could come back zeroed without a write.
* Regions holding a partial page at either end of a buffer (other data shares those pages) are always
  reported written.
* A scan re-protects what it reports, so every consumer of a range (a Subscription: one payload slot of
  one Checkpointer) gets what a scan finds added to its own `dirty` set, which only that consumer clears,
  and only of the regions its committed save covered.  Arming a range that is already tracked harvests
  first.  So two Checkpointers tracking one array, or a save that fails, never lose a write.
Anything unexpected (old kernel, no userfaultfd permission, an ioctl error) makes `available()` false or
a scan return None, and the caller hashes every region as before.  LL_STORE_WPTRACK=0 turns it off.

Limit: a write that takes no page fault is not seen: DMA into memory pinned earlier (cudaHostRegister of
a numpy array, RDMA registration, io_uring fixed buffers).  torch's pinned tensors are never tracked;
code that pins numpy memory for DMA must run with LL_STORE_WPTRACK=0.
"""
import ctypes
import fcntl
import os
import struct
import weakref

from .pagemap import VEC_LEN, scan_regions

_PAGE = os.sysconf("SC_PAGE_SIZE")

_SYS_userfaultfd = {"x86_64": 323, "aarch64": 282}.get(os.uname().machine)
_UFFD_USER_MODE_ONLY = 1
_UFFD_API = 0xAA
_UFFD_FEATURE_WP_UNPOPULATED = 1 << 13
_UFFD_FEATURE_WP_ASYNC = 1 << 15
_UFFDIO_REGISTER_MODE_WP = 1 << 1
_UFFDIO_WRITEPROTECT_MODE_WP = 1 << 0
_PAGE_IS_WRITTEN = 1 << 1
_PM_SCAN_WP_MATCHING = 1 << 0
_PM_SCAN_CHECK_WPASYNC = 1 << 1


def _iowr(typ, nr, size):
    return (3 << 30) | (size << 16) | (typ << 8) | nr


_UFFDIO_API = _iowr(0xAA, 0x3F, 24)
_UFFDIO_REGISTER = _iowr(0xAA, 0x00, 32)
_UFFDIO_WRITEPROTECT = _iowr(0xAA, 0x06, 24)
_UFFDIO_UNREGISTER = (2 << 30) | (16 << 16) | (0xAA << 8) | 0x01  # _IOR(0xAA, 1, struct uffdio_range)


class Subscription:
    """One consumer's view of a tracked buffer: KEY = (address, nbytes); DIRTY = region indices written
    and not yet covered by one of this consumer's commits."""

    __slots__ = ("key", "dirty", "broken", "__weakref__")

    def __init__(self, key):
        self.key = key
        self.dirty = set()
        self.broken = False


class Tracker:
    """One per process (see `tracker()`): a userfaultfd in async write-protect mode and a pagemap fd."""

    def __init__(self):
        self._uffd = -1
        self._pm = -1
        self._pid = os.getpid()
        self._vec = (ctypes.c_uint64 * (3 * VEC_LEN))()  # struct page_region {start, end, categories}
        self._subs = {}  # (address, nbytes) -> WeakSet of live Subscriptions
        self._region_bytes = {}  # (address, nbytes) -> region size its subscribers count in
        self.error = None  # why tracking is unavailable, if it is
        self._open()

    def _open(self):
        if os.environ.get("LL_STORE_WPTRACK", "1") == "0":
            self.error = "turned off by LL_STORE_WPTRACK=0"
            return
        if _SYS_userfaultfd is None:
            self.error = "no userfaultfd syscall number for this machine"
            return
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(_SYS_userfaultfd, os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY)
        if fd < 0:
            self.error = "userfaultfd: %s" % os.strerror(ctypes.get_errno())
            return
        try:
            api = bytearray(struct.pack("QQQ", _UFFD_API,
                                        _UFFD_FEATURE_WP_ASYNC | _UFFD_FEATURE_WP_UNPOPULATED, 0))
            fcntl.ioctl(fd, _UFFDIO_API, api)
            self._pm = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            os.close(fd)
            self.error = "userfaultfd async write-protect unavailable: %s" % e
            return
        self._uffd = fd

    def available(self):
        return self._uffd >= 0 and self._pid == os.getpid()

    @staticmethod
    def _interior(addr, nbytes):
        start = (addr + _PAGE - 1) // _PAGE * _PAGE
        end = (addr + nbytes) // _PAGE * _PAGE
        return start, end

    @staticmethod
    def _private_anonymous(start, end):
        """Whether [start, end) lies in private anonymous mappings only (nobody else can write it)."""
        covered = start
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    if hi <= covered or lo >= end:
                        continue
                    path = parts[5].strip() if len(parts) > 5 else ""
                    if lo > covered or parts[1][3] != "p" or parts[1][1] != "w":
                        return False
                    if path and path != "[heap]" and not path.startswith("[anon:"):
                        return False
                    covered = hi
                    if covered >= end:
                        return True
        except (OSError, ValueError, IndexError):
            return False
        return False

    def subscribe(self, addr, nbytes):
        """Track the whole pages of the buffer [addr, addr+nbytes) for a new consumer: returns a
        Subscription whose `dirty` fills with the indices of regions written from now on, or None if
        this memory cannot be tracked."""
        if not self.available():
            return None
        start, end = self._interior(addr, nbytes)
        if end <= start or not self._private_anonymous(start, end):
            return None
        key = (addr, nbytes)
        subs = self._subs.get(key)
        if subs:
            self._harvest(key, region_bytes=None)  # what they have not seen yet, before protecting again
        try:
            fcntl.ioctl(self._uffd, _UFFDIO_REGISTER,
                        bytearray(struct.pack("QQQQ", start, end - start, _UFFDIO_REGISTER_MODE_WP, 0)))
            fcntl.ioctl(self._uffd, _UFFDIO_WRITEPROTECT,
                        bytearray(struct.pack("QQQ", start, end - start, _UFFDIO_WRITEPROTECT_MODE_WP)))
        except OSError:
            return None
        sub = Subscription(key)
        if len(self._subs) > 1024:
            for k in [k for k, v in self._subs.items() if not v]:
                del self._subs[k]
                self._region_bytes.pop(k, None)
            subs = self._subs.get(key)
        if subs is None:
            subs = self._subs[key] = weakref.WeakSet()
        subs.add(sub)
        return sub

    def unsubscribe(self, sub):
        """SUB stops tracking (and is never trusted again); the last one out unprotects and unregisters
        the range, so writes to it stop faulting."""
        sub.broken = True
        subs = self._subs.get(sub.key)
        if subs is None:
            return
        subs.discard(sub)
        if subs or not self.available():
            return
        start, end = self._interior(*sub.key)
        try:
            fcntl.ioctl(self._uffd, _UFFDIO_WRITEPROTECT, bytearray(struct.pack("QQQ", start, end - start, 0)))
            fcntl.ioctl(self._uffd, _UFFDIO_UNREGISTER, bytearray(struct.pack("QQ", start, end - start)))
        except OSError:
            pass  # gone already
        del self._subs[sub.key]

    def written(self, sub, region_bytes):
        """Regions of SUB's buffer written since SUB last cleared them (edge regions with partial pages
        always count), as a sorted list; None if the range is no longer tracked."""
        if sub.broken or not self.available() or self._harvest(sub.key, region_bytes) is None:
            return None
        addr, nbytes = sub.key
        start, end = self._interior(addr, nbytes)
        out = set(sub.dirty)
        nreg = (nbytes + region_bytes - 1) // region_bytes
        if start != addr:
            out.add(0)
        if end != addr + nbytes:
            out.add(nreg - 1)
        return sorted(out)

    def _harvest(self, key, region_bytes):
        """Scan KEY's range for written pages, re-protect them, add their regions to every subscriber."""
        region_bytes = region_bytes or self._region_bytes.get(key, 2 << 20)
        self._region_bytes[key] = region_bytes
        found = self.scan(key[0], key[1], region_bytes)
        if found is None:
            for sub in list(self._subs.get(key, ())):
                sub.broken = True  # writes may have gone unseen: never trust it again
            return None
        for sub in list(self._subs.get(key, ())):
            sub.dirty.update(found)
        return found

    def scan(self, addr, nbytes, region_bytes):
        """Indices of the REGION_BYTES regions of the buffer at ADDR holding whole pages written since
        they were last protected, re-protecting them.  None if the range is not (or no longer) tracked.
        Consumers use `written` (a scan consumes what it finds)."""
        start, end = self._interior(addr, nbytes)
        if end <= start:
            return None
        nreg = (nbytes + region_bytes - 1) // region_bytes
        try:
            out = scan_regions(self._pm, addr, start, end, region_bytes,
                               _PM_SCAN_WP_MATCHING | _PM_SCAN_CHECK_WPASYNC,
                               (0, _PAGE_IS_WRITTEN, 0, _PAGE_IS_WRITTEN), self._vec)
        except OSError:
            return None  # not registered (any more): PM_SCAN_CHECK_WPASYNC refuses
        return sorted(r for r in out if 0 <= r < nreg)

_tracker = None


def tracker():
    """This process's Tracker (a forked child makes its own: uffd registrations do not survive fork)."""
    global _tracker
    if _tracker is None or _tracker._pid != os.getpid():
        _tracker = Tracker()
    return _tracker

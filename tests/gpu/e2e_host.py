"""tests/gpu/e2e_host.py: what e2e.sh asks of the machine before it builds and runs (issue 22, item 5).

Run by e2e.sh with the machine's Python (no packages needed), never by hand:

  e2e_host.py swap LIBDIR        a library the bundle's prefix holds that the system's loader has already is
                                 the system's (Python's own modules load libssl, libz, ...; one process holds
                                 one of each): the prefix's entry named by the library's SONAME (what the
                                 loader looks for, through the binaries' RPATH) becomes a link to the
                                 system's copy of that soname.  Matched by soname, read from the ELF file:
                                 a file name (libsodium.so.23.3.0) is not what ldconfig lists (libsodium.so.23).
                                 The kernel's own libraries (OWN) always stay the prefix's.
  e2e_host.py setup --mode M --out HOST.json
                                 /dev/shm big enough for the payload pool (remounted larger as root, else the
                                 reason why not), and huge pages for the pool where the host allows them (as
                                 root: vm.nr_overcommit_hugepages, the surplus pages ll_pagekind.c counts, so
                                 no memory is locked away; else shmem THP for a memfd pool); writes what it
                                 found and did, which e2e.py puts in the report and uses for its sizes.
                                 It changes the host only as root where a GPU is (/dev/nvidia0, ...), so a
                                 rehearsal of the GPU mode on a shared machine leaves it alone.

The pure parts (soname, ldconfig parsing, the plans) are tested here by tests/gpu/test_e2e_helpers.py.
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys

GiB = 1 << 30
MiB = 1 << 20
HUGE_PAGE = 2 * MiB
# The kernel's own libraries: the build links them from the prefix, and libraries_loaded checks they are
# loaded from there (the system's copies, where a host has any, may be other versions).
OWN = ("libzmq.", "libczmq.", "libjansson.", "libhiredis.", "libxxhash.", "libsodium.", "libpgm-", "libnorm.")
SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/usr/local/lib")
# The pool the GPU run wants: room for its biggest save_restore size (16 GiB) twice over plus slack, and the
# shared-memory mount to hold it (see pool_plan).
GPU_POOL_MIB = 48 << 10
CPU_POOL_MIB = 2 << 10


# ---- sonames -------------------------------------------------------------------------------------------------
def soname(path):
    """The DT_SONAME of the ELF shared object at PATH (64-bit little-endian, as on x86-64), or None when it has
    none or is no such file.  Read from the section headers: the .dynamic section and its string table."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            if not shoff or shentsize < 64 or shnum == 0 or shnum > 4096:
                return None
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            sections = []
            for i in range(shnum):
                # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, ...
                _, stype, _, _, off, size, link, _ = struct.unpack_from("<IIQQQQII", table, i * shentsize)
                sections.append((stype, off, size, link))
            for stype, off, size, link in sections:
                if stype != 6 or link >= len(sections):  # SHT_DYNAMIC
                    continue
                f.seek(off)
                dyn = f.read(size)
                _, stroff, strsize, _ = sections[link]
                for j in range(0, len(dyn) - 15, 16):
                    tag, val = struct.unpack_from("<qQ", dyn, j)
                    if tag == 0:  # DT_NULL
                        break
                    if tag == 14 and val < strsize:  # DT_SONAME
                        f.seek(stroff + val)
                        name = f.read(min(256, strsize - val)).split(b"\0", 1)[0]
                        return name.decode("ascii", "replace") or None
    except (OSError, struct.error):
        return None
    return None


def ldconfig_libs(text):
    """{soname: path} of the x86-64 libraries in `ldconfig -p` output TEXT (the first entry of each wins, as
    the loader's search would take it)."""
    out = {}
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if not sep or "(" not in name:
            continue
        lib, _, flags = name.partition(" (")
        if "x86-64" not in flags or "hwcap" in flags:
            continue
        out.setdefault(lib.strip(), path.strip())
    return out


def system_libs(dirs=SYSTEM_DIRS):
    """{soname: path} the system's loader finds: `ldconfig -p`, else (no ldconfig, or an empty cache) the
    standard directories, each file's own soname."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            p = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        libs = ldconfig_libs(p.stdout)
        if libs:
            return libs
    out = {}
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            if ".so." in n or n.endswith(".so"):
                so = soname(os.path.join(d, n))
                if so and so == n:
                    out.setdefault(so, os.path.join(d, n))
    return out


def swap_plan(libdir, system, own=OWN):
    """[(soname, system path)]: the prefix's libraries in LIBDIR whose soname the SYSTEM ({soname: path})
    has, the kernel's own (OWN) aside."""
    plan = {}
    try:
        names = sorted(os.listdir(libdir))
    except OSError:
        return []
    for n in names:
        path = os.path.join(libdir, n)
        if not n.startswith("lib") or ".so" not in n or os.path.islink(path) or not os.path.isfile(path):
            continue
        so = soname(path)
        if not so or so.startswith(own) or so not in system:
            continue
        if os.path.realpath(system[so]).startswith(os.path.realpath(libdir) + os.sep):
            continue  # (the prefix itself on the loader's path: nothing to swap)
        plan[so] = system[so]
    return sorted(plan.items())


def swap(libdir, system=None, say=print):
    """Apply swap_plan: LIBDIR/<soname> becomes a link to the system's file.  Returns the plan."""
    plan = swap_plan(libdir, system_libs() if system is None else system)
    for so, path in plan:
        dst = os.path.join(libdir, so)
        tmp = dst + ".e2e-swap"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(path, tmp)
        os.replace(tmp, dst)
        say("system's %s: %s" % (so, path))
    return plan


# ---- /dev/shm and huge pages ------------------------------------------------------------------------------
def shm_plan(mode, total_bytes, mem_bytes):
    """(bytes the /dev/shm mount should have for MODE's pool, or None when it has enough).  The GPU run wants
    its pool (GPU_POOL_MIB) with a quarter more room, never over 60% of the machine's memory (the rest is for
    the processes; tmpfs takes memory only as it is used)."""
    want = (GPU_POOL_MIB if mode == "gpu" else CPU_POOL_MIB) * MiB * 5 // 4
    if mem_bytes:
        want = min(want, mem_bytes * 6 // 10)
    want -= want % MiB
    return want if total_bytes < want else None


def pool_plan(mode, shm_free_bytes):
    """The pool size (MiB) for MODE that /dev/shm with SHM_FREE_BYTES free can hold (80% of it: the pool
    falls back to a /dev/shm file when huge pages do not come, so it must fit there too), at least 16."""
    cap = GPU_POOL_MIB if mode == "gpu" else CPU_POOL_MIB
    return max(16, min(cap, int(shm_free_bytes * 0.8) // MiB))


def hugepage_plan(pool_mib, meminfo):
    """vm.nr_overcommit_hugepages for pools of POOL_MIB, given /proc/meminfo's {key: value} MEMINFO; 0 when
    the host has no 2 MiB huge pages (Hugepagesize) or the free ones suffice.  The limit is shared by every
    pool of the run (each kernel has its own session's pool, and they are written at once: save_restore's
    beside train's), so it is 60% of the memory, at least one pool's pages plus 64 (the private copies a
    restore may take).  Surplus pages cost nothing until a pool writes them, and go back when it is gone."""
    if meminfo.get("Hugepagesize") != HUGE_PAGE // 1024:
        return 0
    need = (pool_mib * MiB + HUGE_PAGE - 1) // HUGE_PAGE + 64
    need = max(need, meminfo.get("MemTotal", 0) * 6 // 10 // (HUGE_PAGE // 1024))
    free = max(0, meminfo.get("HugePages_Free", 0) - meminfo.get("HugePages_Rsvd", 0))
    return 0 if free >= need else need


def meminfo(text):
    """/proc/meminfo TEXT as {key: number} (kB for sizes, counts for HugePages_*)."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    return out


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
        return None
    except OSError as e:
        return "%s: %s" % (path, e.strerror or e)


def _shm_mount():
    """The options of the /dev/shm mount, or None when /dev/shm is no mount of its own."""
    for line in _read("/proc/self/mounts").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "/dev/shm":
            return parts[3]
    return None


def setup(mode):
    """Check (and as root, fix) /dev/shm and huge pages for MODE's pool; returns what was found and done."""
    # Changes only on a GPU machine (a device node there): a rehearsal of the GPU mode on a shared host, run
    # as root, must leave its /dev/shm and huge pages alone.
    gpu_here = bool(glob.glob("/dev/nvidia[0-9]*"))
    out = {"may_configure": os.geteuid() == 0 and gpu_here, "actions": [], "problems": []}
    if os.geteuid() == 0 and not gpu_here:
        out["problems"].append("no /dev/nvidia* here: the host is left as it is")
    mem = meminfo(_read("/proc/meminfo"))
    mem_bytes = mem.get("MemTotal", 0) * 1024
    try:
        st = os.statvfs("/dev/shm")
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError as e:
        total = free = 0
        out["problems"].append("/dev/shm: %s" % (e.strerror or e))
    want = shm_plan(mode, total, mem_bytes)
    out["shm_before_bytes"] = total
    if want and mode == "gpu":
        if not out["may_configure"]:
            out["problems"].append("/dev/shm has %.2f GiB, the run wants %.1f GiB: left as is (root on a GPU "
                                   "machine remounts it)"
                                   % (total / GiB, want / GiB))
        else:
            opts = _shm_mount()
            cmd = (["mount", "-o", "remount,size=%d" % want, "/dev/shm"] if opts is not None else
                   ["mount", "-t", "tmpfs", "-o", "size=%d,mode=1777" % want, "tmpfs", "/dev/shm"])
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                err = p.stderr.strip() if p.returncode else None
            except (OSError, subprocess.TimeoutExpired) as e:
                err = str(e)
            if err:
                out["problems"].append("%s failed: %s" % (" ".join(cmd), err[:300]))
            else:
                out["actions"].append(" ".join(cmd))
        try:
            st = os.statvfs("/dev/shm")
            total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        except OSError:
            pass
    out["shm_bytes"], out["shm_free_bytes"] = total, free
    out["pool_mib"] = pool_plan(mode, free)
    # Huge pages for the pool (MEASURED.md: 4 KiB first touch runs at 0.33 GB/s, far below a pinned copy).
    pages = hugepage_plan(out["pool_mib"], mem)
    have = int(_read("/proc/sys/vm/nr_overcommit_hugepages").strip() or 0)
    if mem.get("Hugepagesize") != HUGE_PAGE // 1024:
        out["problems"].append("no 2 MiB huge pages on this host (Hugepagesize %s kB)" % mem.get("Hugepagesize"))
    elif pages and have < pages and mode == "gpu":
        if not out["may_configure"]:
            out["problems"].append("huge pages: vm.nr_overcommit_hugepages %d < %d, left as is (root on a GPU "
                                   "machine sets it)" % (have, pages))
        else:
            err = _write("/proc/sys/vm/nr_overcommit_hugepages", str(pages))
            (out["problems"] if err else out["actions"]).append(
                err or "vm.nr_overcommit_hugepages=%d (a pool of %d MiB)" % (pages, out["pool_mib"]))
    if mode == "gpu" and out["may_configure"]:
        # Where hugetlb pages do not come, a memfd pool still gets THP when shmem allows it (ll_pagekind.c).
        shmem = _read("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        if shmem and "[never]" in shmem:
            err = _write("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "advise")
            (out["problems"] if err else out["actions"]).append(err or "shmem_enabled=advise")
    out["nr_overcommit_hugepages"] = int(_read("/proc/sys/vm/nr_overcommit_hugepages").strip() or 0)
    out["shmem_enabled"] = _read("/sys/kernel/mm/transparent_hugepage/shmem_enabled").strip()
    return out


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("swap")
    s.add_argument("libdir")
    s = sub.add_parser("setup")
    s.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    s.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "swap":
        swap(a.libdir, say=lambda line: print("e2e: " + line, flush=True))
        return 0
    host = setup(a.mode)
    with open(a.out, "w") as f:
        json.dump(host, f, indent=1)
    for line in host["actions"]:
        print("e2e: host: %s" % line)
    for line in host["problems"]:
        print("e2e: host: %s" % line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A notebook's store that outlives its kernel: restart and crash without losing variables.

A kernel started for a notebook (jupyter_server puts its path in the kernel's environment as JPY_SESSION_NAME;
LOOSELEAF_NOTEBOOK overrides it) keeps its checkpoint store *keyed*: its directory (looseleaf-keep-*, a name
older builds' sweeps leave alone) holds a `notebook` file with
a hash of the user and that path, and its payload pool is a named file in /dev/shm (`pool` says which) instead
of a memfd that dies with the kernel.  So when the kernel dies (SIGKILL, a segfault, the OOM killer) or is
restarted, the redis-server's append-only file and the payloads stay, for LOOSELEAF_KEEP_S (3600) seconds
after its death:

* the next kernel of the same notebook (same path, same user) says so in its first reply's output, once, and
  `%looseleaf restore` (or LOOSELEAF_RESTORE=1 in the kernelspec's env: before its first cell) brings back the
  last committed version of every variable, the process state and the session's imports, naming what could not
  come back and why (`state.json`, which the kernel writes when idle: the imports, what was not committed);
* a store nobody claims is removed after that time by its *reaper*: a small detached process (its own session,
  so a kill of the kernel's process group spares it) that each keyed store gets when it opens, which waits for
  the store's owner to die (pidfd), then for the time, then removes the directory and the pool file.  Kernels
  sweep expired stores too (a reaper killed with its machine's session), so nothing accumulates in /dev/shm.

A clean shutdown (not a restart) removes the store at once, as before; JupyterLab's Restart starts a clean
kernel (nothing comes back by itself unless the kernelspec asks for it).  Runs on the interpreter thread.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from .procs import same_process

OWNER = "owner"        # "<kernel pid> <session> <its start time>"
NOTEBOOK = "notebook"  # the notebook's key (notebook_key)
POOL = "pool"          # the path of the named payload pool
DEAD = "dead_since"    # when the owner was first seen dead (or shut down to restart)
STATE = "state.json"   # what restore needs beyond the store: imports, what was not committed
KEEP_S_DEFAULT = 3600


def keep_seconds():
    try:
        return max(0.0, float(os.environ.get("LOOSELEAF_KEEP_S", KEEP_S_DEFAULT)))
    except ValueError:
        return float(KEEP_S_DEFAULT)


def notebook_key():
    """A hash of this user and the notebook this kernel runs for, or None (no notebook known: the store is
    not kept)."""
    nb = os.environ.get("LOOSELEAF_NOTEBOOK") or os.environ.get("JPY_SESSION_NAME")
    if not nb or keep_seconds() <= 0:
        return None
    return hashlib.sha256(("%d\0%s" % (os.getuid(), nb)).encode()).hexdigest()[:24]


def pool_path(session):
    return "/dev/shm/looseleaf-%d-keep-%s.pool" % (os.getuid(), session)


def pool_bytes():
    """The size of a named pool: what the store would choose for a pool of its own in /dev/shm (store/API.md:
    LL_STORE_POOL_BYTES, else half of RAM at most 16 GiB, shrunk to 90% of the room /dev/shm has when that is
    less), which it does not check for a path it is given.  None: the store's default."""
    if os.environ.get("LL_STORE_POOL_BYTES"):
        return None
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        st = os.statvfs("/dev/shm")
    except (OSError, ValueError):
        return None
    want, room = min(ram // 2, 16 << 30), int(st.f_bavail * st.f_frsize * 0.9)
    return min(want, room) if room >= 16 << 20 else None


def _read(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            return f.read().strip()
    except OSError:
        return None


def _write(d, name, text):
    tmp = os.path.join(d, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(d, name))


def owner(d):
    """(pid, session, start time or None) of store dir D, or None."""
    fields = (_read(d, OWNER) or "").split()
    try:
        return int(fields[0]), fields[1], int(fields[2]) if len(fields) > 2 else None
    except (ValueError, IndexError):
        return None


def claim(d, session):
    """Make this process the owner of store dir D (a restore in progress, an adopted store)."""
    from .procs import start_time
    started = start_time(os.getpid())
    _write(d, OWNER, "%d %s%s\n" % (os.getpid(), session, " %d" % started if started else ""))
    try:
        os.unlink(os.path.join(d, DEAD))
    except OSError:
        pass


def mine(d):
    try:
        st = os.lstat(d)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def remove(d):
    """Remove store dir D and its named pool (its redis-server is gone with its owner, or stopped here)."""
    try:
        import _llstore
        _llstore.stop_redis(d)
    except Exception:  # noqa: BLE001 - best effort
        pass
    pool = _read(d, POOL)
    if pool and pool.startswith("/dev/shm/looseleaf-%d-" % os.getuid()):
        try:
            os.unlink(pool)
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def dead_since(d):
    """When D's owner was first seen dead (written now if not yet), or None while it runs."""
    o = owner(d)
    if o is not None and same_process(o[0], o[2]):
        return None
    t = _read(d, DEAD)
    try:
        return float(t.split()[0])
    except (AttributeError, IndexError, ValueError):
        now = time.time()
        try:
            _write(d, DEAD, "%f\n" % now)
        except OSError:
            pass
        return now


def kept(base, key):
    """Store dirs under BASE of notebook KEY whose kernel is gone and whose time has not run out, newest
    death first: [(dir, dead since)]."""
    out = []
    for d in glob.glob(os.path.join(base or "/nonexistent", "looseleaf-keep-*")):
        if not mine(d) or _read(d, NOTEBOOK) != key or owner(d) is None:
            continue
        t = dead_since(d)
        if t is not None and time.time() - t <= keep_seconds():
            out.append((d, t))
    out.sort(key=lambda e: -e[1])
    return out


def sweep(base):
    """Remove the stores of kernels that are gone: an unkeyed one at once (its pool went with its kernel; the
    directory with the append-only file stays), a keyed one once its time ran out.  Only our own directories
    (0700, our uid), and only when the owner process is gone (pid and start time: a recycled pid keeps
    nothing alive)."""
    for d in glob.glob(os.path.join(base or "/nonexistent", "looseleaf-store-*")) + \
            glob.glob(os.path.join(base or "/nonexistent", "looseleaf-keep-*")):
        o = owner(d)
        if not mine(d) or o is None or o[0] == os.getpid():
            continue
        t = dead_since(d)
        if t is None:
            continue
        if _read(d, NOTEBOOK) is None or time.time() - t > keep_seconds():
            # What an older kernel may have left: a pool file named after the session.
            for pool in glob.glob("/dev/shm/looseleaf-%d-*-%s.pool" % (os.getuid(), o[1])):
                try:
                    os.unlink(pool)
                except OSError:
                    pass
            remove(d)


# The reaper: waits for the owner of DIR (re-read each time: a kernel that adopts the store takes it over) to
# die, then TTL seconds, then removes the store unless a kernel claimed it meanwhile.  Self-contained (the
# package needs the kernel's builtin modules): the same rules as owner(), dead_since() and remove() above.
_REAPER = r'''
import os, select, shutil, sys, time
d, ttl, uid = sys.argv[1], float(sys.argv[2]), os.getuid()
def read(name):
    try:
        with open(os.path.join(d, name)) as f:
            return f.read().strip()
    except OSError:
        return None
def alive(pid, started):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and (started is None or fields[19] == str(started))
while os.path.isdir(d):
    f = (read("owner") or "").split()
    try:
        pid, started = int(f[0]), (int(f[2]) if len(f) > 2 else None)
    except (ValueError, IndexError):
        break
    if pid > 0 and alive(pid, started):
        try:
            fd = os.pidfd_open(pid)
            select.select([fd], [], [], 60)
            os.close(fd)
        except (AttributeError, OSError):
            time.sleep(2)
        continue
    try:
        t = float((read("dead_since") or "").split()[0])
    except (IndexError, ValueError):
        t = time.time()
        try:
            with open(os.path.join(d, "dead_since"), "w") as out:
                out.write("%f" % t)
        except OSError:
            pass
    left = t + ttl - time.time()
    if left > 0:
        time.sleep(min(left + 0.05, 5))
        continue
    pool = read("pool")
    if pool and pool.startswith("/dev/shm/looseleaf-%d-" % uid):
        try:
            os.unlink(pool)
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)
'''


def spawn_reaper(d):
    """Start D's reaper (detached: its own session, no inherited fds, cwd /), unless one runs (an adopted
    store's: it follows the store's new owner)."""
    from .procs import pid_alive
    try:
        if pid_alive(int(_read(d, "reaper") or "0")):
            return
    except ValueError:
        pass
    python = os.environ.get("LOOSELEAF_PYTHON") or sys.executable or "/usr/bin/python3"
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")}
    try:
        p = subprocess.Popen([python, "-c", _REAPER, d, str(keep_seconds())], cwd="/", env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)
        _write(d, "reaper", "%d\n" % p.pid)
        _REAPED.append(p)  # (reaped by Popen's own bookkeeping when it ends before us)
    except OSError:
        pass  # kernels' sweeps remove it after its time


_REAPED = []


def write_state(d, state):
    """Record STATE (a dict: imports, not_committed) in store dir D for a later restore."""
    try:
        _write(d, STATE, json.dumps(state))
    except (OSError, TypeError, ValueError):
        pass


def read_state(d):
    try:
        return json.loads(_read(d, STATE) or "{}")
    except ValueError:
        return {}


# ---- restore ---------------------------------------------------------------------------------------------

def _when(t):
    return time.strftime("%H:%M:%S", time.localtime(t))


def _why_gone(d):
    return "was restarted" if "restart" in (_read(d, DEAD) or "") else "died"


def pending(coh):
    """Whether an earlier kernel of this notebook left a store that is still kept."""
    key = notebook_key()
    return key is not None and any(d != coh.dir for d, _ in kept(coh.store_base(), key))


def offer(coh):
    """The line the first reply of a kernel shows when an earlier kernel of its notebook left a store, or None."""
    key = notebook_key()
    if key is None:
        return None
    cands = [(d, t) for d, t in kept(coh.store_base(), key) if d != coh.dir]
    if not cands:
        return None
    d, t = cands[0]
    return ("LooseLeaf: the previous kernel of this notebook %s at %s; its committed variables are kept until %s: "
            "%%looseleaf restore brings them back\n" % (_why_gone(d), _when(t), _when(t + keep_seconds())))


def import_statement(name, module):
    """The statement that binds NAME to MODULE again (`import numpy as np`), or None for a module whose name
    no import statement can spell.  (coherence.py's analysis entries use it too.)"""
    mod = getattr(module, "__name__", None)
    if isinstance(mod, str) and mod and all(p.isidentifier() for p in mod.split(".")):
        return "import %s" % mod if mod == name else "import %s as %s" % (mod, name)
    return None


def _imports_of(ns):
    """The import statements that bind the session's module names again (`import numpy as np`)."""
    import types
    out = []
    for k, v in list(ns.items()):
        if isinstance(v, types.ModuleType) and not k.startswith("_"):
            stmt = import_statement(k, v)
            if stmt and getattr(v, "__file__", None) != getattr(sys.modules.get("__main__"), "__file__", 0):
                out.append(stmt)
    return sorted(set(out))


def note_state(coh, at_risk):
    """Record, in a keyed store, what a restore needs beyond the store: the session's imports and the variables
    no commit holds (AT_RISK: {name: why})."""
    if coh.dir and _read(coh.dir, NOTEBOOK):
        imports = list(coh.imports) + [s for s in _imports_of(coh.shell.user_ns) if s not in coh.imports]
        write_state(coh.dir, {"imports": imports, "not_committed": at_risk,
                              "time": time.time()})


def restore(coh):
    """Bring back what the newest store an earlier kernel of this notebook left holds: every variable's last
    committed version, the process state, the imports.  Returns a dict: restored [names], failed {name: why},
    not_committed {name: why}, imports [stmts], import_failed {stmt: why}, gone ("died"/"was restarted"), at;
    or {error: why}."""
    import _llstore
    from looseleaf_store import Checkpointer, procstate, usermods
    key = notebook_key()
    if key is None:
        return {"error": "this kernel runs for no known notebook (neither JPY_SESSION_NAME, which Jupyter's "
                         "server sets, nor LOOSELEAF_NOTEBOOK is set), so no store was kept for it"}
    cands = [(d, t) for d, t in kept(coh.store_base(), key) if d != coh.dir]
    if not cands:
        return {"error": "no earlier kernel of this notebook left a store (kept %d s after a kernel ends: "
                         "LOOSELEAF_KEEP_S; a shutdown, not a restart, removes it)" % keep_seconds()}
    d, t = cands[0]
    gone = _why_gone(d)
    o = owner(d)
    session = o[1]
    state = read_state(d)
    ns = coh.shell.user_ns
    adopt = coh.cp is None
    claim(d, session)  # no reaper or sweep removes it while we read it
    if adopt:
        coh._open(adopt=(d, session))
        store, cp = coh.store, coh.cp
    else:
        store = _llstore.Store(d, session, pool_path=_read(d, POOL), reserve_bytes=0)
        cp = Checkpointer(store, ns)
        cp.cpu_only = True
    out = {"gone": gone, "at": t, "restored": [], "failed": {}, "imports": [], "import_failed": {},
           "not_committed": dict(state.get("not_committed") or {})}
    try:
        # The imports first: values whose classes live in those packages unpickle either way, but a
        # module bound by name (np) is the user's too.
        for stmt in state.get("imports") or []:
            try:
                exec(compile(stmt, "<looseleaf restore>", "exec"), ns)
                out["imports"].append(stmt)
            except Exception as e:  # noqa: BLE001 - listed
                out["import_failed"][stmt] = "%s: %s" % (type(e).__name__, e)
        names = sorted(n for n in store.versions() if n != procstate.NAME and not usermods.is_entry(n)
                       and not (n.startswith("_") and n[1:].isdigit()))
        rep = cp.restore(names)
        out["failed"].update(rep.failed)
        for n in rep.missing:
            out["failed"].setdefault(n, "not in the store any more")
        restored = sorted(rep.restored)
        if adopt:
            coh._ps = None  # the stored process state applies (cwd, environment, random generators)
            coh._ps_moved = True
            coh._pull_procstate()
            coh._seen_version = store.last_commit()[0]
            coh._stored = set(restored)
            try:
                coh._pull_modules()
            except Exception:  # noqa: BLE001 - the modules' globals are a convenience
                pass
        else:
            st = None
            try:
                cp.restore([procstate.NAME])
                st = ns.pop(procstate.NAME, None)
            except Exception:  # noqa: BLE001 - the process state is a convenience here
                pass
            if st is not None:
                procstate.apply(st)
            coh._mark_dirty(restored)  # committed into this kernel's own store
        from looseleaf_store.homes import HomeRef
        for n in restored:
            v = ns.get(n)
            if type(v) is HomeRef:
                ns.pop(n, None)
                out["failed"][n] = "%s that lived only in worker %d, gone with the kernel" % (v.what, v.pid)
        out["restored"] = [n for n in restored if n not in out["failed"]]
        for n in out["restored"]:
            out["not_committed"].pop(n, None)  # an older version came back; said below
        out["older"] = sorted(n for n in out["restored"] if n in (state.get("not_committed") or {}))
    except BaseException:
        if not adopt:
            store.close()  # the kept store stays (ours until we end; then its reaper's again)
        raise
    if not adopt:
        store.close()
        # Read into this kernel's namespace: committed into its own store now, so that a crash before its
        # next commit loses nothing; the kept store goes only once they are there.
        try:
            rep = coh._push(out["restored"], modules=False)
            err = rep.error or (", ".join(sorted(rep.failed)) if rep.failed else None)
        except Exception as e:  # noqa: BLE001 - said
            err = "%s: %s" % (type(e).__name__, e)
        if err:
            out["kept"] = "the kept store stays (committing them here failed: %s)" % err
        else:
            coh.dirty.difference_update(out["restored"])
            remove(d)
    return out


def summary(res):
    """The lines a restore prints."""
    if "error" in res:
        return "LooseLeaf: nothing to restore: %s" % res["error"]
    lines = ["LooseLeaf: restored %d variable%s from the kernel that %s at %s: %s" % (
        len(res["restored"]), "" if len(res["restored"]) == 1 else "s", res["gone"], _when(res["at"]),
        ", ".join(res["restored"]) or "(none)")]
    if res["imports"]:
        lines.append("  imported again: %s" % "; ".join(res["imports"]))
    for stmt, why in sorted(res["import_failed"].items()):
        lines.append("  not imported: %s (%s)" % (stmt, why))
    if res.get("older"):
        lines.append("  an older version (the last committed one) of: %s" % ", ".join(res["older"]))
    if res.get("kept"):
        lines.append("  " + res["kept"])
    gone = dict(res["failed"])
    for n, why in res["not_committed"].items():
        gone.setdefault(n, why)
    if gone:
        lines.append("  could not come back:")
        for n, why in sorted(gone.items()):
            lines.append("    %s: %s" % (n, why))
    return "\n".join(lines)

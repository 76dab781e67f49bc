"""looseleaf_store.checkpoint: save(names) / restore(names) / versions() of one notebook namespace.

Runs in the kernel's embedded interpreter (after CPU cells) and in GPU workers (restore before, save after a
cell), on the thread that runs cells; one Checkpointer per (store, namespace), not thread-safe.

What it keeps true (see serial.py for how one variable is pickled):
* A commit holds every variable of one save or none (one `_llstore` commit).  A variable whose pickling
  or payload write fails is reported with the reason and left out, with every variable of this save that
  references its objects; its committed version is untouched.
* A stream names its owners by memo index, so whenever a variable's exports change (new blob, or its
  exported objects are other objects now) every committed variable that references it is re-pickled into
  the same commit (restored first if this process does not hold it).  A variable that reaches an object
  a committed variable exports is saved together with that owner (NeedOwner).
* Unchanged payloads cost no bytes: the previous ref of the same payload slot is the base of an
  incremental put (the C store hashes 2 MiB regions, or only those named dirty), and a restored payload
  this process never wrote (pagemap.py) is committed again by reference without even hashing it.
* Names are validated (a list of str; TypeError otherwise); everything else that goes wrong with a
  variable or with the store is a reason in the report, never an exception.
* Restore maps payloads copy-on-write (`map_payload(ref, writable=True)`): zero copy, a user writing to a
  restored array changes only this process, and the pool's bytes never change under a reader.

* Unchanged payloads of this process's own memory (numpy arrays, CPU tensors of 8 MiB or more) are not
  even hashed: wptrack.py write-protects them after a save and asks the kernel which pages were written.
  The price is a minor fault on the first write to each such page after a save (~0.2 s per GiB
  rewritten here), so a payload found more than half rewritten stops being tracked until a save finds
  it (nearly) unchanged again.  LL_STORE_WPTRACK=0 turns it off (every region is hashed, ~10 GB/s).

* Device memory (CUDA tensors' storages) goes through devsave.py: hashed per 2 MiB region on the device
  after synchronize(), compared with the hashes of the payload it was saved as or restored from, and only
  the changed regions copied, through a fixed pair of pinned buffers pipelined with the store's copy;
  restore copies through the same pair and hashes on the device.

Limits: the ownership table keeps every exported object of every saved or restored variable alive until
the variable is saved again or deleted (a list of a million dicts costs a million table entries).
"""
import itertools
import os
import sys
import time
import weakref

import numpy as np

from . import devsave, pagemap, wptrack
from .serial import (MemIndex, NeedOwner, SaveContext, Unpickler, blob_digest, pickle_var, remember_device,
                     split_blob, storage_key, untyped_storage)

_cell_counter = itertools.count(1)

# A save that may give way (save(give_way=...)) puts payloads larger than this in pieces of about this size,
# asking between them: at memcpy speed one piece is ~10 ms of copying.
_PIECE_BYTES = 64 << 20


def _names(names):
    if isinstance(names, (str, bytes)):
        raise TypeError("names must be a list of variable names, not one %s" % type(names).__name__)
    names = list(dict.fromkeys(names))
    for n in names:
        if not isinstance(n, str):
            raise TypeError("variable names must be str, not %s (%r)" % (type(n).__name__, n))
    return names


def _reason(e):
    msg = str(e) or e.__class__.__name__
    if isinstance(e, RecursionError):
        msg = "structure too deeply nested to pickle"
    return "%s: %s" % (e.__class__.__name__, msg)


def _store_error(e):
    """Whether E is the store's failure (any _llstore.StoreError: no room, Redis gone), not the value's."""
    return any(c.__name__ == "StoreError" and c.__module__ == "_llstore" for c in type(e).__mro__)


# Payloads this process owns are write-tracked from this size on (smaller ones hash in microseconds, and
# each tracked range costs a kernel mapping).
TRACK_MIN_BYTES = 8 << 20


def _is_storage(obj):
    """Whether OBJ is a torch storage (typed or untyped)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, (torch.storage.TypedStorage, torch.storage.UntypedStorage))


def _pinned(storage):
    """Whether STORAGE is pinned host memory.  Only CUDA can pin memory, and asking a storage may initialise
    CUDA (torch 2.x asks the runtime): never in a process that has not initialised it itself (the kernel, a
    zygote: a CUDA context does not survive fork)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized() and storage.is_pinned())

class SaveReport:
    """What a save did.  saved: {name: new version}; unchanged: names whose committed version still holds;
    deleted: names removed from the store; failed: {name: reason}; added: names not asked for that were
    saved too (owners and dependents); bytes_written: payload bytes copied into the pool; payload_bytes:
    payload bytes of the saved variables; error: why the commit failed (nothing committed), else None;
    standins: {name: why} saved as the stand-in save(stand_in=...) gave, their own value being unsaveable;
    graphs: names saved (or unchanged) whose value holds autograd history, which the store does not keep;
    error_kind: the store's exception behind ERROR (e.g. "StoreUnavailable", "PoolFullError"), else None."""

    def __init__(self):
        self.saved = {}
        self.unchanged = []
        self.deleted = []
        self.failed = {}
        self.added = []
        self.bytes_written = 0
        self.payload_bytes = 0
        self.error = None
        self.error_kind = None
        self.seconds = 0.0
        self.standins = {}
        self.graphs = []

    def __repr__(self):
        return ("SaveReport(saved=%r, unchanged=%d, deleted=%r, failed=%r, added=%r, bytes_written=%d, "
                "error=%r, seconds=%.4f)" % (self.saved, len(self.unchanged), self.deleted, self.failed,
                                             self.added, self.bytes_written, self.error, self.seconds))


class RestoreReport:
    """What a restore did.  restored: {name: version} bound into the namespace (the asked names and what they
    reference); skipped: names whose held version is current; missing: asked names not in the store;
    failed: {name: reason}; payload_bytes: bytes mapped; warnings: e.g. a CUDA tensor restored on CPU."""

    def __init__(self):
        self.restored = {}
        self.skipped = []
        self.missing = []
        self.failed = {}
        self.payload_bytes = 0
        self.warnings = []
        self.seconds = 0.0

    def __repr__(self):
        return ("RestoreReport(restored=%r, skipped=%d, missing=%r, failed=%r, warnings=%r, seconds=%.4f)"
                % (self.restored, len(self.skipped), self.missing, self.failed, self.warnings, self.seconds))


class _VarState:
    """This process's knowledge of one variable it saved or restored."""

    __slots__ = ("version", "hash", "prefs", "pmeta", "deps", "exports", "track")

    def __init__(self, version, hash_, prefs, pmeta, deps, exports, track=None):
        self.version = version  # committed version the namespace value corresponds to
        self.hash = hash_  # hash of the committed blob
        self.prefs = prefs  # committed payload refs (str), one per payload slot
        self.pmeta = pmeta  # payload metadata per slot (kind, nbytes, ...)
        self.deps = deps  # owner names its stream references
        self.exports = exports  # {(kind, index): obj}
        self.track = track or {}  # payload slot -> _Track: write tracking of this process's own memory


class _Track:
    """A payload slot whose memory (this process's own) is write-tracked (wptrack.py): it differs from the
    committed payload REF only in the regions SUB reports written."""

    __slots__ = ("addr", "nbytes", "holder", "ref", "sub", "used")

    def __init__(self, addr, nbytes, holder, ref, sub, used):
        self.addr = addr
        self.nbytes = nbytes
        self.holder = holder  # the array / storage owning the memory: kept alive, so never freed under us
        self.ref = ref
        self.sub = sub  # wptrack.Subscription; None: rewritten wholesale lately, so left untracked
        self.used = used  # the dirty regions this save copied: cleared from sub once it commits


class Checkpointer:
    """Saves and restores the variables of NAMESPACE (a dict, e.g. the shell's user_ns) in STORE (an
    `_llstore.Store`)."""

    def __init__(self, store, namespace):
        if not isinstance(namespace, dict):
            raise TypeError("namespace must be a dict (the namespace cells run in), not %s"
                            % type(namespace).__name__)
        self.store = store
        self.namespace = namespace
        self._state = {}  # name -> _VarState
        self._owner = {}  # export key -> (name, kind, index, obj), for every variable in _state
        self._mem = MemIndex()  # CPU memory of the arrays and storages in _owner, by address
        self._graph = {}  # name -> (version, set of owner names), every committed variable of the session
        self._mapped = {}  # address -> (weakref to the mapping's ndarray, ref, nbytes)
        self._mapped_purge = 64
        self._devh = devsave.Hashes()  # device hashes of the payloads device storages were saved as
        self._put_dirty = True  # whether put_payload takes dirty= (regions known written)
        self._give_way = None  # during a save(give_way=...): its check
        # Restore CUDA tensors on the CPU without asking CUDA anything: the kernel process, which must
        # never hold a CUDA context (only workers do), sets this.
        self.cpu_only = False
        self._wp = wptrack.tracker()  # write tracking of this process's own big payloads
        self._untrackable = set()  # (address, nbytes) that arm() refused (shared memory, ...)
        self._region_bytes = getattr(sys.modules.get(type(store).__module__), "REGION_BYTES", 2 << 20)

    # ---- queries -------------------------------------------------------------------------------------
    def versions(self):
        """{name: version} of every committed variable of the session."""
        return self.store.versions()

    def held(self):
        """{name: version} the namespace holds (saved or restored by this Checkpointer)."""
        return {n: s.version for n, s in self._state.items() if n in self.namespace}

    def known(self):
        """Names of every committed variable of the session as this Checkpointer last read the store (its
        saves and restores read them), whether or not it holds them."""
        return sorted(self._graph)

    def version(self, name):
        """The version of NAME this Checkpointer last saved or restored, whether or not the namespace still
        binds it; None when it holds none."""
        st = self._state.get(name)
        return st.version if st is not None else None

    def references(self, name):
        """The variables whose objects NAME's version held here references (its stream's owners); () when
        this process holds no version of NAME."""
        st = self._state.get(name)
        return tuple(st.deps) if st is not None else ()

    def payload_refs(self, name):
        """The payload refs of NAME's version held here; () when this process holds none."""
        st = self._state.get(name)
        return tuple(st.prefs) if st is not None else ()

    def sharing(self):
        """(exports, refs graph), read-only: {export key: (name, kind, index, obj)} of every variable held
        here, and {name: (version, names its stream references)} of every committed variable.  For finding
        which variables share objects (homes.tied)."""
        return self._owner, self._graph

    def forget(self, names=None):
        """Drop what this process knows of NAMES (default: all) - held versions, exported objects (which
        it keeps alive), write tracking - without touching the store; e.g. after the namespace is reset.
        A later save of such a name writes its payloads in full; a restore loads it again."""
        for n in list(self._state) if names is None else _names(names):
            self._forget(n)

    def _forget(self, name):
        st = self._state.get(name)
        if st is not None:
            for tr in st.track.values():
                if tr.sub is not None:
                    self._wp.unsubscribe(tr.sub)  # its writes need not fault any more
        self._drop_exports(name)

    # ---- bookkeeping ---------------------------------------------------------------------------------
    def _install(self, name, state):
        self._drop_exports(name)
        self._state[name] = state
        for (kind, idx), obj in state.exports.items():
            key = storage_key(obj) if kind == "p" and _is_storage(obj) else id(obj)
            self._owner[key] = (name, kind, idx, obj)
            self._mem.add(key, obj)

    def _drop_exports(self, name):
        st = self._state.pop(name, None)
        if st is None:
            return
        for (kind, idx), obj in st.exports.items():
            key = storage_key(obj) if kind == "p" and _is_storage(obj) else id(obj)
            own = self._owner.get(key)
            if own is not None and own[0] == name:
                del self._owner[key]
                self._mem.discard(key)

    def _sync_graph(self):
        """Bring the refs graph of the whole session up to date (entries other processes committed)."""
        vers = self.store.versions()
        stale = [n for n, v in vers.items() if self._graph.get(n, (None,))[0] != v]
        for i in range(0, len(stale), 4096):
            for n, e in self.store.fetch(stale[i:i + 4096]).items():
                try:
                    hdr, _ = split_blob(e[1])
                    hard = set(hdr.get("hard", ()))
                except Exception:
                    hard = set(e[3])
                self._graph[n] = (e[0], hard)
        for n in [n for n in self._graph if n not in vers]:
            del self._graph[n]
        return vers

    def _stable_order(self, order):
        """ORDER with every variable after the owners it referenced at its last commit, so ownership (and
        with it every blob) stays the same from one save to the next when nothing changed."""
        pos = {n: i for i, n in enumerate(order)}
        out, seen = [], set()

        def visit(n):
            if n in seen:
                return
            seen.add(n)
            for d in sorted(self._graph.get(n, (0, ()))[1], key=lambda d: pos.get(d, -1)):
                if d in pos:
                    visit(d)
            out.append(n)

        for n in order:
            visit(n)
        visit = None  # a recursive closure is a reference cycle that would keep self alive until gc
        return out

    def _dependents(self, names):
        if not names:
            return set()  # (the scan costs O(variables): a batch of many new names changed nothing)
        return {v for v, (_, deps) in self._graph.items() if deps & names}

    def _exports_changed(self, name, pk):
        st = self._state.get(name)
        gv = self._graph.get(name)
        if st is None:
            return gv is not None  # committed by someone else: its references are not ours to trust
        if gv is not None and gv[0] != st.version:
            return True
        if st.hash != pk.hash or len(st.exports) != len(pk.exports):
            return True
        old = st.exports
        for _, kind, idx, obj in pk.exports:
            if old.get((kind, idx)) is not obj:
                return True
        return False

    # ---- save ----------------------------------------------------------------------------------------
    def save(self, names, cell_id=None, stand_in=None, all_or_none=False, sync=True, give_way=None):
        """Save NAMES (see _save).  GIVE_WAY, when given, is called before each variable is pickled, before
        each payload is put and between the pieces of a large one (_put_in_pieces), and right before the
        commit: it raises (a BaseException, like KeyboardInterrupt) to abandon the save, which then commits
        nothing and gives back every payload it wrote (the kernel's background commit, which must never
        hold up a cell: looseleaf_kernel/coherence.py, commit_slow)."""
        ctxs = self._save_ctxs = []
        self._give_way = give_way
        try:
            return self._save(names, cell_id, stand_in, all_or_none, sync)
        finally:
            self._give_way = None
            # A save's context and its pickler refer to each other: left to the cyclic GC, the objects the
            # context indexes (arrays over a mapping of a version this process read) would keep that
            # version's leases, and with them its pool space, until a collection happens to run.
            for ctx in ctxs:
                ctx.close()
            self._save_ctxs = None

    def _save(self, names, cell_id=None, stand_in=None, all_or_none=False, sync=True):
        """Save NAMES (absent from the namespace = delete) and whatever must go with them; one commit.
        Returns a SaveReport; never raises for a variable that cannot be saved.  STAND_IN(name, value, why),
        when given, is asked for an object to commit instead of a value that cannot be pickled (None: the
        variable fails as usual); the namespace keeps the value.  ALL_OR_NONE: a variable the store cannot
        take (no room in the pool, Redis unavailable) fails the whole save: nothing is committed and every
        payload this save wrote is given back (a variable that cannot be pickled is still only left out).
        An interrupt (KeyboardInterrupt) commits nothing either, and propagates.  SYNC=False skips reading
        what other processes committed (every version of the session: O(variables)), for the second and later
        saves of one batch that nobody else commits during (the kernel's, coherence.Coherence._save_batched)."""
        t0 = time.perf_counter()
        names = _names(names)
        rep = SaveReport()
        ns = self.namespace
        if cell_id is None:
            cell_id = "save-%d-%d" % (os.getpid(), next(_cell_counter))
        try:
            if sync or not self._graph:
                self._sync_graph()
        except Exception as e:
            rep.error, rep.error_kind = _reason(e), type(e).__name__
            rep.failed = {n: rep.error for n in names}
            rep.seconds = time.perf_counter() - t0
            return rep
        deletes = [n for n in names if n not in ns and n in self._graph]
        for n in names:
            if n not in ns:
                self._forget(n)
        order = [n for n in names if n in ns]
        unrestorable = {}
        for _attempt in range(10000):
            order = self._stable_order(order)
            saving = set(order)
            ctx = SaveContext(ns, self._owner, saving, self._mem)
            self._save_ctxs.append(ctx)
            res, failed, need, standins = {}, {}, None, {}
            for n in order:
                if self._give_way is not None:
                    self._give_way()
                try:
                    pk = pickle_var(ctx, n, ns[n])
                except NeedOwner as e:
                    need = e.name
                    break
                except Exception as e:
                    sub = stand_in(n, ns[n], _reason(e)) if stand_in is not None else None
                    if sub is None:
                        failed[n] = _reason(e)
                        continue
                    standins[n] = _reason(e)
                    try:
                        pk = pickle_var(ctx, n, sub)
                    except NeedOwner as e2:
                        need = e2.name
                        break
                    except Exception as e2:
                        failed[n] = _reason(e2)
                        continue
                res[n] = pk
                for key, kind, idx, obj in pk.exports:
                    ctx.cur.setdefault(key, (n, kind, idx, obj))
            if need is not None:
                if need in ns:
                    order.insert(0, need)
                else:
                    # Deleted from the namespace without a save: its old objects have no owner any more.
                    self._drop_exports(need)
                continue
            changed = {n for n in res if self._exports_changed(n, res[n])} | set(deletes)
            extra = [d for d in sorted(self._dependents(changed)) if d not in saving and d not in unrestorable
                     and d not in deletes]
            if not extra:
                break
            for d in extra:
                if d not in ns:
                    r = self.restore([d], protect=saving)
                    if d in r.failed or d not in ns:
                        unrestorable[d] = r.failed.get(d, "not restorable")
                        continue
                order.append(d)
        failed.update(unrestorable)
        if unrestorable:
            # Their streams name objects of these owners by memo index: committing an owner's new
            # exports (or deleting it) without re-saving them would leave them pointing at other objects.
            for n in sorted(changed):
                stuck = sorted(d for d in self._dependents({n}) if d in unrestorable)
                if stuck:
                    why = "its committed dependents %s could not be re-saved with it" % ", ".join(stuck)
                    if n in deletes:
                        deletes.remove(n)
                    res.pop(n, None)
                    failed[n] = why
        asked = set(names)
        rep.added = [n for n in order if n not in asked]

        writes, fresh, pmeta, ok, tracks = {}, [], {}, {}, {}
        for n in order:
            pk = res.get(n)
            if pk is None:
                continue
            bad = sorted(d for d in pk.deps if d in failed or d not in ok)
            if bad:
                failed[n] = "references objects of %s, which could not be saved" % ", ".join(bad)
                continue
            try:
                prefs, written, new, tracks[n] = self._put_payloads(n, pk)
            except Exception as e:
                failed[n] = _reason(e)
                if all_or_none and _store_error(e):
                    self._discard(fresh)
                    rep.error_kind = type(e).__name__
                    rep.error = "%s: %s could not be saved (%s); nothing of this save was committed" % (
                        rep.error_kind, n, e)
                    rep.failed = dict(failed, **{m: rep.error for m in ok})
                    rep.seconds = time.perf_counter() - t0
                    return rep
                continue
            except BaseException:  # KeyboardInterrupt: nothing is committed, give the space back
                self._discard(fresh)
                raise
            fresh += new
            rep.bytes_written += written
            rep.payload_bytes += sum(m[1] for m, _ in pk.payloads)
            ok[n] = prefs
            st = self._state.get(n)
            gv = self._graph.get(n)
            if pk.graph:
                rep.graphs.append(n)
            if (st is not None and gv is not None and gv[0] == st.version and st.hash == pk.hash
                    and st.prefs == prefs and st.deps == pk.deps):
                rep.unchanged.append(n)
                continue
            refs = sorted(pk.deps) + sorted(s for s in pk.soft if s not in pk.deps and s != n)
            writes[n] = (pk.blob, prefs, refs)
            pmeta[n] = [m for m, _ in pk.payloads]
        rep.failed = failed
        rep.standins = {n: why for n, why in standins.items() if n in ok}

        versions = {}
        if writes or deletes:
            try:
                if self._give_way is not None:
                    self._give_way()  # the last point where abandoning costs nothing but the copies
                versions = self.store.commit(cell_id, writes, deletes)
            except BaseException as e:
                self._discard(fresh)
                if not isinstance(e, Exception):
                    raise
                rep.error_kind = type(e).__name__
                rep.error = "commit failed, nothing saved: " + _reason(e)
                for n in writes:
                    rep.failed[n] = rep.error
                rep.seconds = time.perf_counter() - t0
                return rep
        committed = {r for w in writes.values() for r in w[1]}
        self._discard(r for r in fresh if str(r) not in committed)  # holds that kept bases' regions
        if any(str(r) in committed for r in fresh) or deletes:
            # Superseded payloads go back to the free list now (~0.5 ms), so the next save reuses
            # regions this process already faulted in instead of touching fresh ones.
            try:
                self.store.gc()
            except Exception:
                pass
        for n in ok:
            for tr in tracks[n].values():
                if tr.sub is not None:
                    tr.sub.dirty -= tr.used  # those regions are in the committed payload now
                    tr.used = ()
        for n in deletes:
            self._graph.pop(n, None)
            rep.deleted.append(n)
        for n, prefs in ok.items():
            pk = res[n]
            exports = {(kind, idx): obj for _, kind, idx, obj in pk.exports}
            if n in writes:
                v = versions[n]
                self._install(n, _VarState(v, pk.hash, prefs, pmeta[n], set(pk.deps), exports, tracks[n]))
                self._graph[n] = (v, set(pk.deps))
                rep.saved[n] = v
            else:
                st = self._state[n]
                # Drop the exports the state had *before* replacing them: _install drops the exports of the
                # state it finds, which would be the new ones by then, and the old objects (arrays over a
                # mapping of an old version) would stay indexed, holding that version's leases for ever.
                self._drop_exports(n)
                st.exports = exports
                st.track = tracks[n]
                self._install(n, st)
        if len(self._devh):
            self._devh.keep(r for st in self._state.values() for r in st.prefs)
        rep.seconds = time.perf_counter() - t0
        return rep

    def _discard(self, refs):
        for r in refs:
            try:
                self.store.discard(r)
            except Exception:
                pass

    def _put(self, buf, base, dirty):
        if self._give_way is not None:
            self._give_way()
            if memoryview(buf).nbytes > _PIECE_BYTES:
                return self._put_in_pieces(buf, base, dirty)
        if dirty is not None and self._put_dirty:
            try:
                return self.store.put_payload(buf, base=base, dirty=dirty)
            except TypeError:
                self._put_dirty = False  # an _llstore without region hints: hash every region
        try:
            return self.store.put_payload(buf, base=base)
        except Exception as e:
            if base is None or type(e).__name__ != "PayloadGoneError":
                raise
            # The base was superseded by another process's commit and reclaimed: write it all.
            return self.store.put_payload(buf)

    def _put_in_pieces(self, buf, base, dirty):
        """_put, through a payload writer in pieces of about _PIECE_BYTES, asking _give_way between them: a
        save that may give way holds up what it gives way to by one piece's copy at most (~10 ms), not the
        whole payload's.  Same results as put_payload; abandoned, the writer gives its regions back."""
        try:
            w = self.store.payload_writer(memoryview(buf).nbytes, base=base,
                                          dirty=dirty if self._put_dirty else None)
        except Exception as e:
            if base is None or type(e).__name__ != "PayloadGoneError":
                raise
            w = self.store.payload_writer(memoryview(buf).nbytes)
        try:
            mv = memoryview(buf).cast("B")
            per = max(1, _PIECE_BYTES // self._region_bytes)
            needed = sorted(w.needed)
            i = 0
            while i < len(needed):
                run = [needed[i]]  # consecutive regions, one contiguous slice of BUF
                while len(run) < per and i + len(run) < len(needed) and needed[i + len(run)] == run[-1] + 1:
                    run.append(needed[i + len(run)])
                w.write(run, mv[run[0] * self._region_bytes:(run[-1] + 1) * self._region_bytes])
                i += len(run)
                if i < len(needed):
                    self._give_way()
            return w.finish()
        except BaseException:
            w.abort()
            raise

    def _payload_buffer(self, meta, obj):
        if meta[0] != "s":
            return obj
        torch = sys.modules["torch"]
        n = meta[1]
        return torch.empty(0, dtype=torch.uint8, device=obj.device).set_(obj, 0, (n,), (1,)).numpy()

    def _put_device(self, meta, obj, base):
        """Device storage OBJ against BASE (devsave.py: hashed on the device, only changed regions copied,
        through the staging pair).  Returns (the ref to commit, bytes written, a fresh ref or None)."""
        torch = sys.modules["torch"]
        n = meta[1]
        u = torch.empty(0, dtype=torch.uint8, device=obj.device).set_(obj, 0, (n,), (1,))
        r, h = devsave.save(torch, self.store, u, base, self._devh)
        if r is None:
            return base, 0, None  # no region changed: BASE stands, its hashes too
        if base is not None and r.written == 0:
            committed, written = base, 0  # same bytes after all: r is held until the commit
        else:
            committed, written = str(r), r.written
        if h is not None:
            self._devh.put(committed, n, h)
        return committed, written, r

    def _own_memory(self, meta, obj):
        """(holder, address) when payload OBJ is big memory this process owns privately and can track."""
        if meta[1] < TRACK_MIN_BYTES or not self._wp.available():
            return None
        if meta[0] == "n":
            a = obj.obj
            if type(a) is np.ndarray and a.flags.owndata and a.base is None:
                return a, a.__array_interface__["data"][0]
        elif meta[0] == "s" and obj.device.type == "cpu" and not _pinned(obj):
            return obj, obj.data_ptr()
        return None

    @staticmethod
    def _same_owner(rec, holder, addr, nbytes):
        if rec.addr != addr or rec.nbytes != nbytes:
            return False
        if rec.holder is holder:
            return True
        cdata = getattr(holder, "_cdata", None)  # a torch storage: a new wrapper for the same storage
        return cdata is not None and getattr(rec.holder, "_cdata", None) == cdata

    def _put_payloads(self, name, pk):
        """Put the payloads of PK.  Returns (refs, bytes written, fresh refs to release after the commit,
        {slot: _Track} for the new state)."""
        st = self._state.get(name)
        oldp = st.prefs if st is not None else []
        oldm = st.pmeta if st is not None else []
        oldt = st.track if st is not None else {}
        out, new, written, tracks = [], [], 0, {}
        made = []  # subscriptions this call started: an abandoned save must not leave them tracking
        try:
            for k, (meta, obj) in enumerate(pk.payloads):
                base = oldp[k] if k < len(oldp) and tuple(oldm[k]) == tuple(meta) else None
                if meta[0] == "s" and devsave.is_device_payload(obj):
                    ref, w, r = self._put_device(meta, obj, base)
                    out.append(ref)
                    written += w
                    if r is not None:
                        new.append(r)
                    continue
                buf = self._payload_buffer(meta, obj)
                own = self._own_memory(meta, obj)
                rec = oldt.get(k)
                same = own is not None and rec is not None and self._same_owner(rec, own[0], own[1], meta[1])
                sub = rec.sub if same and base is not None and rec.ref == base else None
                busy = same and rec.sub is None  # found rewritten wholesale lately: left untracked
                dirty = None
                if base is not None:
                    dirty = self._written_regions(buf, base, meta[1])  # a restored mapping?
                    if dirty is not None:
                        own = sub = None  # shared with the pool: pagemap tells, write tracking cannot
                    elif sub is not None:
                        dirty = self._wp.written(sub, self._region_bytes)
                        if dirty is None:
                            sub = None
                if (own is not None and sub is None and not busy
                        and (own[1], meta[1]) not in self._untrackable):
                    # Start tracking before the copy, so a write during it shows next time.
                    sub = self._wp.subscribe(own[1], meta[1])
                    if sub is not None:
                        made.append(sub)
                    if sub is None:
                        if len(self._untrackable) > 4096:
                            self._untrackable.clear()
                        self._untrackable.add((own[1], meta[1]))  # do not read /proc/self/maps again
                nregions = -(-meta[1] // self._region_bytes)
                if sub is not None and dirty is not None and 2 * len(dirty) > nregions:
                    # Rewritten wholesale: tracking would only cost the next cell a fault per page.
                    self._wp.unsubscribe(sub)
                    sub, busy = None, True
                if dirty == []:
                    out.append(base)  # nobody wrote it since it was committed: no copy, no hashing
                else:
                    r = self._put(buf, base, dirty)
                    new.append(r)
                    if base is not None and r.written == 0:
                        # Same bytes as the committed base: commit the base ref (no new version); r,
                        # which shares its regions, is held until the commit so they cannot be reclaimed.
                        out.append(base)
                    else:
                        out.append(str(r))
                        written += r.written
                    if busy and dirty is None and base is not None and 10 * r.written <= meta[1]:
                        busy = False  # calm again: track it from the next save on
                if sub is not None:
                    tracks[k] = _Track(own[1], meta[1], own[0], out[-1], sub, set(dirty or ()))
                elif busy and own is not None:
                    tracks[k] = _Track(own[1], meta[1], own[0], out[-1], None, ())
        except BaseException:
            for r in new:
                try:
                    self.store.discard(r)
                except Exception:
                    pass
            for sub in made:
                self._wp.unsubscribe(sub)
            raise
        return out, written, new, tracks

    def _written_regions(self, buf, base, nbytes):
        """If BUF is this process's private mapping of payload BASE: the indices of the 2 MiB regions it
        wrote since mapping it ([] = untouched).  None when BUF is anything else."""
        if nbytes <= 0 or not self._mapped:
            return None
        addr = np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0]
        m = self._mapped.get(addr)
        if m is None or m[0]() is None or m[1] != base or m[2] != nbytes:
            return None
        return pagemap.written_regions(addr, nbytes, self._region_bytes)

    # ---- restore -------------------------------------------------------------------------------------
    def _fetch_closure(self, names):
        """Entries of NAMES and of everything they reference.  The read that is returned is one atomic
        fetch whose entries reference nothing outside it, so it never mixes two commits."""
        want = list(dict.fromkeys(names))
        asked = set(want)
        for _ in range(1000):
            snap = self.store.fetch(want)
            more = [r for e in snap.values() for r in e[3] if r not in asked]
            if not more:
                return snap
            for r in more:
                if r not in asked:
                    asked.add(r)
                    want.append(r)
        raise RuntimeError("the store kept changing while reading the closure of %r" % (names,))

    def _map(self, ref, nbytes):
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8)
        mv = self.store.map_payload(ref, writable=True)
        base = np.frombuffer(mv, dtype=np.uint8)
        addr = base.__array_interface__["data"][0]
        if len(self._mapped) >= self._mapped_purge:
            self._mapped = {a: m for a, m in self._mapped.items() if m[0]() is not None}
            self._mapped_purge = max(64, 2 * len(self._mapped))
        self._mapped[addr] = (weakref.ref(base), str(ref), nbytes)
        return base

    def _storage_from(self, name, meta, base, rep):
        torch = sys.modules.get("torch") or __import__("torch")
        t = torch.from_numpy(base) if base.size else torch.empty(0, dtype=torch.uint8)
        device = meta[3]
        if device.startswith("cuda"):
            if not self.cpu_only and torch.cuda.is_available():
                t = devsave.to_device(torch, t, device)
                self._hash_restored(base, t)
            else:
                rep.warnings.append("%s: a %s tensor was restored on the CPU (no CUDA here)" % (name, device))
        elif device == "cpu" and devsave.is_device_payload(t):
            self._hash_restored(base, t)  # (LL_STORE_DEVSAVE=cpu: tests of the device path)
        u = untyped_storage(t)
        if u.device.type != device.split(":")[0] and base.size:
            remember_device(u, device, base)  # saved again from here, it is still a device tensor
        return u

    def _hash_restored(self, base, t):
        """Device hashes of T, restored from the payload mapped at BASE: saved unchanged, it moves no byte."""
        if not base.size:
            return
        m = self._mapped.get(base.__array_interface__["data"][0])
        if m is not None and m[0]() is base:
            self._devh.put(m[1], m[2], devsave.region_hashes(sys.modules["torch"], t))

    def _load_one(self, name, entry, resolve, rep):
        version, blob, prefs, refs = entry
        hdr, stream = split_blob(blob)
        pays = hdr["pay"]
        if len(pays) != len(prefs):
            raise ValueError("%s: %d payloads described, %d stored" % (name, len(pays), len(prefs)))
        bases = [self._map(r, m[1]) for m, r in zip(pays, prefs)]
        rep.payload_bytes += sum(m[1] for m in pays)
        oob = [memoryview(b) for m, b in zip(pays, bases) if m[0] == "n"]
        if "stream" in hdr:
            stream = memoryview(bases[hdr["stream"]])

        def local(k):
            meta = pays[k]
            if meta[0] == "b":
                return bytes(bases[k])
            if meta[0] == "a":
                return bytearray(bases[k])
            if meta[0] == "s":
                return self._storage_from(name, meta, bases[k], rep)
            raise ValueError("%s: payload %d of kind %r is not a persistent object" % (name, k, meta[0]))

        u = Unpickler(stream, self.namespace, resolve, local, oob)
        value = u.load()
        exports = {(kind, idx): obj for _, kind, idx, obj in u.exports()}
        return value, _VarState(version, blob_digest(blob), list(prefs), pays, set(hdr.get("hard", ())), exports)

    def restore(self, names, held=None, protect=()):
        """Bind NAMES and everything they reference into the namespace, each shared object once, owners
        first.  A name whose committed version equals the held one (HELD, default: what this Checkpointer
        saved or restored) is skipped.  Names in PROTECT are loaded if needed but never bound (a save uses
        it to restore a dependent without overwriting the values it is saving)."""
        names = _names(names)
        done = {}
        for _attempt in range(3):
            rep = self._restore(names, held, protect)
            for n, v in done.items():
                rep.restored.setdefault(n, v)
            if not any(why.startswith("PayloadGoneError") for why in rep.failed.values()):
                break
            # Another process committed a newer version between our fetch and map, and reclaiming the
            # old one freed its regions: read the (new) closure again.
            done = dict(rep.restored)
        return rep

    def _restore(self, names, held, protect):
        t0 = time.perf_counter()
        rep = RestoreReport()
        ns = self.namespace
        try:
            entries = self._fetch_closure(names)
        except Exception as e:
            rep.failed = {n: _reason(e) for n in names}
            rep.seconds = time.perf_counter() - t0
            return rep
        rep.missing = [n for n in names if n not in entries]

        def is_held(n):
            st = self._state.get(n)
            v = entries[n][0]
            if st is None or st.version != v or n not in ns:
                return False
            return held is None or held.get(n) == v

        load = {n for n in entries if not is_held(n)}
        # A held variable that references a reloaded one would keep the old objects: reload it too.
        for _ in range(1000):
            more = {v for v, st in self._state.items() if v not in load and v in ns and st.deps & load}
            if not more:
                break
            try:
                entries = self._fetch_closure(list(entries) + sorted(more))
            except Exception as e:
                rep.failed = {n: _reason(e) for n in names}
                rep.seconds = time.perf_counter() - t0
                return rep
            load |= {n for n in entries if not is_held(n)} | (more & set(entries))
        rep.skipped = sorted(n for n in entries if n not in load)

        hard = {}
        for n in load:
            try:
                hard[n] = set(split_blob(entries[n][1])[0].get("hard", ()))
            except Exception as e:
                rep.failed[n] = _reason(e)
        order, seen = [], set()

        def visit(n, stack):
            if n in seen or n not in hard:
                return
            if n in stack:
                return  # refs are acyclic by construction; a cycle would come from a foreign writer
            stack.add(n)
            for d in sorted(hard[n]):
                visit(d, stack)
            stack.discard(n)
            seen.add(n)
            order.append(n)

        for n in sorted(hard):
            visit(n, set())
        visit = None  # break the recursive closure's cycle (it holds self)

        overlay, loaded = {}, {}

        def resolve(owner, kind, idx):
            ex = overlay.get(owner)
            if ex is None:
                st = self._state.get(owner)
                ex = st.exports if st is not None else None
            if ex is None:
                raise LookupError("variable %r is not available to resolve a shared object" % owner)
            try:
                return ex[(kind, idx)]
            except KeyError:
                raise LookupError("variable %r has no shared object %s%d (stale reference)"
                                  % (owner, kind, idx)) from None

        for n in order:
            bad = sorted(d for d in hard[n] if d in rep.failed or (d not in entries))
            if bad:
                rep.failed[n] = "references %s, which could not be restored" % ", ".join(bad)
                continue
            try:
                value, st = self._load_one(n, entries[n], resolve, rep)
            except Exception as e:
                rep.failed[n] = _reason(e)
                continue
            overlay[n] = st.exports
            loaded[n] = (value, st)
        for n, (value, st) in loaded.items():
            if n in protect:
                continue
            ns[n] = value
            self._install(n, st)
            self._graph[n] = (st.version, st.deps)
            rep.restored[n] = st.version
        rep.seconds = time.perf_counter() - t0
        return rep

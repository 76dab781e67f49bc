"""looseleaf_store.serial: pickle one variable at a time, yet keep the objects variables share.

Runs in whichever process saves or restores a notebook's variables (the kernel's embedded interpreter, a GPU
worker), on the thread that runs cells.  Nothing here talks to the store: the Checkpointer (checkpoint.py)
hands streams and payload buffers to `_llstore` and maps payloads back.

DESIGN
Each variable is pickled on its own (protocol 5, the C `_pickle` Pickler through cloudpickle's subclass, so
functions and classes defined in cells go by value; small immutable values stay in the stream).  Hooks
(persistent_id, buffer_callback, reducer_override) take things out of the stream:

* Payloads.  Out-of-band PickleBuffers (numpy arrays, pandas blocks: anything protocol 5 exports), torch
  storages (caught by `persistent_id` on the TypedStorage every tensor reduce hands over; keyed by the
  StorageImpl pointer so a view and its base name ONE storage) and bytes/bytearray of at least
  `BIG_BYTES` become entries of the variable's payload list.  The stream keeps only `('P', k)` or a
  NEXT_BUFFER opcode; the bytes go to the pool.  Tensors are reduced by `_reduce_tensor` so dtype, size,
  stride, storage offset, requires_grad, grad and the Parameter class survive and restore is
  `tensor.set_(storage, ...)` over the mapped payload: no copy.

* Sharing across variables: an object-ownership table.  After a variable is pickled, the pickler's memo
  says which objects it contains and at which memo index; every identity-bearing object in it (lists,
  dicts, instances, tensors, arrays, cell-defined functions and classes - not strings, numbers, tuples or
  things pickled by reference such as modules and library classes) is *exported* by that variable under
  its memo index.  When a later variable reaches an exported object, `persistent_id` writes
  `('R', owner, index)` instead of the object (`('Q', owner, k)` for an owner's payload object such as a
  torch storage), and the owner's name goes into the variable's refs.  Memo indices are the same on both
  sides of pickle (MEMOIZE opcodes number objects in stream order), so after the owner is unpickled its
  Unpickler memo maps the index back to the object: `optimizer.param_groups[0]['params'][0] is
  model.weight` holds after restoring `model` and `optimizer` separately, two names for one list are one
  list, and cycles inside a variable are ordinary pickle memo cycles.
  References only ever point to variables pickled earlier in the same save (or to committed variables the
  Checkpointer pulls into the save), so the refs graph is acyclic and restore loads owners first.

* Values with a state protocol.  One registry (REDUCERS, register_reducer) says how a type without usable
  pickle support of its own is saved through its state (torch.Generator: get_state / set_state, its device
  kept); every pickle of a variable, in the kernel and in workers, consults it.  A tensor's backward hooks
  (a leaf's `_backward_hooks`) go with it, so `h.remove()` of a handle saved alongside still works.

* Memory shared between variables.  A tensor over a numpy array's memory (`torch.from_numpy(a)`), an
  array over a tensor's storage (`t.numpy()`) and an array over a bytearray (`np.frombuffer`) are rebuilt
  over the memory of the object they view, which its owner exports like any shared object (MemIndex: the
  CPU memory of arrays and storages exported so far, by address).  So they share memory after restore,
  and saving one pulls its owner into the save (NeedOwner): a write through either name moves the version
  of both.

* Graphs.  A tensor with autograd history (grad_fn) is saved as a leaf with its data; the pickle notes it
  (Pickled.graph) so that the process holding the live graph can keep serving it (checkpoint.py).

* User modules.  A module imported from the user's own files, pickled as a variable of its own
  (usermods.py), goes by the value of its globals, with a fingerprint of its code so that a process whose
  copy is older reloads it.

* Big structures.  A stream longer than STREAM_INLINE_MAX (a long list, an object array) is itself a
  payload (kind "x"), so Redis only ever holds small blobs and an unchanged structure costs no bytes.

* The namespace.  A function defined in a cell keeps the notebook namespace as its globals: the namespace
  dict is the persistent id `('G',)`, and the globals the function reads are not pickled into it (they
  are variables of their own, listed as "soft" dependencies); only module globals are kept.

LIMITS
* Ownership is by memo index, so a variable's stream is only valid together with the owners it names at
  the versions committed with it.  The Checkpointer keeps that true by re-pickling the dependents of every
  variable whose exports changed, in the same commit.
* A numpy view shares memory with its base after restore when the base is saved too (or the view covers
  at least half of it); a small view of an array nobody saves is stored as a copy of the view.
* Non-leaf tensors come back as leaves (autograd history is not state; Pickled.graph says it was there).  Tensor subclasses other than Parameter, sparse and quantized tensors
  use torch's own reduce (their storages still leave the stream).
* Objects pickle cannot handle (open files, sockets, generators, locks) fail their variable only, and
  every variable of the same save that references them.
* Exports hold their objects alive (ids must stay unique): see checkpoint.py.
"""
import bisect
import enum
import hashlib
import io
import pickle
import struct
import sys
import types
import warnings
import weakref

import _pickle
import collections
import importlib

import cloudpickle
from cloudpickle.cloudpickle import _make_empty_cell, _should_pickle_by_reference

# Store entries of user modules' globals (usermods.ENTRY_PREFIX; not imported: usermods is imported lazily).
MODULE_ENTRY_PREFIX = "__looseleaf_module__."
# cloudpickle's function and code reduces: in cloudpickle.cloudpickle since 3.0, in cloudpickle_fast before
# (which 3.x keeps only as a deprecated alias).
_cpf = cloudpickle.cloudpickle if hasattr(cloudpickle.cloudpickle, "_function_getstate") else \
    importlib.import_module("cloudpickle.cloudpickle_fast")


def _code_reduce(code):
    """cloudpickle's reduce of a code object, keeping its file name (cloudpickle 3 writes "<dynamic-code>"
    there): a traceback through a function that another process of the session defined then shows the
    cell's source, which every process reads from the session's cell directory."""
    fn, args = _cpf._code_reduce(code)
    return fn, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)

# bytes/bytearray at least this long leave the stream (smaller ones cost less inline than a payload).
BIG_BYTES = 64 * 1024

# A pickle stream longer than this is stored as a payload (kind "x") instead of in the Redis blob.
STREAM_INLINE_MAX = 1 << 20

# Blob = MAGIC, u32 header length, header (plain pickle of a dict), stream.
_MAGIC = b"LLS1"
_HDR = struct.Struct("<4sI")

# Types that never carry identity a user could observe across variables (or that pickle by value anyway).
_PLAIN = {int, float, bool, type(None), str, tuple, complex}
_NOSHARE_BASES = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset, range, slice,
                  type(Ellipsis), type(NotImplemented), enum.Enum, types.ModuleType,
                  types.BuiltinFunctionType, types.CodeType, types.MethodType, types.MethodWrapperType,
                  types.WrapperDescriptorType, types.MethodDescriptorType, types.GetSetDescriptorType)
_share_cache = {}


class NeedOwner(Exception):
    """Raised inside a pickle: the variable reaches an object exported by committed variable NAME, which
    is not part of this save; the Checkpointer adds NAME to the save and pickles again."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


def _noshare_types():
    extra = []
    np = sys.modules.get("numpy")
    if np is not None:
        extra += [np.generic, np.dtype]
    torch = sys.modules.get("torch")
    if torch is not None:
        extra += [torch.dtype, torch.device, torch.layout, torch.memory_format, torch.finfo, torch.iinfo]
    return tuple(extra)


def shareable(obj):
    """Whether OBJ's identity matters across variables (so it is exported by its owner)."""
    t = type(obj)
    r = _share_cache.get(t)
    if r is None:
        if issubclass(t, _NOSHARE_BASES) or issubclass(t, _noshare_types()):
            r = 0
        elif issubclass(t, type) or t is types.FunctionType:
            r = 2  # decided per object: cell-defined ones only
        else:
            r = 1
        _share_cache[t] = r
    if r == 2:
        try:
            return not _should_pickle_by_reference(obj)
        except Exception:
            return False
    return r == 1


def torch_dtype(name):
    torch = sys.modules.get("torch") or __import__("torch")
    return getattr(torch, name.rsplit(".", 1)[-1])


def untyped_storage(t):
    """The UntypedStorage under tensor T (torch 2.x: Tensor.untyped_storage; torch 1.x: through the typed
    storage, which 2.x deprecates with a warning on every call)."""
    get = getattr(t, "untyped_storage", None)
    return get() if get is not None else t.storage().untyped()


def as_untyped(storage):
    """STORAGE (a TypedStorage from an older save, or an UntypedStorage) as an UntypedStorage."""
    torch = sys.modules.get("torch") or __import__("torch")
    return storage.untyped() if isinstance(storage, torch.storage.TypedStorage) else storage


def storage_key(storage):
    """The identity of a storage (its StorageImpl): every Python wrapper of one storage, and every view of one
    tensor, gets the same key, so sharing between variables is found."""
    return ("st", as_untyped(storage)._cdata)


# A device tensor restored where there is no device (the kernel restores on the CPU) is still a device tensor
# of the session: saved again from here, it goes back as one.  StorageImpl address -> (the device it was saved
# from, a weak reference to the memory under it: the entry is void once that memory is gone).
_restored_on = {}


def remember_device(storage, device, holder):
    """STORAGE (over HOLDER's memory) stands here for a storage of DEVICE."""
    if len(_restored_on) > 4096:
        for k in [k for k, (_, ref) in _restored_on.items() if ref() is None]:
            del _restored_on[k]
    _restored_on[storage._cdata] = (device, weakref.ref(holder))


def storage_device(storage):
    """The device STORAGE belongs to in the session (see remember_device), as a string."""
    e = _restored_on.get(storage._cdata)
    if e is not None:
        if e[1]() is not None:
            return e[0]
        del _restored_on[storage._cdata]
    return str(storage.device)


def _reduce_tensor(t):
    torch = sys.modules["torch"]
    cls = type(t)
    if cls is torch.Tensor:
        kind = 0
    elif cls is torch.nn.Parameter:
        kind = 1
    else:
        return NotImplemented
    if t.layout != torch.strided or t.is_quantized or t.is_meta:
        return NotImplemented
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    base = t._base
    if base is not None and kind == 0 and not t.requires_grad and not t.__dict__ and \
            type(base) is torch.Tensor and base.layout == torch.strided and not base.is_conj() \
            and not base.is_neg():
        # A view stays a view of its base (v._base is t after restore, as in the process that made it).
        return (_rebuild_view, (base, t.storage_offset(), tuple(t.size()), tuple(t.stride())))
    return (_rebuild_tensor, (untyped_storage(t),) + _tensor_args(t, kind))


def _tensor_args(t, kind):
    """What _rebuild_tensor needs of tensor T besides its storage."""
    leaf = t.is_leaf
    grad = t.grad if leaf else None
    state = dict(t.__dict__) if t.__dict__ else None
    # A leaf's backward hooks (the dict register_hook fills, which its handles point to); a non-leaf's hooks
    # live in its graph.
    hooks = t._backward_hooks if leaf and t._backward_hooks else None
    return (t.storage_offset(), tuple(t.size()), tuple(t.stride()), t.dtype, t.requires_grad, grad, kind,
            state, hooks)


def _rebuild_tensor(storage, offset, size, stride, dtype, requires_grad, grad, kind, state, hooks=None):
    torch = sys.modules.get("torch") or __import__("torch")
    u = as_untyped(storage)
    t = torch.empty(0, dtype=dtype, device=u.device).set_(u, offset, size, stride)
    if kind == 1:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if grad is not None:
        t.grad = grad
    if state:
        t.__dict__.update(state)
    if hooks:
        t._backward_hooks = hooks  # registers them with autograd, as register_hook would
    return t


def _rebuild_tensor_on_array(arr, byte_off, offset, size, stride, dtype, requires_grad, grad, kind, state,
                             hooks=None):
    """A CPU tensor over the memory of numpy array ARR (torch.from_numpy): its storage began BYTE_OFF bytes
    into ARR."""
    torch = sys.modules.get("torch") or __import__("torch")
    np = sys.modules.get("numpy") or __import__("numpy")
    flat = arr.reshape(-1, order="A").view(np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only array: torch warns that writes are undefined
        u = untyped_storage(torch.from_numpy(flat))
    item = torch.empty(0, dtype=dtype).element_size()
    return _rebuild_tensor(u, byte_off // item + offset, size, stride, dtype, requires_grad, grad, kind, state,
                           hooks)


def _rebuild_ndarray_on_storage(storage, byte_off, shape, strides, dtype, writeable):
    """A numpy array over the memory of a CPU torch STORAGE (t.numpy()), BYTE_OFF bytes into it."""
    torch = sys.modules.get("torch") or __import__("torch")
    np = sys.modules.get("numpy") or __import__("numpy")
    u = as_untyped(storage)
    whole = torch.empty(0, dtype=torch.uint8, device=u.device).set_(u, 0, (u.nbytes(),), (1,)).numpy()
    a = np.ndarray(shape, dtype, buffer=whole, offset=byte_off, strides=strides)
    if not writeable:
        a.flags.writeable = False
    return a


def _rebuild_frombuffer(obj, dtype, offset, shape, strides, writeable):
    """A numpy array over the buffer of OBJ (np.frombuffer of a bytearray or bytes): OBJ is the same object as
    the other names that hold it."""
    np = sys.modules.get("numpy") or __import__("numpy")
    a = np.ndarray(shape, dtype, buffer=obj, offset=offset, strides=strides)
    if not writeable and a.flags.writeable:
        a.flags.writeable = False
    return a


def _rebuild_view(base, offset, size, stride):
    return base.as_strided(size, stride, offset)


# ---- values with a state protocol ---------------------------------------------------------------------
# (type's __module__, type's __qualname__) -> reduce function (as __reduce__ returns).  A type whose own
# pickle support is missing or unusable (varies with library versions) but which can get and set its state
# is saved through this, in every process that saves variables.
REDUCERS = {}


def register_reducer(module, qualname, reduce):
    """Save values of the type named (MODULE, QUALNAME) through REDUCE(value) -> (callable, args)."""
    REDUCERS[(module, qualname)] = reduce


def _reduce_torch_generator(g):
    return (_rebuild_torch_generator, (str(g.device), g.get_state()))


def _rebuild_torch_generator(device, state):
    torch = sys.modules.get("torch") or __import__("torch")
    if device.startswith("cuda") and not torch.cuda.is_initialized():
        # The kernel (and a zygote) never initialises CUDA: such a generator is used where CUDA is.
        raise RuntimeError("a %s generator is restored only in a process that initialised CUDA" % device)
    g = torch.Generator(device=device)
    g.set_state(state)
    return g


register_reducer("torch._C", "Generator", _reduce_torch_generator)
register_reducer("torch", "Generator", _reduce_torch_generator)


class MemIndex:
    """CPU memory of exported objects (numpy arrays, torch storages), by address: which object's memory a
    new array or tensor lies in.  Entries are (start, end, obj) keyed by an export key."""

    def __init__(self):
        self._by_key = {}
        self._sorted = None

    def __len__(self):
        return len(self._by_key)

    def add(self, key, obj):
        r = memory_range(obj)
        if r is not None:
            self._by_key[key] = (r[0], r[1], obj)
            self._sorted = None

    def discard(self, key):
        if self._by_key.pop(key, None) is not None:
            self._sorted = None

    def find(self, start, end, skip=None, storages_only=False):
        """(start, end, obj) of the object whose memory holds [START, END) (the widest such), other than SKIP
        (and a torch storage when STORAGES_ONLY); None if none."""
        if not self._by_key or end <= start:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._by_key.values(), key=lambda e: (e[0], -e[1]))
            self._starts = [e[0] for e in self._sorted]
        i = bisect.bisect_right(self._starts, start)
        best = None
        for k in range(i - 1, max(i - 65, -1), -1):
            s0, e0, obj = self._sorted[k]
            if storages_only and type(obj).__module__ == "numpy":
                continue
            if s0 <= start and end <= e0 and obj is not skip and (best is None or e0 - s0 > best[1] - best[0]):
                best = (s0, e0, obj)
        return best


def memory_range(obj):
    """[start, end) of the CPU memory under OBJ (a contiguous numpy array, or a CPU torch storage), else None."""
    np = sys.modules.get("numpy")
    if np is not None and type(obj) is np.ndarray:
        if obj.nbytes == 0 or obj.dtype.hasobject or not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            return None
        p = obj.__array_interface__["data"][0]
        return (p, p + obj.nbytes)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, (torch.storage.TypedStorage, torch.storage.UntypedStorage)):
        u = as_untyped(obj)
        if u.device.type != "cpu" or u.nbytes() == 0:
            return None
        p = u.data_ptr()
        return (p, p + u.nbytes())
    return None


# id(flat array over a restored payload) -> the array _rebuild_ndarray built on it (weakly held: the
# flat array lives exactly as long as that array, its base, does).
_anchor_of = weakref.WeakValueDictionary()


def _rebuild_ndarray(buf, dtype, shape, order):
    np = sys.modules.get("numpy") or __import__("numpy")
    flat = np.frombuffer(buf, dtype=dtype)
    a = flat.reshape(shape, order=order)
    if a.base is flat:
        _anchor_of[id(flat)] = a
    return a


def _rebuild_ndarray_view(root, offset, shape, strides, dtype, writeable):
    np = sys.modules.get("numpy") or __import__("numpy")
    a = np.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    if not writeable:
        a.flags.writeable = False
    return a


def _make_function(code, globals, name, argdefs, closure):
    # cloudpickle's own _make_function would write its module's __builtins__ into the globals, which here
    # are the notebook namespace.
    return types.FunctionType(code, globals, name, argdefs, closure)


def _function_setstate_keep_builtins(obj, state):
    # cloudpickle's setstate writes its own module's __builtins__ into the function's globals, which here
    # are the notebook namespace: keep the namespace's own entry.
    g = obj.__globals__
    missing = object()
    old = g.get("__builtins__", missing)
    _cpf._function_setstate(obj, state)
    if old is not missing:
        g["__builtins__"] = old


def _byte_bounds(a):
    """[lo, hi) of the bytes numpy array A spans (its strides may be negative)."""
    lo = hi = a.__array_interface__["data"][0]
    for n, st in zip(a.shape, a.strides):
        if n == 0:
            return lo, lo
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize


class SaveContext:
    """State shared by the picklers of one save: who exports what."""

    def __init__(self, namespace, old_owner, saving, old_mem=None):
        self.namespace = namespace
        self.mem = MemIndex()  # CPU memory of the arrays and storages pickled so far in this save
        self.old_mem = old_mem if old_mem is not None else MemIndex()  # ... of committed variables' exports
        self.cur = {}  # key -> (owner, kind, index, obj): exports of variables pickled earlier in this save
        self.old = old_owner  # same, for committed variables (only consulted for names not in `saving`)
        self.saving = saving  # set of names being pickled in this save
        self.pickler = None  # the save's _Pickler, made on first use
        self.arrays = {}  # id -> base arrays pickled in this save (held, so ids stay unique)
        self.anchors = {}  # id(foreign buffer's flat array) -> the whole array standing for it
        np = sys.modules.get("numpy")
        # Arrays that are variables of this save: their views are saved as views whatever the order.
        self.top_arrays = set()
        if np is not None:
            self.top_arrays = {id(v) for v in (namespace.get(n) for n in saving) if type(v) is np.ndarray}


    def close(self):
        """Drop what this save held (the save is over): its pickler refers back to it, so the cycle would
        otherwise keep every object pickled until the cyclic GC runs."""
        self.pickler = None
        self.mem = MemIndex()
        self.old_mem = None
        self.cur = {}
        self.old = None
        self.arrays = {}
        self.anchors = {}
        self.namespace = None


class Pickled:
    """One variable's pickle: the blob to commit and what leaves the stream."""

    __slots__ = ("name", "blob", "payloads", "pobjs", "deps", "soft", "exports", "hash", "graph")

    def __init__(self, name, blob, payloads, pobjs, deps, soft, exports, graph=False):
        self.name = name
        self.blob = blob  # bytes: header + stream
        self.payloads = payloads  # [(meta, obj)]: meta = (kind, nbytes, ...); obj = buffer or storage
        self.pobjs = pobjs  # [(key, obj) or None] per payload: objects other variables may reference
        self.deps = deps  # set of owner names this stream references
        self.soft = soft  # set of global names cell functions read
        self.exports = exports  # [(key, kind, index, obj)]
        self.hash = blob_digest(blob)
        self.graph = graph  # it holds a tensor with autograd history (saved without it)


def _rebuild_memory_buffer(kind, value, pos):
    buf = kind(value)
    buf.seek(pos)
    return buf


class _Pickler(cloudpickle.CloudPickler):
    """One per save, reused for each variable (start() resets it): creating a pickler costs more than
    pickling a small variable."""

    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce}, cloudpickle.CloudPickler.dispatch_table)

    def __init__(self, file, ctx):
        super().__init__(file, protocol=5, buffer_callback=self._oob)
        self._file = file
        self._ctx = ctx
        self._np = sys.modules.get("numpy")
        torch = sys.modules.get("torch")
        self._torch = torch
        self._storage_types = (torch.storage.TypedStorage, torch.storage.UntypedStorage) if torch else ()

    def start(self):
        """Ready for the next variable: empty stream, memo, payload list and dependencies."""
        self._file.seek(0)
        self._file.truncate()
        self.clear_memo()
        self.globals_ref = {}
        self.payloads = []  # [(meta, buffer or storage)]
        self.pobjs = []  # per payload: (export key, object) or None
        self._pkey = {}  # local payload key -> index, so one object is one payload
        self.deps = set()
        self.soft = set()
        self.graph = False
        self.module_root = None  # a user module pickled as a variable of its own (usermods.py)

    def _oob(self, pb):
        raw = pb.raw()
        self.payloads.append((("n", raw.nbytes), raw))
        self.pobjs.append(None)
        return False

    def _local(self, key, meta, obj, export_obj):
        k = self._pkey.get(key)
        if k is None:
            k = len(self.payloads)
            self._pkey[key] = k
            self.payloads.append((meta, obj))
            self.pobjs.append((key, export_obj) if export_obj is not None else None)
        return ("P", k)

    def _owned(self, key, obj_check):
        ctx = self._ctx
        own = ctx.cur.get(key)
        if own is None:
            own = ctx.old.get(key)
            if own is None or not obj_check(own[3]):
                return None
            if own[0] not in ctx.saving:
                raise NeedOwner(own[0])
            return None  # the owner is re-pickled in this save; whoever reaches it first owns it now
        if not obj_check(own[3]):
            return None
        self.deps.add(own[0])
        return ("R" if own[1] == "o" else "Q", own[0], own[2])

    def persistent_id(self, obj):
        t = type(obj)
        if t in _PLAIN:
            return None
        if t is bytes:
            if len(obj) < BIG_BYTES:
                return None
            return self._local(("id", id(obj)), ("b", len(obj)), obj, None)
        if self._storage_types and isinstance(obj, self._storage_types):
            return self._storage(obj)
        ref = self._owned(id(obj), lambda o: o is obj)
        if ref is not None:
            return ref
        if obj is self._ctx.namespace:
            return ("G",)
        if t is bytearray and len(obj) >= BIG_BYTES:
            return self._local(id(obj), ("a", len(obj)), obj, obj)
        return None

    def _storage(self, obj):
        u = as_untyped(obj)
        key = storage_key(u)
        ref = self._owned(key, lambda o: storage_key(o) == key)
        if ref is not None:
            return ref
        self._ctx.mem.add(key, u)
        return self._local(key, ("s", u.nbytes(), "uint8", storage_device(u)), u, u)

    def _reduce_ndarray_whole(self, a):
        """A contiguous array whose bytes leave the stream (as numpy's own protocol-5 reduce), rebuilt
        by _rebuild_ndarray, which remembers it as the array standing for the mapped buffer."""
        if a.dtype.hasobject or not (a.flags.c_contiguous or a.flags.f_contiguous):
            return NotImplemented
        try:
            pb = pickle.PickleBuffer(a)
        except (ValueError, TypeError, BufferError):
            return NotImplemented  # e.g. datetime64: no buffer export, numpy's reduce copies it in-band
        self._ctx.arrays[id(a)] = a
        self._ctx.mem.add(id(a), a)
        order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
        return (_rebuild_ndarray, (pb, a.dtype, a.shape, order))

    def _reduce_ndarray_view(self, a):
        """A numpy view whose base array is (or will be) saved anyway becomes (base, offset, strides), so
        it shares memory with that base after restore, as torch views share storage.  A small view of a
        big array nobody else saves keeps numpy's own reduce (a copy of just the view)."""
        np = self._np
        root = a.base
        while isinstance(root.base, np.ndarray):
            root = root.base
        if a.dtype.hasobject or root.dtype.hasobject or not root.flags.c_contiguous:
            return NotImplemented
        rptr = root.__array_interface__["data"][0]
        offset = a.__array_interface__["data"][0] - rptr
        if offset < 0 or offset > root.nbytes:
            return NotImplemented
        if not root.flags.owndata:
            # A foreign buffer (a restored payload's mapping): the array rebuilt over it stands for it
            # (numpy makes every later view of it a view of the flat array underneath).
            ctx = self._ctx
            anchor = _anchor_of.get(id(root))
            if anchor is None:
                anchor = ctx.anchors.get(id(root))
            if anchor is None and (a.__array_interface__["data"][0] == rptr and a.nbytes == root.nbytes
                                   and a.flags.c_contiguous):
                anchor = ctx.anchors[id(root)] = a
            if anchor is a:
                return self._reduce_ndarray_whole(a)
            if anchor is not None:
                root = anchor  # same first byte as the flat array, so the offset holds
        rid = id(root)
        ctx = self._ctx
        known = rid in ctx.arrays or rid in ctx.cur or rid in ctx.old or rid in ctx.top_arrays
        if not known and root.nbytes > 2 * a.nbytes:
            return NotImplemented
        return (_rebuild_ndarray_view, (root, offset, a.shape, a.strides, a.dtype, a.flags.writeable))

    def _find_mem(self, lo, hi, skip, storages_only=False):
        """The exported array or storage whose memory holds [LO, HI), other than SKIP (this save's first)."""
        ctx = self._ctx
        return ctx.mem.find(lo, hi, skip, storages_only) or ctx.old_mem.find(lo, hi, skip, storages_only)

    def _reduce_ndarray_alias(self, a):
        """An array over memory another object owns: a tensor's storage (t.numpy()), a bytearray or bytes
        (np.frombuffer), or an exported array or storage found by address (torch.from_numpy(a) pickled
        first).  Rebuilt over that object, so they share memory after restore.  None otherwise."""
        np, torch = self._np, self._torch
        if a.dtype.hasobject:
            return None
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        b = root.base
        lo, hi = _byte_bounds(a)
        writeable = a.flags.writeable
        if torch is not None and isinstance(b, torch.Tensor):
            if b.device.type != "cpu":
                return None
            u = untyped_storage(b)
            off = a.__array_interface__["data"][0] - u.data_ptr()
            if lo < u.data_ptr() or hi > u.data_ptr() + u.nbytes():
                return None
            return (_rebuild_ndarray_on_storage, (u, off, a.shape, a.strides, a.dtype, writeable))
        if isinstance(b, memoryview):
            b = b.obj
        if type(b) in (bytearray, bytes):
            start = np.frombuffer(b, np.uint8).__array_interface__["data"][0] if len(b) else 0
            if lo < start or hi > start + len(b):
                return None
            return (_rebuild_frombuffer, (b, a.dtype, a.__array_interface__["data"][0] - start, a.shape, a.strides,
                                          writeable))
        # (Arrays over other arrays' memory are views: _reduce_ndarray_view knows them through .base.)
        found = self._find_mem(lo, hi, a, storages_only=True)
        if found is None:
            return None
        off = a.__array_interface__["data"][0] - found[0]
        return (_rebuild_ndarray_on_storage, (found[2], off, a.shape, a.strides, a.dtype, writeable))

    def _reduce_tensor_alias(self, t, r):
        """Tensor T (reduced to R by _reduce_tensor) whose storage is none of the known ones but lies in the
        memory of an exported array (torch.from_numpy) or storage: rebuilt over that object."""
        storage = r[1][0]
        if storage.device.type != "cpu":
            return r
        key = storage_key(storage)
        if key in self._ctx.cur or key in self._ctx.old:
            return r
        rng = memory_range(storage)
        found = self._find_mem(rng[0], rng[1], storage) if rng is not None else None
        if found is None:
            return r
        args = r[1][1:]
        item = t.element_size()
        byte_off = rng[0] - found[0]
        if byte_off % item:
            return r
        if type(found[2]) is self._np.ndarray:
            return (_rebuild_tensor_on_array, (found[2], byte_off) + args)
        return (_rebuild_tensor, (found[2], byte_off // item + args[0]) + args[1:])

    def reducer_override(self, obj):
        np = self._np
        if np is not None and type(obj) is np.ndarray:
            r = self._reduce_ndarray_alias(obj)
            if r is not None:
                return r
            if isinstance(obj.base, np.ndarray):
                return self._reduce_ndarray_view(obj)
            return self._reduce_ndarray_whole(obj)
        if type(obj) in (io.StringIO, io.BytesIO) and not obj.closed:
            # In-memory buffers are values (IPython's %%capture keeps its output in StringIOs): their
            # contents and position.
            return (_rebuild_memory_buffer, (type(obj), obj.getvalue(), obj.tell()))
        if isinstance(obj, io.IOBase):
            # cloudpickle would save a readable file's *contents*; an open file is process state.
            raise TypeError("cannot pickle %r object: an open file cannot be saved" % type(obj).__name__)
        torch = self._torch
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.grad_fn is not None:
                self.graph = True
            r = _reduce_tensor(obj)
            if r is not NotImplemented:
                return r if r[0] is not _rebuild_tensor else self._reduce_tensor_alias(obj, r)
        t = type(obj)
        red = REDUCERS.get((t.__module__, t.__qualname__)) if REDUCERS else None
        if red is not None:
            return red(obj)
        if obj is self.module_root and obj is not None:
            from .usermods import reduce_module
            return reduce_module(obj)
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func):
        if func.__globals__ is not self._ctx.namespace:
            return super()._dynamic_function_reduce(func)
        code = func.__code__
        closure = None
        if func.__closure__ is not None:
            closure = tuple(_make_empty_cell() for _ in range(len(code.co_freevars)))
        state, slotstate = _cpf._function_getstate(func)
        g = slotstate["__globals__"]
        keep = {k: v for k, v in g.items() if isinstance(v, types.ModuleType)}
        self.soft.update(k for k in g if k not in keep)
        slotstate["__globals__"] = keep
        return (_make_function, (code, self._ctx.namespace, None, None, closure), (state, slotstate),
                None, None, _function_setstate_keep_builtins)


def pickle_var(ctx, name, value):
    """Pickle VALUE as variable NAME.  Returns a Pickled; raises what pickle raises (and NeedOwner)."""
    p = ctx.pickler
    if p is None:
        p = ctx.pickler = _Pickler(io.BytesIO(), ctx)
    p.start()
    if isinstance(value, types.ModuleType) and name.startswith(MODULE_ENTRY_PREFIX):
        p.module_root = value  # its globals by value (usermods.py); any other module by reference
    p.dump(value)
    stream = p._file.getvalue()
    exports = []
    for idx, obj in p.memo.copy().values():
        if shareable(obj):
            exports.append((id(obj), "o", idx, obj))
    for k, po in enumerate(p.pobjs):
        if po is not None:
            exports.append((po[0], "p", k, po[1]))
    hdr = {"hard": sorted(p.deps), "soft": sorted(p.soft)}
    if len(stream) > STREAM_INLINE_MAX:
        # A big structure (a long list of floats, an object array) goes to the pool like any payload:
        # Redis keeps small metadata, and an unchanged stream costs no bytes on the next save.
        hdr["stream"] = len(p.payloads)
        p.payloads.append((("x", len(stream)), stream))
        p.pobjs.append(None)
        stream = b""
    hdr["pay"] = [m for m, _ in p.payloads]
    hdr = pickle.dumps(hdr, protocol=5)
    blob = _HDR.pack(_MAGIC, len(hdr)) + hdr + stream
    return Pickled(name, blob, p.payloads, p.pobjs, p.deps, p.soft, exports, p.graph)


def blob_digest(blob):
    """What "this variable's blob did not change" is decided on (128-bit BLAKE2b: no false equal)."""
    return hashlib.blake2b(blob, digest_size=16).digest()


def split_blob(blob):
    """Header dict and stream of a blob; ValueError for anything that is not one of ours."""
    mv = memoryview(blob)
    if len(mv) < _HDR.size:
        raise ValueError("store entry is too short to be a LooseLeaf blob")
    magic, n = _HDR.unpack_from(mv)
    if magic != _MAGIC or _HDR.size + n > len(mv):
        raise ValueError("store entry is not a LooseLeaf blob (bad magic or header length)")
    hdr = pickle.loads(mv[_HDR.size:_HDR.size + n])
    return hdr, mv[_HDR.size + n:]


class Unpickler(_pickle.Unpickler):
    """Unpickles one variable.  RESOLVE(owner, kind, index) returns another variable's exported object;
    LOCAL(k) builds this variable's payload object k (called once per k)."""

    def __init__(self, stream, namespace, resolve, local, buffers):
        super().__init__(io.BytesIO(stream), buffers=buffers)
        self._ns = namespace
        self._resolve = resolve
        self._localf = local
        self._locals = {}

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError("bad persistent id %r" % (pid,))
        tag = pid[0]
        if tag == "P":
            k = pid[1]
            o = self._locals.get(k)
            if o is None:
                o = self._locals[k] = self._localf(k)
            return o
        if tag == "R":
            return self._resolve(pid[1], "o", pid[2])
        if tag == "Q":
            return self._resolve(pid[1], "p", pid[2])
        if tag == "G":
            return self._ns
        raise pickle.UnpicklingError("unknown persistent id %r" % (pid,))

    def exports(self):
        """What this variable exports, after load: [(key, kind, index, obj)]."""
        out = []
        for idx, obj in self.memo.copy().items():
            if shareable(obj):
                out.append((id(obj), "o", idx, obj))
        torch = sys.modules.get("torch")
        for k, obj in self._locals.items():
            if torch is not None and isinstance(obj, (torch.storage.TypedStorage, torch.storage.UntypedStorage)):
                out.append((storage_key(obj), "p", k, obj))
            elif isinstance(obj, bytearray):
                out.append((id(obj), "p", k, obj))
        return out

"""looseleaf_store: the Python half of LooseLeaf's checkpoint store.

Used by the kernel's interpreter and by GPU workers:

    import _llstore
    from looseleaf_store import Checkpointer
    cp = Checkpointer(_llstore.Store(runtime_dir, session_id), user_ns)
    cp.save(["model", "opt"])      # -> SaveReport (saved/unchanged/deleted/failed ...), one atomic commit
    cp.restore(["opt"])            # -> RestoreReport; brings `model` too, sharing intact
    cp.versions()                  # {name: version}

serial.py documents how variables are pickled so that sharing survives; checkpoint.py what save and
restore guarantee; procstate.py the process state (cwd, environment, sys.path, RNG states, torch dtype and
grad mode) saved with a session's variables; homes.py what stands in the store for a value no pickle takes
(it stays in the process that made it); usermods.py the globals of the user's own modules, saved as entries
of their own; pagemap.py and wptrack.py how unchanged payloads are found without hashing them
(LL_STORE_WPTRACK=0 turns write tracking off).  `_llstore` is the C store (store/API.md): a builtin module of build/looseleaf, and
build/py/_llstore*.so for /usr/bin/python3.
"""
from .checkpoint import Checkpointer, RestoreReport, SaveReport
from .serial import BIG_BYTES, STREAM_INLINE_MAX

__all__ = ["Checkpointer", "SaveReport", "RestoreReport", "BIG_BYTES", "STREAM_INLINE_MAX", "open_store"]


def open_store(runtime_dir, session_id, **kwargs):
    """An `_llstore.Store` (imported here so callers need not know where the module comes from)."""
    import _llstore
    return _llstore.Store(runtime_dir, session_id, **kwargs)

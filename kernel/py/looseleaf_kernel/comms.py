"""Comms (the Jupyter protocol's comm_open/comm_msg/comm_close), on top of
the `comm` package so that libraries using comm.create_comm (ipywidgets 8,
...) work: we replace comm.create_comm and comm.get_comm_manager with ours.

Libraries written for ipykernel reach for it directly: `ipykernel.comm.Comm`
(Debian's ipywidgets, older libraries) sends nothing unless an instance of
`ipykernel.kernelbase.Kernel` exists, and sends through that instance's
`session.send(iopub_socket, ...)`.  So when ipykernel.kernelbase is imported
(never before: the import costs ~0.3 s of every kernel's start), we make an
instance of it whose session, parent, shell and comm manager are this
kernel's (IPyKernelFace); `get_ipython().kernel` (ours) carries the same
session and iopub_socket.  Importing ipykernel.ipkernel makes it install its
own comm.create_comm; ours are put back right after.

Messages to the frontend go out through the publish hook; messages from the
frontend arrive as requests (looseleaf_kernel.kernel dispatches them here).

Runs in the kernel's interpreter (and in workers, which inherit it by fork).
"""
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys

import comm
from comm.base_comm import BaseComm, CommManager

from .display import publish

__all__ = ["Comm", "CommManager", "IOPUB", "Session", "install", "manager"]

log = logging.getLogger("looseleaf_kernel.comms")


class Comm(BaseComm):
    """A comm whose messages leave through the kernel's iopub hook."""

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        content = dict(data={} if data is None else data, comm_id=self.comm_id, **keys)
        publish(msg_type, content, {} if metadata is None else metadata,
                list(buffers) if buffers else None)


_manager = CommManager()


def manager():
    return _manager


def _create_comm(*args, **kwargs):
    return Comm(*args, **kwargs)


# Edit-time prefetch hints (a GPU cell's worker prepared while the user types): a frontend opens a comm on this
# target and sends {code} as the user edits a cell.  The gateway reads those messages itself (gateway/ll_kernel.c,
# s_hint); here the comm only has to exist, so the frontend's comm_open is accepted like any other.
PREFETCH_TARGET = "looseleaf.prefetch"


def _prefetch_target(c, msg):
    c.on_msg(lambda m: None)


class _IOPubSocket:
    """Stands for the iopub socket in Session.send(kernel.iopub_socket, ...)."""

    def __repr__(self):
        return "<looseleaf iopub>"


IOPUB = _IOPubSocket()


class Session:
    """The part of jupyter_client's Session that code in a kernel uses: send() on the iopub socket, which
    publishes through the kernel's hook under the current request (the parent given is not needed: the
    gateway knows the request being handled)."""

    def send(self, stream, msg_or_type, content=None, parent=None, ident=None, buffers=None, track=False,
             header=None, metadata=None):
        if isinstance(msg_or_type, dict):
            msg_type = msg_or_type["header"]["msg_type"]
            content = msg_or_type.get("content", content)
            metadata = msg_or_type.get("metadata", metadata)
        else:
            msg_type = msg_or_type
        if stream is not IOPUB:
            log.warning("%s sent on %r dropped: a kernel's code can only publish on iopub", msg_type, stream)
            return None
        content = {} if content is None else content
        publish(msg_type, content, {} if metadata is None else metadata, list(buffers) if buffers else None)
        return {"header": {"msg_type": msg_type}, "msg_type": msg_type, "content": content,
                "metadata": metadata or {}, "parent_header": (parent or {}).get("header", {})}


SESSION = Session()

_kernel = None  # looseleaf_kernel.kernel.Kernel, once install() is called


def _adopt_ipykernel(kernelbase):
    """Make KERNELBASE.Kernel.initialized() true, with an instance that sends through this kernel."""
    import traitlets

    owner = _kernel

    class IPyKernelFace(kernelbase.Kernel):
        """ipykernel's Kernel as comms and libraries use it; everything goes to the LooseLeaf kernel."""

        session = traitlets.Any()
        implementation = "looseleaf"

        @property
        def shell(self):
            return owner.shell

        @property
        def comm_manager(self):
            return _manager

        def get_parent(self, channel=None):
            return owner.get_parent()

        @property
        def _parent_header(self):
            return owner.get_parent()

    if not kernelbase.Kernel.initialized():
        IPyKernelFace.instance(session=SESSION, iopub_socket=IOPUB)


def _after_ipkernel(module):
    # ipykernel.ipkernel replaces comm.create_comm / get_comm_manager when imported: its comms would live in a
    # manager that never hears from the frontend.
    comm.create_comm = _create_comm
    comm.get_comm_manager = manager


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._after(module)
        except Exception:
            log.exception("adapting %s to LooseLeaf failed", module.__name__)

    def __getattr__(self, name):  # get_source, is_package, ... (inspect, linecache)
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function right after one of the named modules is imported (whoever imports it)."""

    HOOKS = {"ipykernel.kernelbase": _adopt_ipykernel, "ipykernel.ipkernel": _after_ipkernel}

    def find_spec(self, name, path, target=None):
        after = self.HOOKS.get(name)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, after)
                return spec
        return None


# What ipykernel has loaded that libraries look for in sys.modules to tell a notebook kernel from a terminal:
# tqdm >= 4.68 (tqdm.auto) draws its widget bar only when `ipykernel.zmqshell` is there, and plotly, wandb and
# others test for `ipykernel`.  Loaded for real they would cost ~85 ms of every kernel's and worker's start
# (jupyter_client, pyzmq, tornado), so they are registered lazily (importlib's LazyLoader): present in
# sys.modules at no cost, executed on first use of one of their attributes (`from ipykernel.zmqshell import
# X`, `ipykernel.__version__`), which then is an ordinary import.
_PRESENT = ("ipykernel", "ipykernel.zmqshell")


_LAZY = getattr(importlib.util, "_LazyModule", None)
if _LAZY is not None:
    class _QuietLazyModule(_LAZY):
        """A lazy module whose name and file can be read without running it: code that walks sys.modules
        reading them (inspect.getmodule, for every traceback; the user-module scan after GPU cells) would
        otherwise run ipykernel's import (~85 ms) for nothing.  Any other attribute loads it, and then it is
        an ordinary module."""

        def __getattribute__(self, attr):
            if attr in ("__name__", "__file__", "__cached__"):
                return object.__getattribute__(self, "__dict__").get(attr)
            return _LAZY.__getattribute__(self, attr)
else:  # pragma: no cover - an importlib without it: plain LazyLoader, which loads on any attribute
    _QuietLazyModule = None


def _present_ipykernel():
    """Put the modules of _PRESENT into sys.modules, lazily; nothing when ipykernel is not installed."""
    locations = None
    for name in _PRESENT:
        module = sys.modules.get(name)
        if module is None:
            if locations is None:
                spec = importlib.util.find_spec(name)  # a top-level name: imports nothing
            else:  # the parent is lazy: find the child on its path without running the parent
                spec = importlib.machinery.PathFinder.find_spec(name, locations)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return
            spec.loader = importlib.util.LazyLoader(spec.loader)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            if _QuietLazyModule is not None:
                module.__class__ = _QuietLazyModule
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)  # a plain attribute: no load
        # __spec__ from the module's dict: reading it as an attribute would load a lazy module.
        spec = object.__getattribute__(module, "__dict__").get("__spec__")
        locations = getattr(spec, "submodule_search_locations", None)
        if locations is None:
            return


def install(kernel):
    """Make the comm package hand out our Comm and manager; register the prefetch target; make ipykernel's
    Kernel (once imported) send through KERNEL; make sys.modules show what ipykernel's has (_PRESENT)."""
    global _kernel
    _kernel = kernel
    comm.create_comm = _create_comm
    comm.get_comm_manager = manager
    _manager.register_target(PREFETCH_TARGET, _prefetch_target)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    for name, after in _AfterImport.HOOKS.items():
        if name in sys.modules:  # imported before the kernel started (a startup file)
            after(sys.modules[name])
    try:
        _present_ipykernel()
    except Exception:  # noqa: BLE001 - only a library's choice of display depends on it
        log.warning("cannot register ipykernel's modules", exc_info=True)


def comm_info(target_name=None):
    return {
        comm_id: {"target_name": c.target_name}
        for comm_id, c in list(_manager.comms.items())
        if target_name is None or c.target_name == target_name
    }

"""Comms (the Jupyter protocol's comm_open/comm_msg/comm_close), on top of
the `comm` package so that libraries using comm.create_comm (ipywidgets 8,
...) work: we replace comm.create_comm and comm.get_comm_manager with ours.

Messages to the frontend go out through the publish hook; messages from the
frontend arrive as requests (looseleaf_kernel.kernel dispatches them here).
"""
import logging

import comm
from comm.base_comm import BaseComm, CommManager

from .display import publish

__all__ = ["Comm", "CommManager", "install", "manager"]

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


# Edit-time prefetch hints (issue 6): a frontend opens a comm on this target and sends {code} as the user
# edits a cell.  The gateway reads those messages itself (gateway/ll_kernel.c, s_hint); here the comm only
# has to exist, so the frontend's comm_open is accepted like any other.
PREFETCH_TARGET = "looseleaf.prefetch"


def _prefetch_target(c, msg):
    c.on_msg(lambda m: None)


def install():
    """Make the comm package hand out our Comm and manager; register the prefetch target."""
    comm.create_comm = _create_comm
    comm.get_comm_manager = manager
    _manager.register_target(PREFETCH_TARGET, _prefetch_target)


def comm_info(target_name=None):
    return {
        comm_id: {"target_name": c.target_name}
        for comm_id, c in list(_manager.comms.items())
        if target_name is None or c.target_name == target_name
    }

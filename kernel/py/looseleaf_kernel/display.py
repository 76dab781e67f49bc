"""Display machinery of the shell: display() / update_display / clear_output
become display_data / update_display_data / clear_output messages, and a
cell's value becomes execute_result, all published through the kernel's hook
under the current request.

Runs on whichever thread displays (usually the interpreter thread).
"""
import sys
import threading

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher

import _looseleaf_kernel as _lk

from ._json import dumps
from .iostream import OutStream

__all__ = ["LooseLeafDisplayPublisher", "LooseLeafDisplayHook", "flush_streams", "publish"]


def publish(msg_type, content, metadata=None, buffers=None):
    """Send one iopub message; streams are flushed first by the hook."""
    _lk.publish(msg_type, dumps(content), None if metadata is None else dumps(metadata), buffers)


def flush_streams():
    """Flush sys.stdout/sys.stderr when they are not ours (%%capture,
    redirect_stdout, a wrapper): ours need nothing, since the publish hook
    flushes the kernel's stream buffer itself before every message."""
    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, OutStream):
            try:
                stream.flush()
            except Exception:
                pass


class LooseLeafDisplayPublisher(DisplayPublisher):
    """display_data, update_display_data and clear_output over the hook."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._thread_local = threading.local()
        self.parent_header = {}

    def set_parent(self, parent):
        self.parent_header = parent

    # ipykernel lets code intercept display messages per thread (the Output
    # widget of ipywidgets 7 does); a hook gets the message dict and returns
    # it (maybe changed) or None to swallow it.
    @property
    def _hooks(self):
        if not hasattr(self._thread_local, "hooks"):
            self._thread_local.hooks = []
        return self._thread_local.hooks

    def register_hook(self, hook):
        self._hooks.append(hook)

    def unregister_hook(self, hook):
        try:
            self._hooks.remove(hook)
            return True
        except ValueError:
            return False

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        flush_streams()
        if metadata is None:
            metadata = {}
        if transient is None:
            transient = {}
        self._validate_data(data, metadata)
        msg_type = "update_display_data" if update else "display_data"
        content = {"data": data, "metadata": metadata, "transient": transient}
        hooks = self._hooks
        if hooks:
            msg = {
                "header": {"msg_type": msg_type},
                "msg_type": msg_type,
                "parent_header": (self.parent_header or {}).get("header", {}),
                "content": content,
                "metadata": {},
            }
            for hook in list(hooks):
                msg = hook(msg)
                if msg is None:
                    return
            msg_type, content = msg.get("msg_type", msg_type), msg["content"]
        publish(msg_type, content)

    def clear_output(self, wait=False):
        flush_streams()
        publish("clear_output", {"wait": bool(wait)})


class LooseLeafDisplayHook(DisplayHook):
    """sys.displayhook of the shell: a cell's value becomes execute_result."""

    def start_displayhook(self):
        self.msg = {"data": {}, "metadata": {}, "execution_count": None}

    def write_output_prompt(self):
        self.msg["execution_count"] = self.prompt_count

    def write_format_data(self, format_dict, md_dict=None):
        self.msg["data"] = format_dict
        self.msg["metadata"] = md_dict if md_dict is not None else {}

    def finish_displayhook(self):
        flush_streams()
        msg, self.msg = self.msg, None
        if msg and msg["data"]:
            publish("execute_result", msg)

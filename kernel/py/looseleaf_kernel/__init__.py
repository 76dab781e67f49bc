"""looseleaf_kernel: the Python side of LooseLeaf's embedded interpreter.

Imported by kernel/ll_interp.c, which calls start() once, handle() per
request and shutdown() at the end.  The C side provides the builtin module
_looseleaf_kernel (the hooks to the kernel process).
"""
from .kernel import Kernel, get_kernel, handle, shutdown, start

__all__ = ["Kernel", "get_kernel", "handle", "shutdown", "start"]

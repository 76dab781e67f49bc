"""sys.stdout / sys.stderr of the kernel: text goes to the gateway as it is
written (the gateway coalesces it into stream messages), not at the end of
the cell.

Any thread may write; the hook is thread-safe.  write() is the C function
itself (no Python frame per print), which is what keeps a million prints
cheap.
"""
import io

import _looseleaf_kernel as _lk

__all__ = ["OutStream"]


class OutStream(io.TextIOBase):
    """A text stream that hands every write to the kernel's stream hook."""

    encoding = "UTF-8"
    errors = "strict"

    def __init__(self, name, fd):
        super().__init__()
        self.name = name
        self._fd = fd
        # The bound C function replaces the method: print() calls it directly.
        self.write = _lk.stdout_write if name == "stdout" else _lk.stderr_write
        self.parent_header = {}

    def write(self, text):  # replaced per instance in __init__
        return _lk.stream_write(self.name, text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        _lk.stream_flush()

    def isatty(self):
        return False

    def readable(self):
        return False

    def writable(self):
        return True

    def seekable(self):
        return False

    def fileno(self):
        # The gateway captures these descriptors, so a subprocess or C
        # library writing to them still reaches the frontend.
        return self._fd

    def set_parent(self, parent):
        # ipykernel API; the gateway knows the current request.
        self.parent_header = parent

    @property
    def closed(self):
        return False

    def close(self):
        # Closing the kernel's stdout would silence the kernel; like
        # ipykernel we keep it open.
        pass

    def __repr__(self):
        return "<looseleaf_kernel.OutStream name=%r>" % (self.name,)

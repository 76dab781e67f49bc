"""LooseLeafShell: IPython's InteractiveShell for a kernel that talks through
hooks instead of a terminal (the counterpart of ipykernel's
ZMQInteractiveShell, written for LooseLeaf).

Runs on the interpreter thread.  Errors are published as `error` messages
with IPython's formatted (ANSI-coloured) traceback, the cell's value as
`execute_result`, display() as `display_data`; `!cmd` runs through a pipe so
its output reaches the cell's stream; the pager becomes a payload.
"""
import os
import shlex
from ast import Expr as ast_Expr
import subprocess
import sys
import tempfile
import warnings

import _looseleaf_kernel as _lk

from IPython.core import page, payloadpage
from IPython.core.autocall import ZMQExitAutocall
from IPython.core.compilerop import CachingCompiler
from IPython.core.error import UsageError
from IPython.core.magics import CodeMagics
from IPython.core.magics.code import MacroToEdit
from IPython.core.interactiveshell import InteractiveShell, InteractiveShellABC
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.utils.process import system
from traitlets import Any, CBool, Instance, Type, default

from .display import LooseLeafDisplayHook, LooseLeafDisplayPublisher, flush_streams, publish

__all__ = ["LooseLeafShell", "ZMQInteractiveShell", "CellCompiler", "connection_file", "LostVariable", "get_file_name"]


class LostVariable(NameError):
    """A variable of the session whose value lived only in a process that is gone (or that this cell does
    not run in): raised where Python would raise a bare NameError for it.  A NameError, so code that
    catches NameError behaves as before."""


# ---- huge cells ---------------------------------------------------------------------------------------------
# IPython tokenizes a cell for its input transformations, compiles it whole to find out whether it awaits, and
# parses it into Python AST objects: ~450 bytes of memory per byte of a cell of short statements (a 5 MB
# cell of `x = 1` lines peaked at 2.3 GB in ipykernel and here alike; 100 MB took the kernel to the OOM
# killer).  A cell over _HUGE_BYTES is therefore transformed and compiled in pieces of about _PIECE_BYTES cut
# at top-level statements (a line that starts in column 0 and after which the piece before compiles on its
# own), every piece before anything runs (a syntax error anywhere still stops the cell before it starts), and
# run piece by piece as IPython runs a cell statement by statement; the last piece's statements stay AST nodes,
# so the cell's value is shown as usual.  A cell that cannot be cut so (a literal spanning more than a few
# pieces, a cell magic) takes IPython's own path.
_HUGE_BYTES = int(os.environ.get("LOOSELEAF_HUGE_CELL_BYTES") or 0) or 1 << 20
_PIECE_BYTES = 256 << 10
_PIECE_GROWTH = 16  # a piece that does not compile grows to the next cut, this many times at most


class _Piece:
    """A placeholder statement for one compiled piece of a huge cell (CellCompiler.__call__ returns CODE)."""

    __slots__ = ("code",)

    def __init__(self, code):
        self.code = code


def _next_cut(text, at):
    """The offset of the first line at or after offset AT that starts a top-level statement candidate (column
    0, not blank, not a comment, not a closing bracket), len(TEXT) when none."""
    while True:
        nl = text.find("\n", at)
        if nl < 0 or nl + 1 >= len(text):
            return len(text)
        c = text[nl + 1]
        if c not in " \t\r\n#)]}":
            return nl + 1
        at = nl + 1


def split_huge_cell(raw, transform, compile_flags, filename):
    """RAW (a huge cell) cut into pieces that each compile on their own once transformed (TRANSFORM: IPython's
    input transformation; COMPILE_FLAGS: the shell's compiler's), or None when it cannot be cut so.  Returns
    (the transformed cell, [code of each piece but the last, compiled as FILENAME with the cell's line
    numbers], the last piece's AST, its line numbers the cell's too)."""
    if raw.lstrip().startswith("%%"):
        return None  # a cell magic takes the whole cell
    import ast
    texts, codes, last, pos, line = [], [], None, 0, 0
    while pos < len(raw):
        end, grown = _next_cut(raw, pos + _PIECE_BYTES), 0
        while True:
            text = transform(raw[pos:end])
            try:
                tree = compile(text, filename, "exec", compile_flags | ast.PyCF_ONLY_AST, True)
                break
            except (SyntaxError, ValueError, MemoryError):
                if end >= len(raw) or grown >= _PIECE_GROWTH:
                    return None
                end, grown = _next_cut(raw, end), grown + 1
        ast.increment_lineno(tree, line)
        if last is not None:
            codes.append(compile(last, filename, "exec", compile_flags, True))
        last = tree  # only the newest piece's AST is kept: it may be the last
        texts.append(text)
        line += text.count("\n")
        pos = end
    return "".join(texts), codes, last


# ipykernel's seed for the cell-name hash; JupyterLab's debugger names cells with it (debugger.py's debugInfo).
CELL_HASH_SEED = 0xC70F6907


def get_file_name(code):
    """The file a cell of CODE (raw, as the frontend holds it) is compiled under: <session dir>/<hash>.py,
    the hash being ipykernel's Murmur2, which JupyterLab's debugger computes itself to place breakpoints."""
    return os.path.join(CellCompiler.session_dir(),
                        "%d.py" % _lk.murmur2(code.encode("utf-8", "surrogatepass"), CELL_HASH_SEED))


class CellCompiler(CachingCompiler):
    """Names each cell like ipykernel does, <tmp>/looseleaf_<pid>/<murmur2>.py,
    instead of IPython's <ipython-input-N-hash>: a real-looking path is what
    debuggers and tools expect, JupyterLab's debugger computes the same name to
    set breakpoints, and tracebacks then read as ipykernel's.  The hash runs in
    C (_looseleaf_kernel.murmur2) where ipykernel loops over every byte in Python."""

    _dir = None

    def get_code_name(self, raw_code, code, number):
        return get_file_name(raw_code)

    @staticmethod
    def write_source(path, code):
        """Write a cell's source under PATH (the debugger's dumpCell), in the session's private directory."""
        if CellCompiler._private(os.path.dirname(path)):
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(code)

    @staticmethod
    def session_dir():
        if CellCompiler._dir is None:
            CellCompiler._dir = os.path.join(tempfile.gettempdir(), "looseleaf_%d" % os.getpid())
        return CellCompiler._dir

    # GPU cells run in workers (forked processes), and a function defined in one cell may fail in a cell that another
    # process runs.  So that its traceback shows the source line and "Cell In[N]" as in one process, every
    # process of a session writes each cell it compiles under its name in one directory (the kernel's,
    # passed to workers) and appends "N<TAB>name" to an index there, which the others read into
    # _filename_map; linecache reads the sources from disk when a traceback needs them.
    _index_pos = 0  # bytes of the index this process has read
    _checked = None  # the directory found private to this user
    _share = True    # write cells (the kernel; a worker only once given the kernel's directory)

    @staticmethod
    def _private(path):
        """Make PATH 0700 if missing; whether it is a directory of ours that nobody else can write."""
        if CellCompiler._checked == path:
            return True
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
        import stat
        ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
        if ok:
            CellCompiler._checked = path
        return ok

    huge = None  # split_huge_cell's answer for the huge cell being run

    def ast_parse(self, source, filename="<unknown>", symbol="exec"):
        huge, self.huge = self.huge, None
        if huge is None or huge[0] is not source or symbol != "exec":
            return super().ast_parse(source, filename, symbol)
        import ast
        # The pieces run as IPython runs statements (run_ast_nodes); the last piece's statements are the
        # cell's own, so its value is shown as usual.
        body = [ast.Expr(value=ast.Constant(value=_Piece(code))) for code in huge[1]] + huge[2].body
        return ast.Module(body=body, type_ignores=[])

    def __call__(self, source, filename, symbol):
        body = getattr(source, "body", None)
        if isinstance(body, list) and len(body) == 1 and isinstance(body[0], ast_Expr) and \
                isinstance(getattr(body[0].value, "value", None), _Piece):
            return body[0].value.value.code
        return super().__call__(source, filename, symbol)

    def cache(self, transformed_code, number=0, raw_code=None):
        name = super().cache(transformed_code, number, raw_code)
        if not CellCompiler._share:
            return name
        try:
            if not CellCompiler._private(CellCompiler._dir):
                return name  # a directory someone else made: write nothing into it
            if not os.path.exists(name):
                with open(name, "w", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(transformed_code)
            with open(os.path.join(CellCompiler._dir, "cells.tsv"), "a") as f:
                f.write("%d\t%s\n" % (number, name))
        except OSError:
            pass  # only tracebacks in other processes lose their source lines
        return name

    def load_index(self):
        """Pick up the cells the session's other processes compiled since the last call."""
        if CellCompiler._dir is None:
            return
        path = os.path.join(CellCompiler._dir, "cells.tsv")
        try:
            if os.stat(path).st_size == CellCompiler._index_pos:
                return  # nothing appended (every prepared run asks; most find nothing new)
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                f.seek(CellCompiler._index_pos)
                data = f.read()
                CellCompiler._index_pos = f.tell()
        except OSError:
            return
        for line in data.splitlines():
            number, _, name = line.partition("\t")
            if number.isdigit() and name:
                self._filename_map.setdefault(name, int(number))

    @staticmethod
    def is_cell_file(filename):
        """Whether FILENAME is a cell of this session (written by one of its processes)."""
        return bool(CellCompiler._dir) and os.path.dirname(filename) == CellCompiler._dir

    @staticmethod
    def stop_sharing():
        """Write no cell files until use_dir gives a directory (a zygote: its workers write into the kernel's
        directory they are given, never into one of their own that nobody would remove)."""
        CellCompiler._share = False

    @staticmethod
    def use_dir(path):
        """Compile into PATH (a worker: the kernel's directory) from now on; read its index afresh."""
        if path and path != CellCompiler._dir:
            CellCompiler._dir = path
            CellCompiler._index_pos = 0
        if path:
            CellCompiler._share = True

    @staticmethod
    def sweep():
        """Remove the cell directories of kernels that died without shutting down (ours, 0700).  Dead as
        the store sweep has it: a killed kernel its parent has not reaped yet is a zombie whose pid is
        still in /proc."""
        import shutil
        import stat
        from .procs import pid_alive
        base = tempfile.gettempdir()
        try:
            names = [n for n in os.listdir(base) if n.startswith("looseleaf_") and n[10:].isdigit()]
        except OSError:
            return
        for n in names:
            pid, path = int(n[10:]), os.path.join(base, n)
            if pid == os.getpid() or pid_alive(pid):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
                shutil.rmtree(path, ignore_errors=True)


PLACEMENT_MAGICS = ("%%gpu", "%%cpu")


def strip_placement_magic(lines):
    """Input transformer: drop a first line that is exactly %%gpu or %%cpu.

    These are LooseLeaf's per-cell overrides of where a cell runs (read by
    the gateway's analysis, which strips them the same way); for IPython the
    cell is the rest.  History keeps the raw cell.  The line becomes an empty one, which IPython's next cleanup
    (leading_empty_lines) drops, except while the debugger runs (debugger.py takes that cleanup out, as ipykernel
    does): then the code keeps the editor's line numbers, where the frontend puts breakpoints."""
    if lines and lines[0].strip() in PLACEMENT_MAGICS:
        return ["\n"] + lines[1:]
    return lines


def connection_file():
    """The connection file this kernel was started with (`-f FILE` on its
    command line), or None."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    for i, arg in enumerate(argv[:-1]):
        if arg == b"-f":
            return os.fsdecode(argv[i + 1])
        if arg.startswith(b"--f="):
            return os.fsdecode(arg[4:])
    return None


@magics_class
class KernelMagics(Magics):
    """The few magics whose terminal meaning does not fit a kernel."""

    @line_magic
    def edit(self, parameter_s="", last_call=None):
        """Open a file (or the source of an object, or history lines) in the
        frontend's editor.

        Unlike in the terminal the edited code is not run afterwards: the
        frontend gets an edit_magic payload naming the file and line (as with
        ipykernel).  See IPython's %edit for the arguments."""
        last_call = last_call or ["", ""]
        opts, args = self.parse_options(parameter_s, "prn:")
        try:
            filename, lineno, _ = CodeMagics._find_edit_target(self.shell, args, opts, last_call)
        except MacroToEdit:
            print("Macro editing not yet implemented in 2-process model.")
            return
        self.shell.payload_manager.write_payload(
            {"source": "edit_magic", "filename": os.path.abspath(filename),
             "line_number": lineno})

    @line_magic
    def clear(self, arg_s):
        """Clear the terminal."""
        self.shell.system("clear")

    @line_magic
    def less(self, arg_s):
        """Show a file in the pager (a payload the frontend shows)."""
        if not arg_s:
            raise UsageError("Missing filename.")
        if arg_s.endswith(".py"):
            cont = self.shell.pycolorize(open(arg_s, encoding="utf-8").read())
        else:
            with open(arg_s, encoding="utf-8") as f:
                cont = f.read()
        page.page(cont)

    more = line_magic("more")(less)

    @line_magic
    def man(self, arg_s):
        """Find the man page for the given command and display in pager."""
        page.page(self.shell.getoutput("man %s | col -b" % arg_s, split=False))

    @line_magic
    def connect_info(self, arg_s):
        """Print the connection file of this kernel and how to attach another
        client to it."""
        cf = connection_file()
        try:
            with open(cf, encoding="utf-8") as f:
                info = f.read()
        except (OSError, TypeError) as e:
            warnings.warn("Could not get connection info: %r" % (e,))
            return
        try:
            from jupyter_core.paths import jupyter_runtime_dir

            if jupyter_runtime_dir() == os.path.dirname(cf):
                cf = os.path.basename(cf)
        except ImportError:
            pass
        print(info + "\n")
        print(
            f"Paste the above JSON into a file, and connect with:\n"
            f"    $> jupyter <app> --existing <file>\n"
            f"or, if you are local, you can connect with just:\n"
            f"    $> jupyter <app> --existing {cf}\n"
            f"or even just:\n"
            f"    $> jupyter <app> --existing\n"
            f"if this is the most recent Jupyter kernel you have started."
        )

    @line_magic
    def qtconsole(self, arg_s):
        """Open a Jupyter QtConsole attached to this kernel."""
        cf = connection_file()
        if cf is None:
            warnings.warn("Could not start qtconsole: no connection file")
            return
        cmd = [sys.executable, "-m", "qtconsole", "--existing", cf] + shlex.split(arg_s)
        try:
            subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            warnings.warn("Could not start qtconsole: %r" % (e,))

    @line_magic
    def autosave(self, arg_s):
        """Set the notebook's autosave interval in seconds (0 disables)."""
        try:
            interval = int(arg_s)
        except ValueError as e:
            raise UsageError("%%autosave requires an integer, got %r" % arg_s) from e
        from IPython.display import Javascript, display

        display(Javascript("IPython.notebook.set_autosave_interval(%i)" % (interval * 1000)))
        print("Autosaving every %i seconds" % interval if interval else "Autosave disabled")


def _cells_formatted_as_ipykernel_does():
    """Tracebacks through cells read as on ipykernel.  IPython formats a frame with stack_data (pieces, dedented
    source, the failing expression highlighted) only when it can count the lines of the frame's file; an
    ipykernel cell's file exists only in linecache, so its frames take IPython's plain path (the cell's lines
    as written).  Ours exist on disk too (the session's other processes read them), so IPython is told what
    it would find for ipykernel's: a file it cannot count."""
    try:
        from IPython.core import ultratb
    except ImportError:
        return
    count = getattr(ultratb, "get_line_number_of_frame", None)
    threshold = getattr(ultratb, "FAST_THRESHOLD", None)
    if count is None or threshold is None or getattr(count, "_looseleaf", False):
        return

    def counted(frame):
        if CellCompiler.is_cell_file(frame.f_code.co_filename):
            return threshold + 1
        return count(frame)

    counted._looseleaf = True
    ultratb.get_line_number_of_frame = counted


_cells_formatted_as_ipykernel_does()


class LooseLeafShell(InteractiveShell):
    """InteractiveShell publishing through the kernel's hooks."""

    displayhook_class = Type(LooseLeafDisplayHook)
    display_pub_class = Type(LooseLeafDisplayPublisher)
    kernel = Any()
    parent_header = Any()

    # No readline and no autoindent: the frontend edits the code.
    readline_use = CBool(False)
    autoindent = CBool(False)

    exiter = Instance(ZMQExitAutocall)

    @default("exiter")
    def _default_exiter(self):
        return ZMQExitAutocall(self)

    keepkernel_on_exit = None
    _last_traceback = None
    # {name: message} of variables whose value is not in this process (its home is a worker): reading one
    # raises LostVariable(message) instead of NameError.  Kept by coherence.py (the kernel) and zyg.py.
    lost_names = {}
    _lost_swapped = None  # (the NameError, the LostVariable shown for it) of the running cell
    displayhook_error = None  # (type, value) of an error raised formatting the cell's result

    def init_environment(self):
        env = os.environ
        # As ipykernel: coloured `ls` on BSD-derived systems, and no
        # interactive pagers in subprocesses (nobody can press a key there).
        env["TERM"] = "xterm-color"
        env["CLICOLOR"] = "1"
        env["PAGER"] = "cat"
        env["GIT_PAGER"] = "cat"
        # matplotlib draws inline unless the user chose a backend.
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")

    def init_hooks(self):
        super().init_hooks()
        self.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)

    def init_virtualenv(self):
        # A kernel runs the interpreter it was built with; a virtualenv on
        # PATH says nothing about it.
        pass

    def init_magics(self):
        super().init_magics()
        # Cell placement overrides come first, before IPython sees a magic.
        self.input_transformers_cleanup.insert(0, strip_placement_magic)
        self.register_magics(KernelMagics)
        self.magics_manager.register_alias("ed", "edit")

    def enable_gui(self, gui=None):
        if gui in (None, "inline"):
            self.active_eventloop = gui
            return
        raise UsageError(
            "GUI event loop %r is not supported by the LooseLeaf kernel; "
            "use %%matplotlib inline" % (gui,)
        )

    def ask_exit(self):
        self.exit_now = not self.keepkernel_on_exit
        self.payload_manager.write_payload(
            {"source": "ask_exit", "keepkernel": self.keepkernel_on_exit}
        )

    def transform_cell(self, raw_cell):
        compiler = self.compile
        if len(raw_cell) <= _HUGE_BYTES or not isinstance(compiler, CellCompiler):
            return super().transform_cell(raw_cell)
        def transform(text):  # IPython's static transformations (the dynamic ones are for one-line cells)
            lines = self.input_transformer_manager.transform_cell(text).splitlines(keepends=True)
            for t in self.input_transformers_post:
                lines = t(lines)
            return "".join(lines)

        compiler.huge = split_huge_cell(raw_cell, transform, compiler.flags,
                                        compiler.get_code_name(raw_cell, None, self.execution_count))
        if compiler.huge is None:
            return super().transform_cell(raw_cell)
        return compiler.huge[0]

    def should_run_async(self, raw_cell, *, transformed_cell=None, preprocessing_exc_tuple=None):
        huge = getattr(self.compile, "huge", None)
        if huge is not None and huge[0] is transformed_cell:
            return False  # (compiling the whole cell to find out is what a huge cell must not cost)
        # IPython 8.5 lets the ValueError of compile() on code with NUL bytes
        # escape from here; run it synchronously so that run_cell reports it
        # as the cell's error, as it does for any syntax error.
        try:
            return super().should_run_async(
                raw_cell, transformed_cell=transformed_cell,
                preprocessing_exc_tuple=preprocessing_exc_tuple)
        except ValueError:
            return False

    def run_cell(self, *args, **kwargs):
        self._last_traceback = None
        self._lost_swapped = None
        self.displayhook_error = None
        res = super().run_cell(*args, **kwargs)
        swapped, self._lost_swapped = self._lost_swapped, None
        if swapped is not None and res.error_in_exec is swapped[0]:
            res.error_in_exec = swapped[1]  # the reply names it as the traceback does
        return res

    def showtraceback(self, exc_tuple=None, *args, **kwargs):
        if self.lost_names:
            try:
                etype, value, tb = self._get_exc_info(exc_tuple)
            except ValueError:
                return super().showtraceback(exc_tuple, *args, **kwargs)
            msg = self.lost_names.get(getattr(value, "name", None)) \
                if isinstance(value, NameError) and not isinstance(value, LostVariable) else None
            if msg:
                lost = LostVariable(msg)
                lost.name = value.name
                lost.__traceback__ = tb
                self._lost_swapped = (value, lost)
                exc_tuple = (LostVariable, lost, tb)
        return super().showtraceback(exc_tuple, *args, **kwargs)

    def _showtraceback(self, etype, evalue, stb):
        if getattr(self.displayhook, "msg", None) is not None:
            # An error while the cell's result is being formatted (a _repr_*_ that raises): the cell
            # failed, as ipykernel 7 replies.
            self.displayhook_error = (etype, evalue)
        # Flush first so the traceback comes after the cell's output.
        flush_streams()
        publish(
            "error",
            {"traceback": stb, "ename": str(etype.__name__), "evalue": str(evalue)},
        )
        self._last_traceback = stb

    def set_next_input(self, text, replace=False):
        self.payload_manager.write_payload(
            {"source": "set_next_input", "text": text, "replace": replace}
        )

    def set_parent(self, parent):
        self.parent_header = parent
        self.display_pub.set_parent(parent)

    def get_parent(self):
        return self.parent_header

    def system_piped(self, cmd):
        """Run CMD through a pty (pexpect), its output printed to sys.stdout
        as it comes, like ipykernel; the exit status goes to _exit_code."""
        if cmd.rstrip().endswith("&"):
            # Backgrounded processes cannot be read from; os.system() can.
            raise OSError("Background processes not supported.")
        self.user_ns["_exit_code"] = system(self.var_expand(cmd, depth=1))

    system = system_piped


InteractiveShellABC.register(LooseLeafShell)


class ZMQInteractiveShell(LooseLeafShell):
    """The shell the kernel runs, under the class name of ipykernel's shell.

    Libraries tell "running in a Jupyter kernel" from "running in a
    terminal" by `get_ipython().__class__.__name__ == 'ZMQInteractiveShell'`
    (and by an IPKernelApp section in its config, which Kernel adds); a
    LooseLeaf notebook must get the same rich behaviour from them."""

"""A headless `jupyter console --kernel <name>` session, driven through tmux
(which renders the terminal, so the test reads the screen as a user would,
free of prompt_toolkit's escape sequences): type a multi-line function
definition (the console asks the kernel is_complete on each Enter to decide
whether to continue the block), call it, read the output, exit cleanly."""
import os
import subprocess
import time

import pytest

from itest_util import kernel_env

TIMEOUT = 60


class Tmux:
    """A private tmux server (own socket in a temp dir) with one pane."""

    def __init__(self, tmp_path, command, env):
        self.sock = str(tmp_path / "tmux.sock")
        self.env = env
        self.run("new-session", "-d", "-x", "160", "-y", "50", command)

    def run(self, *args):
        return subprocess.run(["tmux", "-S", self.sock] + list(args), env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def screen(self):
        return self.run("capture-pane", "-p", "-J", "-S", "-500")

    def keys(self, *keys):
        self.run("send-keys", "-t", "0", *keys)

    def wait(self, pred, what):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.05)  # polling the rendered screen
        raise AssertionError("console: %s not seen within %ss; screen:\n%s" % (what, TIMEOUT, self.screen()))

    def wait_prompt(self, n):
        """Wait until prompt In [N] is drawn and the cursor sits right after
        it, i.e. prompt_toolkit is ready for keys (keys typed while it is
        still setting up the terminal can be lost)."""
        prompt = "In [%d]: " % n

        def ready(screen):
            lines = [line for line in screen.splitlines() if line.strip()]
            if not lines or lines[-1].rstrip() != prompt.rstrip():
                return False
            return self.run("display-message", "-p", "#{cursor_x}").strip() == str(len(prompt))
        return self.wait(ready, "prompt %r ready for input" % prompt)

    def kill(self):
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], env=self.env, capture_output=True)


def _kernel_processes(connection_file):
    """Pids of processes whose command line names CONNECTION_FILE."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if connection_file.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def test_console_session(kernel_name, jupyter_env, tmp_path):
    status = tmp_path / "status"
    cf = str(tmp_path / "kernel-console.json")
    env = kernel_env()
    env["TERM"] = "xterm-256color"
    env.pop("TMUX", None)
    command = "/usr/bin/jupyter console --kernel %s --ConnectionFileMixin.connection_file=%s; echo $? > %s" % (
        kernel_name, cf, status)
    t = Tmux(tmp_path, command, env)
    try:
        t.wait_prompt(1)
        kernel_pids = _kernel_processes(cf)
        assert kernel_pids, "no kernel process runs with %s" % cf
        t.keys("def twice(x):", "Enter")
        t.wait(lambda s: "...:" in s, "continuation prompt")
        # The console indents the block itself (the kernel's is_complete
        # reply says by how much).
        t.keys("return x * 2", "Enter")
        t.wait(lambda s: s.count("...:") >= 2, "second continuation prompt")
        t.keys("Enter")
        t.wait_prompt(2)
        t.keys("print(twice(21))", "Enter")
        screen = t.wait_prompt(3)
        lines = [line.rstrip() for line in screen.splitlines()]
        assert "In [1]: def twice(x):" in lines
        assert "   ...:     return x * 2" in lines
        call = lines.index("In [2]: print(twice(21))")
        assert lines[call + 1] == "42"
        t.keys("twice('ab')", "Enter")
        screen = t.wait_prompt(4)
        assert "Out[3]: 'abab'" in [line.rstrip() for line in screen.splitlines()]
        t.keys("exit", "Enter")
        deadline = time.monotonic() + TIMEOUT
        while not (status.exists() and status.read_text().strip()):
            assert time.monotonic() < deadline, "console did not exit; screen:\n" + t.screen()
            time.sleep(0.05)  # polling for the exit status file
        assert status.read_text().strip() == "0"
        # Exiting the console shut the kernel down.
        while any(os.path.exists("/proc/%d" % p) and _kernel_processes(cf) for p in kernel_pids):
            assert time.monotonic() < deadline, "kernel still running after the console exited"
            time.sleep(0.05)
    finally:
        t.kill()



def test_console_completion(kernel_name, jupyter_env, tmp_path):
    """Tab completes a name defined in the kernel (complete_request).

    (Ctrl-C is not tested here: Debian's jupyter-console 6.4.4 lets the
    KeyboardInterrupt escape its event loop and never interrupts the kernel,
    on ipykernel just the same; test_int_interrupt.py covers interrupts.)"""
    env = kernel_env()
    env["TERM"] = "xterm-256color"
    env.pop("TMUX", None)
    status = tmp_path / "status"
    t = Tmux(tmp_path, "/usr/bin/jupyter console --kernel %s; echo $? > %s" % (kernel_name, status), env)
    try:
        t.wait_prompt(1)
        t.keys("completion_target_xyz = 5", "Enter")
        t.wait_prompt(2)
        t.keys("completion_tar", "Tab")
        t.wait(lambda s: "In [2]: completion_target_xyz" in s, "the completed name")
        t.keys("Enter")
        screen = t.wait_prompt(3)
        assert "Out[2]: 5" in screen
        t.keys("exit", "Enter")
        deadline = time.monotonic() + TIMEOUT
        while not (status.exists() and status.read_text().strip()):
            assert time.monotonic() < deadline, "console did not exit; screen:\n" + t.screen()
            time.sleep(0.05)  # polling for the exit status file
        assert status.read_text().strip() == "0"
    finally:
        t.kill()

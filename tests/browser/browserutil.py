"""A Jupyter server and a browser for the browser tests and the hint benchmark, set up as a user's would be
but private to the run: the LooseLeaf kernelspec installed by `looseleaf install --prefix` into a temporary
prefix (with or without its JupyterLab hinting override), JupyterLab / Notebook 7 from the project's venv on a
free port with a token, Debian's chromium driven by Playwright for Python (which cannot download its own
browsers here).

Runs in the pytest (or benchmark) process; the server and chromium are its children, stopped by
Server.stop() / the fixtures.  Nothing of the user's Jupyter set-up is read or written: every Jupyter and
JupyterLab directory points into the run's temporary directory.
"""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOSELEAF_BIN = os.environ.get("LL_TEST_LOOSELEAF", os.path.join(REPO, "build", "looseleaf"))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
CHROMIUM = os.environ.get("LL_CHROMIUM", "/usr/bin/chromium")
DEBIAN_NOTEBOOK = "/usr/bin/jupyter-notebook"
START_TIMEOUT = 90


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_kernelspec(prefix, python, hints=True):
    """`looseleaf install --prefix PREFIX --python PYTHON` as a user runs it; returns the kernels directory."""
    argv = [LOOSELEAF_BIN, "install", "--prefix", prefix, "--python", python]
    if not hints:
        argv.append("--no-hints")
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return os.path.join(prefix, "share", "jupyter", "kernels")


class Server:
    """A Jupyter server (KIND: "lab" for JupyterLab and Notebook 7 on one server, "classic" for Debian's
    notebook 6.4) in ROOT (a temporary directory it owns), with LooseLeaf installed for that server's Python."""

    def __init__(self, root, kind="lab", hints=True, extra_env=None):
        self.root = root
        self.kind = kind
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.notebook_dir = os.path.join(root, "notebooks")
        prefix = os.path.join(root, "prefix")
        for d in (self.notebook_dir, prefix):
            os.makedirs(d, exist_ok=True)
        python = os.path.join(VENV_BIN, "python") if kind == "lab" else "/usr/bin/python3"
        install_kernelspec(prefix, python, hints=hints)
        env = dict(os.environ)
        env.pop("PYTEST_CURRENT_TEST", None)
        env.update({
            # The kernelspec just installed is the only one besides the server's own Python's.
            "JUPYTER_PATH": os.path.join(prefix, "share", "jupyter"),
            "JUPYTER_CONFIG_DIR": os.path.join(root, "config"),
            "JUPYTER_DATA_DIR": os.path.join(root, "data"),
            "JUPYTER_RUNTIME_DIR": os.path.join(root, "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": os.path.join(root, "lab-user-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": os.path.join(root, "lab-workspaces"),
            "IPYTHONDIR": os.path.join(root, "ipython"),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        })
        env.update(extra_env or {})
        common = ["--no-browser", "--port=%d" % self.port, "--ip=127.0.0.1",
                  "--ServerApp.root_dir=%s" % self.notebook_dir]
        if kind == "lab":
            # JupyterLab reads settings overrides from its app settings directory, <prefix>/share/jupyter/lab/
            # settings for an environment; `looseleaf install --prefix` wrote ours under the temporary prefix.
            argv = [os.path.join(VENV_BIN, "jupyter"), "lab", *common,
                    "--IdentityProvider.token=%s" % self.token,
                    "--LabApp.app_settings_dir=%s" % os.path.join(prefix, "share", "jupyter", "lab", "settings")]
        else:
            argv = [DEBIAN_NOTEBOOK, *[c.replace("ServerApp.root_dir", "NotebookApp.notebook_dir") for c in common],
                    "--NotebookApp.token=%s" % self.token]
        if os.geteuid() == 0:
            argv.append("--allow-root")
        self.log_path = os.path.join(root, "server.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._wait_ready()

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("jupyter server exited (%s): %s" % (self.proc.returncode, self.log()))
            try:
                with urllib.request.urlopen(self.api_url("/api/kernelspecs"), timeout=5) as r:
                    self.kernelspecs = json.load(r)["kernelspecs"]
                return
            except OSError:
                time.sleep(0.2)  # polling for the server to listen: no event to wait on
        raise AssertionError("jupyter server did not answer within %d s: %s" % (START_TIMEOUT, self.log()))

    def api_url(self, path):
        return "%s%s?token=%s" % (self.url, path, self.token)

    def page_url(self, path):
        return self.api_url(path)

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def write_notebook(self, name, kernel="looseleaf", cells=()):
        """A notebook file NAME in the server's root, on KERNEL, with code CELLS (sources)."""
        spec = self.kernelspecs[kernel]["spec"]
        nb = {"nbformat": 4, "nbformat_minor": 5,
              "metadata": {"kernelspec": {"name": kernel, "display_name": spec["display_name"],
                                          "language": spec["language"]}},
              "cells": [{"cell_type": "code", "id": "c%d" % i, "metadata": {}, "execution_count": None,
                         "outputs": [], "source": src} for i, src in enumerate(cells)]}
        with open(os.path.join(self.notebook_dir, name), "w") as f:
            json.dump(nb, f)

    def running_kernels(self):
        with urllib.request.urlopen(self.api_url("/api/kernels"), timeout=10) as r:
            return json.load(r)

    def stop(self):
        if self.proc.poll() is None:
            # The server shuts its kernels down on SIGTERM (as on Ctrl-C); kill only what is left after that.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])


def have_chromium():
    return os.access(CHROMIUM, os.X_OK) and shutil.which(CHROMIUM) is not None and sys.platform == "linux"

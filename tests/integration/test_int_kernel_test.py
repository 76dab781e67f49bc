"""The peer suite jupyter_kernel_test (the Jupyter project's own conformance tests for kernels), run against
LooseLeaf: message structure and content of every reply and output, on the CPU route and, with code that uses
torch (labelled GPU), on workers.  jupyter_kernel_test comes from PyPI: the suite runs on the current stack
(`make test`'s venv) and is skipped on Debian's, which does not package it."""
import pytest

jkt = pytest.importorskip("jupyter_kernel_test")


class LooseLeafKernelTests(jkt.KernelTests):
    kernel_name = "looseleaf"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('expected')"
    code_execute_result = [{"code": "1+2+3", "result": "6"}, {"code": "[n*n for n in range(1, 4)]",
                                                               "result": "[1, 4, 9]"}]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


class LooseLeafGpuRouteKernelTests(LooseLeafKernelTests):
    """The same checks on cells the analysis labels GPU: they run on forked workers, whose output the kernel
    relays (the torch calls are what makes them GPU cells; without a GPU they run on the CPU there)."""
    code_hello_world = "import torch\nprint('hello, world', torch.zeros(1).shape)"
    code_stderr = "import sys, torch\nprint('test', torch.zeros(1).shape, file=sys.stderr)"
    code_generate_error = "import torch\nraise ValueError('expected %s' % torch.zeros(1).shape)"
    code_execute_result = [{"code": "import torch\nint(torch.tensor(6))", "result": "6"}]
    code_display_data = [
        {"code": "import torch\nfrom IPython.display import HTML, display\n"
                 "display(HTML('<b>%d</b>' % int(torch.ones(1))))", "mime": "text/html"},
    ]
    code_clear_output = "import torch\nfrom IPython.display import clear_output\n_ = torch.zeros(1)\nclear_output()"

    def test_these_cells_run_on_workers(self):
        """(Else the GPU variant would prove nothing.)"""
        self.flush_channels()
        for code in (self.code_hello_world, self.code_stderr, self.code_generate_error):
            reply, _ = self.execute_helper(code=code)
            self.assertEqual(reply["metadata"]["looseleaf"]["route"], "gpu", code)


class LooseLeafIopubWelcomeTests(jkt.IopubWelcomeTests):
    kernel_name = "looseleaf"
    support_iopub_welcome = True  # JEP 65: an XPUB iopub socket that welcomes each subscription

"""tests/bench/bench_kernel.py still runs (tiny sizes): `make bench` is not
part of `make test`, so this keeps the benchmark from rotting.  Checks only
that it measures both kernels and prints the three ratios; speed is judged by
`make bench` itself, never here."""
import os
import re
import subprocess
import sys

from itest_util import REPO, kernel_env


def test_bench_kernel_runs(jupyter_env, looseleaf_bin):
    script = os.path.join(REPO, "tests", "bench", "bench_kernel.py")
    proc = subprocess.run([sys.executable, script, "--starts", "1", "--roundtrips", "10",
                           "--lines", "2000", "--stream-runs", "1"],
                          env=kernel_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [l for l in proc.stdout.splitlines() if " ratio " in l]
    assert len(lines) == 3, proc.stdout
    for line in lines:
        assert re.search(r"looseleaf +[\d.]+ .* ipykernel +[\d.]+ .* ratio [\d.]+ \(target <= 1.0: (met|MISSED)\)",
                         line), line

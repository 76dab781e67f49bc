"""tests/gpu/run.sh runs here too: without a GPU its CUDA checks skip cleanly and the others pass."""
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_script_runs_or_skips_cleanly():
    p = subprocess.run([os.path.join(REPO, "tests", "gpu", "run.sh")], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "zygote   PASS" in p.stdout and "probe    PASS" in p.stdout, p.stdout
    assert "FAIL" not in p.stdout

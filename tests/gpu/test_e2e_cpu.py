"""tests/gpu/e2e.sh --cpu: the GPU machine's end-to-end run, here without a GPU, on the same build path (the
kernel and its store built with DEPS_PREFIX, found at run time through their RPATH), so it cannot rot between
device tasks.  With a bundle (.gpubundle, `make gpu-bundle`: needs Debian's mirrors and PyPI, so this test never
makes one) the prefix is the bundle's unpacked Debian packages and its redis-server, and its cp312 wheels are
checked for a complete set; without one (a fresh checkout, CI) the prefix is the system's root (/), the same
Makefile path against Debian's installed libraries.  The checks that need CUDA are not run here (the report
lists them as skipped with the reason); the others drive the real kernel through jupyter_client.

Cost: about 2.5 minutes on 2 shared cores: ~45 CPU-seconds for the build into build/e2e-cpu (incremental on a
second run), then about a minute of checks (four of them; `tests/gpu/e2e.sh --cpu` alone runs all, ~3 min)."""
import json
import os
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLE = os.path.join(REPO, ".gpubundle")


def test_e2e_cpu_mode(tmp_path):
    bundled = os.path.exists(os.path.join(BUNDLE, "MANIFEST.json"))
    out = str(tmp_path / "report")
    env = dict(os.environ, OUT=out, LL_E2E_WORK=tempfile.mkdtemp(prefix="ll-e2e-"))
    p = subprocess.run([os.path.join(REPO, "tests", "gpu", "e2e.sh"), "--cpu", "--budget", "150",
                        "--checks", "train,save_restore,sigkill,cold"],
                       capture_output=True, text=True, timeout=1200, env=env)
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    status = {c["name"]: c["status"] for c in report["checks"]}
    failed = {c["name"]: c["why"] for c in report["checks"] if c["status"] == "FAIL"}
    assert not failed and p.returncode == 0, (failed, p.stdout[-3000:], p.stderr[-2000:])
    want = ["python_for_embedding", "build", "kernel_start", "train_across_cells", "save_restore.64MiB",
            "sigkill_mid_cell", "cold_vs_naive", "libraries_loaded"]
    if bundled:
        want += ["bundle", "bundle_wheels_cp312", "redis_from_bundle"]
    else:
        assert status.get("bundle") == "SKIP" and report["prefix"].startswith("system"), report
    for name in want:
        assert status.get(name) == "PASS", (name, status)
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert "| train_across_cells | PASS |" in md and "Passed %d, failed 0" % report["summary"]["PASS"] in md

"""tests/gpu/e2e.sh --cpu: the GPU machine's end-to-end run, here without a GPU, on the same build path (the
kernel and its store built with DEPS_PREFIX, found at run time through their RPATH), so it cannot rot between
device tasks.  With a bundle (.gpubundle, `make gpu-bundle`: needs Debian's mirrors and PyPI, so this test never
makes one) the prefix is the bundle's unpacked Debian packages and its redis-server, and its cp312 wheels are
checked for a complete set; without one (a fresh checkout, CI) the prefix is the system's root (/), the same
Makefile path against Debian's installed libraries.  The checks that need CUDA are not run here (the report
lists them as skipped with the reason); the others drive the real kernel through jupyter_client.

Cost, on 2 shared cores: about 35 s when build/e2e-cpu is up to date (four checks; `tests/gpu/e2e.sh --cpu`
alone runs them all, ~100 s), about 2.5 minutes from a clean tree (the build into build/e2e-cpu: ~45
CPU-seconds, 1-1.5 minutes of wall time under load)."""
import json
import os
import shutil
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLE = os.path.join(REPO, ".gpubundle")


def test_e2e_cpu_mode(tmp_path):
    bundled = os.path.exists(os.path.join(BUNDLE, "MANIFEST.json"))
    out = str(tmp_path / "report")
    work = tempfile.mkdtemp(prefix="ll-e2e-")
    env = dict(os.environ, OUT=out, LL_E2E_WORK=work)
    try:
        p = subprocess.run([os.path.join(REPO, "tests", "gpu", "e2e.sh"), "--cpu", "--budget", "150",
                            "--checks", "train,save_restore,sigkill,cold"],
                           capture_output=True, text=True, timeout=1200, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
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
    # Not silent about the pool's pages (huge pages where the host allows them, else why not), and the
    # pools' logs come back beside the report (the device tool returns only what is under $OUT).
    pages = [c for c in report["checks"] if c["name"] == "pool_pages"]
    assert pages and pages[0]["status"] in ("PASS", "SKIP") and pages[0]["figures"]["kind"], pages
    assert pages[0]["status"] == "PASS" or pages[0]["why"].startswith("4 KiB pages"), pages
    assert report["host"]["pool_mib"] >= 16 and "shm_free_bytes" in report["host"], report["host"]
    with open(os.path.join(out, "pool.log")) as f:
        logs = f.read()
    assert logs.startswith("==> ") and "/pool-warm/pool.log" in logs and "/pool-cold/pool.log" in logs, logs[:500]
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert "| train_across_cells | PASS |" in md and "Passed %d, failed 0" % report["summary"]["PASS"] in md

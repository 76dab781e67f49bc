"""The fuzz targets (tests/fuzz/fuzz_*.c, built by tests/fuzz.mk with clang-14, libFuzzer, ASan and UBSan)
each run for a few seconds from their seeds (tests/fuzz/corpus/<target>): a crash, a sanitizer report, a
leak or an allocation past the limit fails the test with libFuzzer's report.  `make fuzz` runs them for
longer.  LL_FUZZ_SECONDS changes the time per target here (default 3)."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SECONDS = int(os.environ.get("LL_FUZZ_SECONDS", "3"))
TARGETS = ["wire", "hmac", "conn", "store_meta", "analysis", "hostd"]


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_runs_clean(target, tmp_path):
    exe = os.path.join(REPO, "build", "fuzz", "fuzz_" + target)
    if not os.access(exe, os.X_OK):
        pytest.fail("%s is not built: `make test` builds it (Debian: clang, libclang-rt-14-dev)" % exe)
    corpus = tmp_path / "corpus"
    shutil.copytree(os.path.join(HERE, "corpus", target), corpus)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=%d" % (target != "analysis"),
               UBSAN_OPTIONS="print_stacktrace=1")
    # No RSS limit: a process started by a big one (pytest after the store's tests) inherits its peak RSS
    # (Linux keeps ru_maxrss across exec), which libFuzzer would take for its own; a single allocation of
    # 2 GiB or more still fails the run.
    p = subprocess.run([exe, "-max_total_time=%d" % SECONDS, "-rss_limit_mb=0", "-malloc_limit_mb=2048",
                        "-timeout=10",
                        "-artifact_prefix=%s/" % tmp_path, str(corpus)],
                       capture_output=True, text=True, env=env, timeout=SECONDS + 120)
    assert p.returncode == 0, "fuzz_%s failed:\n%s" % (target, p.stderr[-6000:])
    assert "Done" in p.stderr, p.stderr[-2000:]

"""The systemd unit `make install-hostd` installs (hostd/looseleaf-hostd.service), checked by
`systemd-analyze verify`: systemd is not PID 1 where the tests run, so the unit cannot be started there, but
its settings are checked as systemd reads them.  The unit names its binary as @BINDIR@/looseleaf (the install
puts the directory in), and verify wants an existing executable: the copy checked names the built binary.
Runs as any user; skipped without systemd-analyze.  Costs ~1 s."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed "
                    "(Debian: the systemd package)")
def test_unit_verifies(tmp_path):
    with open(os.path.join(REPO, "hostd", "looseleaf-hostd.service")) as f:
        text = f.read()
    assert "ExecStart=@BINDIR@/looseleaf hostd" in text
    unit = tmp_path / "looseleaf-hostd.service"
    unit.write_text(text.replace("@BINDIR@", os.path.join(REPO, "build")))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if "looseleaf-hostd" in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr
    # ... and what verify would say of a broken one (so the check above can fail).
    unit.write_text(text.replace("@BINDIR@", str(tmp_path / "nowhere")).replace("Restart=", "Restartt="))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Restartt" in r.stdout + r.stderr, r.stdout + r.stderr

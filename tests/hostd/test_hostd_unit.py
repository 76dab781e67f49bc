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


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed "
                    "(Debian: the systemd package)")
def test_install_hostd_puts_binary_and_unit_in_place(tmp_path):
    """`make install-hostd` with DESTDIR (which only copies; without it, it also runs systemctl enable --now):
    the binary under PREFIX/bin, executable and answering --version; the unit under /etc/systemd/system naming
    that binary, and verifying once the DESTDIR prefix is put in front of its path."""
    dest, prefix = tmp_path / "root", "/opt/llhostd"
    r = subprocess.run(["make", "-s", "install-hostd", "DESTDIR=%s" % dest, "PREFIX=%s" % prefix], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    exe = dest / prefix.lstrip("/") / "bin" / "looseleaf"
    assert os.access(exe, os.X_OK) and (os.stat(exe).st_mode & 0o777) == 0o755
    v = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    assert v.returncode == 0 and "looseleaf" in v.stdout.lower(), v.stdout + v.stderr
    unit = dest / "etc" / "systemd" / "system" / "looseleaf-hostd.service"
    text = unit.read_text()
    assert "ExecStart=%s/bin/looseleaf hostd " % prefix in text and "@BINDIR@" not in text
    check = tmp_path / "looseleaf-hostd.service"
    check.write_text(text.replace(prefix + "/bin", str(exe.parent)))
    r = subprocess.run(["systemd-analyze", "verify", str(check)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "looseleaf-hostd" not in r.stdout + r.stderr, r.stdout + r.stderr

"""`make lint`'s dependency audit: pip-audit, run for real, against the local OSV service over loopback HTTP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .harness import ROOT

AUDIT = [sys.executable, "-m", "agents_stream.testing.osv", "audit"]


def run_audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*AUDIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_audit_fails_on_a_vulnerable_pin(tmp_path: Path) -> None:
    """The old floor aiohttp==3.14.1 still has a high advisory: the audit names it and exits 1."""
    pins = tmp_path / "pins.txt"
    pins.write_text("aiohttp==3.14.1\njsonschema==4.26.0\n")
    done = run_audit("-r", str(pins))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GHSA-cq5v-8q36-5273" in done.stdout and "3.14.3" in done.stdout


def test_audit_passes_on_the_constraints_make_install_uses() -> None:
    """constraints.txt, the pinned set that make install installs and the suite runs on, has no known advisory."""
    done = run_audit("-r", "constraints.txt")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No known vulnerabilities found" in done.stderr


def test_an_unreachable_service_fails_the_audit(tmp_path: Path) -> None:
    """A service that does not answer fails the audit: it never passes having checked nothing."""
    pins = tmp_path / "pins.txt"
    pins.write_text("jsonschema==4.26.0\n")
    done = run_audit("-r", str(pins), "--osv-url", "http://127.0.0.1:9/v1/query")
    assert done.returncode != 0, done.stdout + done.stderr

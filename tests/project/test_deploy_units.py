"""The systemd units under deploy/ pass `systemd-analyze verify` (scripts/check-units.sh, also run by CI)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dashboard.stack import BASE_DIR

CHECK = BASE_DIR / "scripts" / "check-units.sh"
AGENT_UNIT = BASE_DIR / "deploy" / "layercake-agent.service"

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def check_units(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHECK), *args], capture_output=True, text=True, timeout=120)


def test_it_verifies_every_unit_under_deploy():
    result = check_units()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: layercake-agent.service" in result.stdout


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("ProtectSystem=strict", "ProtectSystem=bogus"), "Failed to parse protect system value"),
        (
            ("RestartSec=10s", "RestartSteps=6"),
            "Unknown key 'RestartSteps'",
        ),  # systemd 254+, not on Debian 12
        (
            ("ExecStart=/opt/layercake-agent/bin/layercake-agent run", "ExecStart=layercake-agent run"),
            "Command layercake-agent is not executable",
        ),  # only absolute paths get a stand-in
    ],
)
def test_it_fails_a_unit_that_systemd_would_not_accept_as_written(change, message, tmp_path: Path):
    old, new = change
    text = AGENT_UNIT.read_text()
    assert old in text
    (tmp_path / AGENT_UNIT.name).write_text(text.replace(old, new))
    result = check_units(str(tmp_path))
    assert result.returncode == 1
    assert f"FAILED: {AGENT_UNIT.name}" in result.stdout and message in result.stdout

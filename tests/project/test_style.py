"""The repository keeps to the limits its configuration states (pyproject.toml): ruff's lint rules, complexity 10,
and ruff's formatting at 110 columns. Run as a test so the README's test command checks it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.fixtures import REPO


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_it_keeps_the_code_ruff_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_holds_every_function_to_complexity_10() -> None:
    config = (REPO / "pyproject.toml").read_text()
    assert "max-complexity = 10" in config

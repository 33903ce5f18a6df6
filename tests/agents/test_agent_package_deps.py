"""The agent wheel and the agent lock come from the same dependency ranges."""

from __future__ import annotations

import tomllib

from tests.fixtures import REPO


def requirement_lines(text: str) -> list[str]:
    return sorted(line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip())


def test_it_declares_the_same_dependencies_in_the_wheel_and_the_lock_input() -> None:
    pyproject = tomllib.loads((REPO / "agents" / "pyproject.toml").read_text())
    ranges = requirement_lines((REPO / "agents" / "requirements.in").read_text())
    assert sorted(pyproject["project"]["dependencies"]) == ranges

"""Access to the shared public fixtures (../shared/fixtures beside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("LAYERCAKE_FIXTURES", REPO.parent / "shared" / "fixtures"))


def fixture_files(kind: str, pattern: str = "*") -> list[Path]:
    """Every fixture file of one kind (topo, logs, metrics, placement), sorted by name."""
    return sorted(p for p in (FIXTURES / kind).glob(pattern) if p.is_file())


def read_fixture(path: Path) -> tuple[dict[str, str], str]:
    """Split a fixture into its header fields and its verbatim body (after the '---' line)."""
    raw = path.read_text(encoding="utf-8")
    head, sep, body = raw.partition("\n---\n")
    if not sep:
        raise ValueError(f"{path} has no '---' line")
    header: dict[str, str] = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        header[key.strip()] = value.strip()
    return header, body

"""Access to the public fixtures the tests use: copies in tests/data/fixtures, each file with its source header.

The copies are verbatim (a header, a '---' line, then the data) and never edited. `LAYERCAKE_FIXTURES` points the
tests at another copy with the same layout (e.g. the upstream `shared/fixtures` folder, to check it still agrees).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "tests" / "data" / "fixtures"
UPSTREAM = REPO.parent / "shared" / "fixtures"
FIXTURES = Path(os.environ.get("LAYERCAKE_FIXTURES", BUNDLED))
KINDS = ("topo", "logs", "metrics", "placement", "startup", "configs")


def fixture_files(kind: str, pattern: str = "*") -> list[Path]:
    """Every fixture file of one kind (topo, logs, metrics, placement, startup, configs), sorted by name."""
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

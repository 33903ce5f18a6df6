"""The bundled fixtures are verbatim copies of the public ones, so a clone alone runs every test. Fixtures added
here after the upstream copy (new public data, e.g. the llama-bench tables) carry their own source header."""

from __future__ import annotations

import pytest

from tests.fixtures import BUNDLED, KINDS, UPSTREAM, read_fixture


def bundled_files() -> list:
    return sorted(p for kind in KINDS for p in (BUNDLED / kind).iterdir() if p.is_file())


def test_it_bundles_every_kind_the_tests_read() -> None:
    counts = {kind: sum(1 for p in (BUNDLED / kind).iterdir() if p.is_file()) for kind in KINDS}
    assert counts == {"topo": 43, "logs": 50, "metrics": 6, "placement": 33, "startup": 4, "configs": 23}


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in bundled_files()
        if p.parent.name in ("topo", "logs", "metrics", "startup", "configs") or p.suffix == ".txt"
    ],
    ids=lambda p: p.name[:3],
)
def test_it_keeps_each_source_header(path) -> None:
    header, body = read_fixture(path)
    assert header.get("source") and body.strip()


@pytest.mark.skipif(
    not UPSTREAM.is_dir(), reason="no upstream shared/fixtures beside the repository (a plain clone)"
)
def test_it_matches_the_upstream_copy_byte_for_byte() -> None:
    upstream = [p for kind in KINDS if (UPSTREAM / kind).is_dir() for p in (UPSTREAM / kind).iterdir()]
    missing = [p.relative_to(UPSTREAM) for p in upstream if not (BUNDLED / p.relative_to(UPSTREAM)).is_file()]
    differing = [
        p.relative_to(BUNDLED)
        for p in bundled_files()
        if (UPSTREAM / p.relative_to(BUNDLED)).is_file()
        and (UPSTREAM / p.relative_to(BUNDLED)).read_bytes() != p.read_bytes()
    ]
    assert missing == [] and differing == []

"""All-reduce over PCIe without P2P follows nccl_tests_001's measured curve (issue #14, item 1.2)."""

from __future__ import annotations

import re

import pytest

from placement.links import STAGED, Link, gpu_link, staged_allreduce_us
from tests.fixtures import fixture_files, read_fixture

ROW = re.compile(r"^\s+(\d+)\s+\d+\s+float\s+sum\s+-1\s+([\d.]+)\s")


def measured() -> list[tuple[int, float]]:
    _, body = read_fixture(fixture_files("placement", "nccl_tests_001.txt")[0])
    return [(int(m[1]), float(m[2])) for line in body.splitlines() if (m := ROW.match(line))]


def test_it_reproduces_every_measured_two_rank_all_reduce_within_7_percent() -> None:
    rows = measured()
    assert len(rows) == 28
    link = gpu_link("PIX", "NS", 3, driver_p2p=False)
    assert link.kind == STAGED and link.without_p2p
    for size, us in rows:
        assert link.allreduce_us(size, 2) == pytest.approx(us, rel=0.07), size  # the 12 us floor jitters 6 %


def test_it_costs_more_than_the_latency_bandwidth_line_in_the_decode_range() -> None:
    line = Link("PIX", "p2p", "NS", 6.0, 4.0)  # the old straight line, as a P2P-kind link computes it
    for size in (32768, 65536, 131072):
        assert staged_allreduce_us(size, 2, 4.0) > 1.15 * line.allreduce_us(size, 2)


def test_it_scales_to_more_ranks_and_faster_pcie() -> None:
    assert staged_allreduce_us(8, 4, 4.0) == pytest.approx(3 * 12.25)  # 6 ring steps of the 2-step floor
    gen4 = staged_allreduce_us(64 << 20, 2, 8.0)
    assert gen4 == pytest.approx(staged_allreduce_us(64 << 20, 2, 4.0) / 2, rel=0.01)

"""Link classes between GPUs and what an all-reduce or a pipeline hand-off costs on each.

Speeds are the measured figures summarised in docs/research.md (section 3, link speeds; the nccl_tests_* files
are in tests/data/fixtures/placement):
  * host-staged PCIe (no P2P): nccl_tests_001 (2x 2080 Ti, Gen3, P2P NS) all_reduce floor ~12 us with
    2 ranks = 2 ring steps -> 6 us per step; busbw plateau 4.0 GB/s = 0.25 x 15.75 GB/s (Gen3 x16).
  * PCIe with P2P: 4 ranks behind one PLX switch, in-graph all-reduce 19.4 us at 4 KiB = 6 ring steps
    -> ~3.2 us per step; bandwidth 0.8 x Gen4 x16 = 25.2 GB/s, matching 25.7-26.0 GB/s busbw of
    nccl_tests_003 (4x 4090 with P2P).
  * NVLink: 20 GB/s of busbw per link (A100 NV12 pair 208 GB/s, nccl-tests#178), capped at 75 % of
    the GPU's NVLink total per direction; 2.5 us per ring step (vLLM custom all-reduce 4-12 us).
  * host-staged all-reduce between those points is not a straight line: NCCL switches protocols and copies
    through host memory, so 16-256 KiB (the decode all-reduce of 1-16 streams) takes 1.1-1.4x the
    latency + bandwidth line. STAGED_ALLREDUCE_US is nccl_tests_001's measured curve, interpolated in log-log
    and stretched to other rank counts and PCIe generations (`staged_allreduce_us`).
  * network: nccl_tests_002 (2 nodes x 8 H100) all_reduce floor ~123 us -> ~61.5 us per inter-node
    step; bandwidth 80 % of the line rate (network_gbps / 8).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

NV_RE = re.compile(r"NV(\d+)$")
P2P_BROKEN = frozenset({"NS", "CNS", "GNS", "TNS", "DR"})
PCIE_GBS = {1: 2.0, 2: 4.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}

NVLINK, P2P, UNKNOWN, STAGED, CROSS_SOCKET, NETWORK = (
    "nvlink",
    "p2p",
    "unknown",
    "staged",
    "cross_socket",
    "network",
)
# Order used to build TP groups: lower is better.
QUALITY = {NVLINK: 0, P2P: 1, UNKNOWN: 2, STAGED: 3, CROSS_SOCKET: 4, NETWORK: 5}

NVLINK_STEP_US, P2P_STEP_US, STAGED_STEP_US, NETWORK_STEP_US = 2.5, 3.2, 6.0, 61.5
NVLINK_GBS_PER_LINK, P2P_SHARE, STAGED_SHARE, NETWORK_SHARE = 20.0, 0.8, 0.25, 0.8
# nccl_tests_001 (2 ranks, PCIe Gen3, P2P NS): all_reduce_perf out-of-place (bytes, us), 8 B .. 1 MiB;
# above 1 MiB the bus-bandwidth plateau (STAGED_SHARE x Gen3 = 4.0 GB/s) holds.
STAGED_ALLREDUCE_US = (
    (8, 12.25),
    (4096, 11.79),
    (8192, 13.07),
    (16384, 17.11),
    (32768, 24.62),
    (65536, 40.10),
    (131072, 56.90),
    (262144, 86.04),
    (524288, 150.2),
    (1048576, 279.5),
)
STAGED_REFERENCE_GBS = 4.0  # the table's plateau: Gen3 x16 x STAGED_SHARE
KIND_TEXT = {
    NVLINK: "NVLink",
    P2P: "PCIe P2P",
    UNKNOWN: "unknown link (no topology)",
    STAGED: "PCIe without P2P (copies staged through host memory)",
    CROSS_SOCKET: "through the CPU interconnect between sockets, no P2P",
    NETWORK: "network",
}


@dataclass(frozen=True)
class Link:
    label: str  # as printed by nvidia-smi (NV12, PIX, SYS ...), NET across nodes, ? when unknown
    kind: str
    p2p: str | None  # status from `nvidia-smi topo -p2p`, None when not reported
    step_us: float  # latency of one ring step
    busbw_gbs: float  # all-reduce bus bandwidth
    nvlink_gen: int = 0

    @property
    def quality(self) -> int:
        return QUALITY[self.kind]

    @property
    def without_p2p(self) -> bool:
        """No NVLink and no P2P: NCCL stages every all-reduce through host memory."""
        return self.kind in (STAGED, CROSS_SOCKET, UNKNOWN)

    def describe(self) -> str:
        status = f", P2P {self.p2p}" if self.p2p else ""
        if self.kind == NVLINK:
            links = NV_RE.match(self.label)
            generation = f", generation {self.nvlink_gen}" if self.nvlink_gen else ""
            return (
                f"{self.label} (NVLink, {links.group(1) if links else '?'} links{generation}, "
                f"~{self.busbw_gbs:.0f} GB/s bus{status})"
            )
        return f"{self.label} ({KIND_TEXT[self.kind]}{status})"

    def allreduce_us(self, size_bytes: float, ranks: int) -> float:
        """Ring all-reduce: 2(n-1) steps of latency plus 2(n-1)/n of the message over the bus; host-staged
        links follow the measured curve instead."""
        if ranks <= 1:
            return 0.0
        if self.without_p2p:
            return staged_allreduce_us(size_bytes, ranks, self.busbw_gbs)
        steps = 2 * (ranks - 1)
        return steps * self.step_us + steps / ranks * size_bytes / (self.busbw_gbs * 1e3)

    def send_us(self, size_bytes: float) -> float:
        """One point-to-point hand-off (pipeline stage boundary)."""
        return self.step_us + size_bytes / (self.busbw_gbs * 1e3)


def staged_allreduce_us(size_bytes: float, ranks: int, busbw_gbs: float) -> float:
    """nccl_tests_001's 2-rank curve t2, for n ranks (2(n-1) ring steps of S/n each, so (n-1) x t2 of
    2S/n) and another bus bandwidth (the message scaled by the table's bandwidth over this one)."""
    size = max(1.0, 2 * size_bytes / ranks * STAGED_REFERENCE_GBS / busbw_gbs)
    return (ranks - 1) * _two_rank_us(size)


def _two_rank_us(size: float) -> float:
    table = STAGED_ALLREDUCE_US
    if size <= table[0][0]:
        return table[0][1]
    last_size, last_us = table[-1]
    if size >= last_size:
        return last_us + (size - last_size) / (STAGED_REFERENCE_GBS * 1e3)
    for (s0, t0), (s1, t1) in zip(table, table[1:], strict=False):
        if s0 <= size <= s1:
            share = math.log(size / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + share * math.log(t1 / t0))
    raise AssertionError("unreachable: the table covers every size")


def _pcie(gen: int) -> float:
    return PCIE_GBS.get(gen, PCIE_GBS[4])


def gpu_link(
    label: str | None, p2p: str | None, pcie_gen: int, driver_p2p: bool, nvlink: tuple[float, int] = (0.0, 0)
) -> Link:
    """The link between two GPUs of one node, from its topo -m label and P2P status; `nvlink` is the
    GPUs' NVLink total bandwidth (GB/s, both directions) and generation from the GPU table."""
    if label is None:
        return Link("?", UNKNOWN, p2p, STAGED_STEP_US, STAGED_SHARE * _pcie(pcie_gen))
    nv = NV_RE.match(label)
    if nv:
        total, generation = nvlink
        cap = 0.75 * total / 2 if total else float("inf")
        return Link(
            label, NVLINK, p2p, NVLINK_STEP_US, min(int(nv.group(1)) * NVLINK_GBS_PER_LINK, cap), generation
        )
    if label in ("SYS", "SOC"):
        return Link(label, CROSS_SOCKET, p2p, STAGED_STEP_US, STAGED_SHARE * _pcie(pcie_gen))
    has_p2p = p2p == "OK" or (p2p not in P2P_BROKEN and driver_p2p)
    if has_p2p:
        return Link(label, P2P, p2p, P2P_STEP_US, P2P_SHARE * _pcie(pcie_gen))
    return Link(label, STAGED, p2p, STAGED_STEP_US, STAGED_SHARE * _pcie(pcie_gen))


def network_link(gbps: float, rdma: bool) -> Link:
    label = f"NET {gbps:g} Gb/s{' RDMA' if rdma else ''}"
    return Link(label, NETWORK, None, NETWORK_STEP_US, max(gbps, 0.001) / 8 * NETWORK_SHARE)


def worst(links: list[Link]) -> Link | None:
    """The link that gates a collective: the slowest per step, then the narrowest."""
    if not links:
        return None
    return max(links, key=lambda link: (link.quality, link.step_us, -link.busbw_gbs))

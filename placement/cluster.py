"""Cluster input: nodes, GPUs (with specs from the built-in GPU table) and the links between them.

The JSON is the structure the server builds from the live fleet:
{"nodes": [{"name", "gpus": [{"index", "name", "memory_total_mib", "memory_free_mib"?, "mem_bw_gbs"?,
"bf16_tflops"?, "numa"?}], "topology"?, "p2p"?, "network_gbps"?, "rdma"?, "network_interface"?,
"address"?}]}. `topology`/`p2p` are raw `nvidia-smi topo -m` / `topo -p2p r` text or the parsed
object of `python -m agents.topo --json`.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from placement.errors import PlacementError
from placement.links import Link, gpu_link, network_link

GPU_NAME_RE = re.compile(r"GPU(\d+)$")


@dataclass(frozen=True)
class GpuModel:
    name: str
    family: str
    hints: frozenset[str]
    memory_gib: float
    mem_bw_gbs: float
    tflops: float  # dense BF16 (FP16 where the GPU has no BF16)
    nvlink_gbs_total: float
    nvlink_gen: int
    pcie_gen: int
    pcie_p2p: bool  # stock driver allows P2P over PCIe (GeForce: no)


# Per-node input errors: the node is skipped and reported, the rest of the cluster is still planned. Besides
# PlacementError (a clear message), a malformed entry can raise these while it is read.
NODE_INPUT_ERRORS = (
    PlacementError,
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
    ArithmeticError,
)
ESTIMATED = "estimated"  # GPU.model of a GPU that is not in the table and has no speed overrides
MAX_GPU_MEMORY_MIB = 2**24  # 16 TiB, far above any GPU: a larger total is a reporting error


@cache
def gpu_table() -> tuple[GpuModel, ...]:
    text = resources.files("placement.data").joinpath("gpus.csv").read_text(encoding="utf-8")
    return tuple(
        GpuModel(
            row["name"],
            row["family"],
            frozenset(row["hints"].split()),
            float(row["memory_gib"]),
            float(row["mem_bw_gbs"]),
            float(row["bf16_tflops"]),
            float(row["nvlink_gbs_total"]),
            int(row["nvlink_gen"]),
            int(row["pcie_gen"]),
            row["pcie_p2p"] == "yes",
        )
        for row in csv.DictReader(text.splitlines())
    )


@cache
def match_gpu_model(name: str, memory_total_mib: float) -> GpuModel | None:
    """The table row for an nvidia-smi GPU name: family token must match, hints and memory break ties."""
    tokens = set(re.findall(r"[a-z0-9]+", name.lower()))
    candidates = [model for model in gpu_table() if model.family in tokens]
    if not candidates:
        return None
    memory_gib = memory_total_mib / 1024
    return max(candidates, key=lambda m: (len(m.hints & tokens), -abs(m.memory_gib - memory_gib)))


@cache
def estimated_speed() -> tuple[float, float]:
    """(memory GB/s, dense TFLOPS) assumed for a GPU the table does not know: the lowest of each in the table
    (L4's 300 GB/s, T4's 65 TFLOPS). An NVIDIA GPU that is asked to serve an LLM is rarely slower than the
    slowest data-center GPUs in the table, so the tokens/s predicted from these is a floor, not a promise;
    its plans carry an `estimated_speed` risk saying so."""
    table = gpu_table()
    return min(m.mem_bw_gbs for m in table), min(m.tflops for m in table)


@dataclass
class GPU:
    node: str
    index: int
    name: str
    memory_total_mib: float
    memory_free_mib: float
    mem_bw_gbs: float
    tflops: float
    nvlink_gbs_total: float
    nvlink_gen: int
    pcie_gen: int
    driver_p2p: bool
    numa: str | None
    model: str  # GPU table row, "override" (speeds given), or ESTIMATED (unknown GPU, speeds assumed)

    @property
    def total_gib(self) -> float:
        return self.memory_total_mib / 1024

    @property
    def free_gib(self) -> float:
        return self.memory_free_mib / 1024

    @property
    def used_gib(self) -> float:
        return self.total_gib - self.free_gib

    @property
    def label(self) -> str:
        return f"{self.node}:GPU{self.index}"


@dataclass
class Node:
    name: str
    gpus: list[GPU]
    links: dict[tuple[int, int], Link]
    network_gbps: float | None = None
    rdma: bool = False
    interface: str | None = None
    address: str | None = None
    has_topology: bool = False
    notes: list[str] = field(default_factory=list)

    def gpu(self, index: int) -> GPU | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    def link(self, a: int, b: int) -> Link:
        return self.links[(a, b) if a < b else (b, a)]

    @cached_property
    def quality(self) -> dict[tuple[int, int], int]:
        """Link quality (lower is better) for every ordered pair, for building TP groups."""
        found = {}
        for (a, b), link in self.links.items():
            found[(a, b)] = found[(b, a)] = link.quality
        return found

    def hardware_signature(self) -> tuple[Any, ...]:
        """Everything planning depends on except the name and free memory."""
        gpus = tuple(
            (g.index, g.model, g.memory_total_mib, g.mem_bw_gbs, g.tflops, g.numa) for g in self.gpus
        )
        return gpus, tuple(sorted(self.links.items())), self.network_gbps, self.rdma

    def signature(self) -> tuple[Any, ...]:
        """Hardware plus free memory: equal signatures give equal plans."""
        return self.hardware_signature(), tuple(g.memory_free_mib for g in self.gpus)


@dataclass(frozen=True)
class NodeRejection:
    """A node left out of planning because its input is unusable; `reason` names what is wrong."""

    name: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.name, "gpus": [], "problems": [{"code": "node_input", "message": self.reason}]}


@dataclass
class Cluster:
    nodes: list[Node]
    rejected_nodes: list[NodeRejection] = field(default_factory=list)

    @cached_property
    def _by_name(self) -> dict[str, Node]:
        return {node.name: node for node in self.nodes}

    def node(self, name: str) -> Node:
        found = self._by_name.get(name)
        if found is not None:
            return found
        rejected = next((r for r in self.rejected_nodes if r.name == name), None)
        if rejected is not None:
            raise PlacementError(f"node '{name}' cannot be planned: {rejected.reason}")
        raise PlacementError(
            f"no node named '{name}' in the cluster ({', '.join(n.name for n in self.nodes)})"
        )


# ---------------------------------------------------------------- loading


@dataclass
class TopologyMemo:
    """Per-load memo: a fleet's nodes mostly share a handful of topologies (often as the same raw
    `nvidia-smi topo -m` text), so each distinct text is parsed once and each distinct
    (topology, p2p, GPU link properties) gets its link table built once; nodes share the result."""

    parsed: dict[str, dict[str, Any]] = field(default_factory=dict)
    links: dict[tuple[Any, ...], dict[tuple[int, int], Link]] = field(default_factory=dict)

    def topology(self, value: Any, where: str) -> dict[str, Any] | None:
        if not isinstance(value, str):
            return _topology(value, where)
        found = self.parsed.get(value)
        if found is None:
            found = self.parsed[value] = _topology(value, where)
        return found

    def node_links(
        self, gpus: list[GPU], raw: dict[str, Any], topo: dict[str, Any] | None, p2p: dict[str, Any] | None
    ) -> dict[tuple[int, int], Link]:
        """The node's link table, shared with every node of the same topology text and GPU properties.
        Only raw texts (or no topology) are keys: a parsed object given inline is built for its node."""
        texts = (raw.get("topology"), raw.get("p2p"))
        if not all(text is None or isinstance(text, str) for text in texts):
            return _links(gpus, topo, p2p)
        key = (*texts, tuple(_link_properties(g) for g in gpus))
        found = self.links.get(key)
        if found is None:
            found = self.links[key] = _links(gpus, topo, p2p)
        return found


def _link_properties(gpu: GPU) -> tuple[Any, ...]:
    """What a GPU's links are built from (besides the topology)."""
    return gpu.index, gpu.nvlink_gbs_total, gpu.nvlink_gen, gpu.pcie_gen, gpu.driver_p2p


def load_cluster(obj_or_path: dict[str, Any] | str | Path) -> Cluster:
    """A Cluster from the parsed JSON object or a path to the JSON file. A node whose entry is unusable is
    left out and listed in `rejected_nodes` with the reason; only a cluster with no usable node is an error."""
    data = obj_or_path if isinstance(obj_or_path, dict) else _read(Path(obj_or_path))
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise PlacementError("cluster: 'nodes' must be a non-empty list")
    built, rejected = _drop_repeated_names(*_read_nodes(nodes))
    if not built:
        raise PlacementError("cluster: no node can be planned: " + "; ".join(r.reason for r in rejected))
    return Cluster(built, rejected)


def _read_nodes(nodes: list[Any]) -> tuple[list[Node], list[NodeRejection]]:
    built, rejected = [], []
    memo = TopologyMemo()
    for i, raw in enumerate(nodes):
        where = f"cluster: nodes[{i}]"
        try:
            built.append(_node(raw, where, memo))
        except NODE_INPUT_ERRORS as exc:
            name = raw.get("name") if isinstance(raw, dict) else None
            name = name if isinstance(name, str) and name else f"nodes[{i}]"
            reason = (
                str(exc)
                if isinstance(exc, PlacementError)
                else f"{where} ('{name}'): malformed entry ({type(exc).__name__})"
            )
            rejected.append(NodeRejection(name, reason))
    return built, rejected


def _drop_repeated_names(
    built: list[Node], rejected: list[NodeRejection]
) -> tuple[list[Node], list[NodeRejection]]:
    """Plans name nodes by name: nodes that share one cannot be told apart, so none of them is planned."""
    counts = Counter(node.name for node in built)
    repeated = {name for name, count in counts.items() if count > 1}
    rejected += [
        NodeRejection(
            name, f"cluster: {counts[name]} nodes are named '{name}'; plans could not say which one is meant"
        )
        for name in sorted(repeated)
    ]
    return [node for node in built if node.name not in repeated], rejected


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlacementError(f"cluster file {path}: cannot read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise PlacementError(f"cluster file {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(data, dict):
        raise PlacementError(f"cluster file {path}: expected a JSON object with 'nodes'")
    return data


def _number(raw: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        detail = "missing" if value is None else f"must be a positive finite number, got {value!r}"
        raise PlacementError(f"{where}: '{key}' {detail}")
    return float(value)


def _node(raw: Any, where: str, memo: TopologyMemo) -> Node:
    if not isinstance(raw, dict):
        raise PlacementError(f"{where}: expected an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise PlacementError(f"{where}: 'name' must be a non-empty string")
    where = f"cluster: node '{name}'"
    gpus_raw = raw.get("gpus")
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise PlacementError(f"{where}: 'gpus' must be a non-empty list")
    topo = memo.topology(raw.get("topology"), f"{where} topology")
    p2p = memo.topology(raw.get("p2p"), f"{where} p2p")
    numa = _numa_by_index(topo)
    gpus = sorted(
        (_gpu(g, name, f"{where} gpus[{i}]", numa) for i, g in enumerate(gpus_raw)), key=lambda g: g.index
    )
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise PlacementError(f"{where}: GPU indices repeat ({indices})")
    gbps = raw.get("network_gbps")
    if gbps is not None:
        gbps = _number(raw, "network_gbps", where)
    node = Node(
        name,
        gpus,
        {},
        gbps,
        bool(raw.get("rdma", False)),
        raw.get("network_interface"),
        raw.get("address"),
        topo is not None,
    )
    node.links = memo.node_links(gpus, raw, topo, p2p)
    return node


def _gpu(raw: Any, node: str, where: str, numa: dict[int, str | None]) -> GPU:
    if not isinstance(raw, dict):
        raise PlacementError(f"{where}: expected an object")
    index = raw.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise PlacementError(f"{where}: 'index' must be a non-negative integer, got {index!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise PlacementError(f"{where}: 'name' must be a non-empty string")
    total = _number(raw, "memory_total_mib", where)
    if total > MAX_GPU_MEMORY_MIB:
        raise PlacementError(f"{where}: memory_total_mib {total:g} is more than any GPU has")
    free = _number(raw, "memory_free_mib", where, total) if raw.get("memory_free_mib") != 0 else 0.0
    if free > total:
        raise PlacementError(f"{where}: memory_free_mib {free:g} exceeds memory_total_mib {total:g}")
    model = match_gpu_model(name, total)
    bw, tflops = raw.get("mem_bw_gbs"), raw.get("bf16_tflops")
    estimated = model is None and (bw is None or tflops is None)
    default_bw, default_tflops = (model.mem_bw_gbs, model.tflops) if model else estimated_speed()
    return GPU(
        node=node,
        index=index,
        name=name,
        memory_total_mib=total,
        memory_free_mib=free,
        mem_bw_gbs=_number(raw, "mem_bw_gbs", where) if bw is not None else default_bw,
        tflops=_number(raw, "bf16_tflops", where) if tflops is not None else default_tflops,
        nvlink_gbs_total=model.nvlink_gbs_total if model else 0.0,
        nvlink_gen=model.nvlink_gen if model else 0,
        pcie_gen=model.pcie_gen if model else 4,
        # Whether its driver allows P2P over PCIe is unknown too: assume not (TP then carries the link risk)
        # unless the node's `topo -p2p` says OK; a wrong "yes" would hide an NCCL hang.
        driver_p2p=model.pcie_p2p if model else not estimated,
        numa=str(raw["numa"]) if raw.get("numa") is not None else numa.get(index),
        model=model.name if model else ESTIMATED if estimated else "override",
    )


def _topology(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = _parse_text(value, where)
    if not isinstance(value, dict) or not isinstance(value.get("links"), list):
        raise PlacementError(f"{where}: expected `nvidia-smi topo` text or an object with 'links'")
    if value.get("kind") == "smi":
        raise PlacementError(f"{where}: this is a plain nvidia-smi table, not `nvidia-smi topo -m` output")
    for link in value["links"]:
        if not isinstance(link, dict) or not {"a", "b", "link"} <= set(link):
            raise PlacementError(f"{where}: every link needs 'a', 'b' and 'link', got {link!r}")
    return value


def _parse_text(text: str, where: str) -> dict[str, Any]:
    try:
        from agents.topo import TopologyParseError, parse_topology
    except ImportError as exc:
        raise PlacementError(
            f"{where}: raw topology text needs agents.topo, which is not importable"
        ) from exc
    try:
        return parse_topology(text)
    except TopologyParseError as exc:
        raise PlacementError(f"{where}: {exc}") from exc


def _index(name: str) -> int | None:
    match = GPU_NAME_RE.match(str(name))
    return int(match.group(1)) if match else None


def _numa_by_index(topo: dict[str, Any] | None) -> dict[int, str | None]:
    found: dict[int, str | None] = {}
    for gpu in (topo or {}).get("gpus", []):
        index = _index(gpu.get("name", ""))
        value = gpu.get("numa_affinity")
        if index is not None:
            found[index] = None if value in (None, "N/A") else str(value)
    return found


def _labels(topo: dict[str, Any] | None, want_p2p: bool) -> dict[tuple[int, int], str]:
    if topo is None or (topo.get("kind") == "p2p") != want_p2p:
        return {}
    labels = {}
    for link in topo["links"]:
        a, b = _index(link["a"]), _index(link["b"])
        if a is not None and b is not None and a != b:
            labels[(min(a, b), max(a, b))] = str(link["link"])
    return labels


def _links(
    gpus: list[GPU], topo: dict[str, Any] | None, p2p: dict[str, Any] | None
) -> dict[tuple[int, int], Link]:
    labels = _labels(topo, want_p2p=False)
    statuses = {**_labels(topo, want_p2p=True), **_labels(p2p, want_p2p=True)}
    links = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            key = (a.index, b.index)
            nvlink = (min(a.nvlink_gbs_total, b.nvlink_gbs_total), min(a.nvlink_gen, b.nvlink_gen))
            links[key] = gpu_link(
                labels.get(key),
                statuses.get(key),
                min(a.pcie_gen, b.pcie_gen),
                a.driver_p2p and b.driver_p2p,
                nvlink,
            )
    return links


def cross_node_link(a: Node, b: Node) -> Link | None:
    """The network between two nodes, or None when either does not say how it is connected."""
    if a.network_gbps is None or b.network_gbps is None:
        return None
    return network_link(min(a.network_gbps, b.network_gbps), a.rdma and b.rdma)

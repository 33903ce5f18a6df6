"""Plans for a model on a cluster: evaluate every placement, reject the bad ones with reasons, rank the rest.

Nodes are grouped by hardware (GPU models and sizes, links, NUMA, network). Each hardware class is
evaluated once on an idle twin (all memory free): what fails there fails on every node of the class
(less free memory never helps), so those rejections are reported once for the whole class. Nodes whose
free memory equals the twin's share its plans (`equivalent_nodes`). Busy nodes (other processes hold
memory) are evaluated again, for the class's feasible shapes only: all of them on small clusters, the
BUSY_SHAPES fastest on clusters of more than SMALL_CLUSTER nodes, since a busy node never beats an idle
node of its class on the same shape. Then multi-node placements (multinode.py).
"""

from __future__ import annotations

import math
from dataclasses import replace

from placement.cluster import Cluster, Node
from placement.errors import PlacementError
from placement.evaluate import Candidate, Evaluator
from placement.multinode import multi_node_candidates
from placement.request import Request, validate
from placement.result import PlanResult
from placement.shapes import layout_for, node_candidates, pool_of, reject_cross_socket_tp
from placement.spec import ModelSpec

RANK_BAND = 1.03  # plans within 3 % of each other's throughput rank by fewer GPUs, then fewer risks
SMALL_CLUSTER = 16
BUSY_SHAPES = 4


def plan(model: ModelSpec, cluster: Cluster, request: Request | None = None) -> PlanResult:
    """Ranked plans (best first) and the rejected configurations, for one model on one cluster."""
    request = validate(request or Request())
    evaluator = Evaluator(model, cluster, request)
    if not evaluator.backends:
        wanted = request.backend or "any backend"
        raise PlacementError(f"{wanted} cannot run {model.name} as {request.dtype or model.native_format}")
    nodes = _eligible_nodes(cluster, request)
    shapes_per_busy = None if len(nodes) <= SMALL_CLUSTER else BUSY_SHAPES
    candidates: list[Candidate] = []
    for members in _hardware_classes(nodes).values():
        candidates += _class_candidates(evaluator, members, request, shapes_per_busy)
    candidates += multi_node_candidates(evaluator, nodes, request)
    plans = rank([c for c in candidates if c.feasible])
    skipped = [] if request.node else cluster.rejected_nodes  # a pinned node is planned, or raised above
    return PlanResult(model, cluster, request, plans, [c for c in candidates if not c.feasible], skipped)


def rank(plans: list[Candidate]) -> list[Candidate]:
    def key(c: Candidate) -> tuple[float, ...]:
        band = math.floor(math.log(max(c.throughput, 1e-9)) / math.log(RANK_BAND))
        free = sum(g.memory_free_mib for g in c.layout.gpus)
        return (-band, len(c.layout.gpus), len(c.risks), -free)

    return sorted(plans, key=key)


def _eligible_nodes(cluster: Cluster, request: Request) -> list[Node]:
    nodes = [cluster.node(request.node)] if request.node else list(cluster.nodes)
    if request.gpus is not None:
        nodes = [n for n in nodes if all(n.gpu(i) for i in request.gpus)]
        if not nodes:
            raise PlacementError(f"no node has all of --gpus {','.join(map(str, request.gpus))}")
    return nodes


def _equivalence_classes(nodes: list[Node]) -> list[list[Node]]:
    classes: dict[tuple[object, ...], list[Node]] = {}
    for node in nodes:
        classes.setdefault(node.signature(), []).append(node)
    return list(classes.values())


def _hardware_classes(nodes: list[Node]) -> dict[tuple[object, ...], list[Node]]:
    classes: dict[tuple[object, ...], list[Node]] = {}
    for node in nodes:
        classes.setdefault(node.hardware_signature(), []).append(node)
    return classes


def _idle_twin(node: Node) -> Node:
    return replace(node, gpus=[replace(g, memory_free_mib=g.memory_total_mib) for g in node.gpus])


def _class_candidates(
    ev: Evaluator, members: list[Node], request: Request, shapes_per_busy: int | None
) -> list[Candidate]:
    twin = _idle_twin(members[0])
    twin_signature = twin.signature()
    found = list(node_candidates(ev, twin, request))
    reject_cross_socket_tp(found, request)
    by_signature: dict[tuple[object, ...], list[Node]] = {}
    for node in members:
        by_signature.setdefault(node.signature(), []).append(node)
    idle = by_signature.pop(twin_signature, [])
    out = [c for c in found if not c.feasible]
    for c in out:
        c.equivalent_nodes = [n.name for n in members if n.name != c.layout.node_names[0]]
    if idle:
        for c in found:
            if c.feasible:
                c.equivalent_nodes = [n.name for n in idle if n.name != c.layout.node_names[0]]
                out.append(c)
    shapes = _shapes_by_speed([c for c in found if c.feasible], shapes_per_busy)
    for busy in by_signature.values():
        out += _busy_candidates(ev, busy, shapes, request)
    return out


def _shapes_by_speed(feasible: list[Candidate], limit: int | None) -> list[tuple[str, int, int]]:
    ordered = sorted(feasible, key=lambda c: -c.throughput)
    shapes = [(c.backend, c.layout.tp, c.layout.pp) for c in ordered]
    return shapes if limit is None else shapes[:limit]


def _busy_candidates(
    ev: Evaluator, members: list[Node], shapes: list[tuple[str, int, int]], request: Request
) -> list[Candidate]:
    node = members[0]
    pool = pool_of(node, request)
    out = []
    for backend, tp, pp in shapes:
        layout = layout_for(ev, node, pool, backend, tp, pp)
        if layout is not None:
            candidate = ev.evaluate(layout)
            candidate.equivalent_nodes = [n.name for n in members[1:]]
            out.append(candidate)
    return out

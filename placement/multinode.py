"""Placements across nodes: PP between nodes with TP inside each (vLLM, SGLang), llama.cpp over RPC.

Only nodes of one GPU model and count are combined, taking those with the most free memory first; two
group sizes are tried: the fewest nodes whose free memory could hold the weights, and one more.
"""

from __future__ import annotations

import math

from placement.cluster import GPU, Node
from placement.evaluate import Candidate, Evaluator
from placement.grouping import divisors, tp_groups
from placement.layout import Layout, even_layers, make_layout
from placement.memory import GIB
from placement.request import LLAMA_CPP, OLLAMA, Request

MAX_NODES = 8  # largest multi-node group tried


def multi_node_candidates(ev: Evaluator, nodes: list[Node], request: Request) -> list[Candidate]:
    if len(nodes) < 2 or request.gpus is not None or request.node is not None:
        return []
    groups: dict[tuple[str, int], list[Node]] = {}
    for node in nodes:
        models = {g.model for g in node.gpus}
        if len(models) == 1:
            groups.setdefault((models.pop(), len(node.gpus)), []).append(node)
    found = []
    for members in groups.values():
        members = sorted(members, key=lambda n: -sum(g.memory_free_mib for g in n.gpus))
        for k in _node_counts(ev, members):
            found += _group_candidates(ev, members[:k], request)
    return found


def _node_counts(ev: Evaluator, members: list[Node]) -> list[int]:
    per_node = sum(g.free_gib for g in members[0].gpus)
    need = min(wb.total for wb in ev.weights.values()) / GIB
    smallest = max(2, math.ceil(need / max(per_node, 1e-9)))
    return [k for k in (smallest, smallest + 1) if k <= min(len(members), MAX_NODES)]


def _group_candidates(ev: Evaluator, nodes: list[Node], request: Request) -> list[Candidate]:
    per_node = len(nodes[0].gpus)
    found = []
    for backend in ev.backends:
        if backend == OLLAMA:
            continue
        if backend == LLAMA_CPP:
            if request.tp in (None, 1):
                found.append(ev.evaluate(ev.layer_split(backend, [g for n in nodes for g in n.gpus])))
            continue
        for tp in _multi_node_tp_sizes(per_node, len(nodes), request):
            pp = len(nodes) * per_node // tp
            if (request.tp or tp) == tp and (request.pp or pp) == pp:
                layout = _multi_layout(ev, nodes, backend, tp)
                found += [ev.evaluate(layout)] if layout else []
    return found


def _multi_node_tp_sizes(per_node: int, count: int, request: Request) -> list[int]:
    """TP inside a node; a forced TP larger than a node spans whole nodes (and is rejected for it)."""
    sizes = divisors(per_node)
    forced = request.tp
    if forced and forced > per_node and forced % per_node == 0 and (count * per_node) % forced == 0:
        sizes.append(forced)
    return sizes


def _multi_layout(ev: Evaluator, nodes: list[Node], backend: str, tp: int) -> Layout | None:
    per_node = len(nodes[0].gpus)
    if tp > per_node:
        span = tp // per_node
        stages = [tuple(g for n in nodes[i : i + span] for g in n.gpus) for i in range(0, len(nodes), span)]
        return make_layout(ev.cluster, backend, stages, even_layers(ev.model.num_layers, len(stages)))
    stages: list[tuple[GPU, ...]] = []
    for node in nodes:
        groups = tp_groups(node, node.gpus, tp, len(node.gpus) // tp)
        if groups is None:
            return None
        stages += groups
    return make_layout(ev.cluster, backend, stages, even_layers(ev.model.num_layers, len(stages)))

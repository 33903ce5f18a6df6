"""Enumerate placements, evaluate them, reject the bad ones with reasons and rank the rest.

Single node: every backend x GPU count x (TP, PP) factorization; TP groups are built inside the
best-linked GPUs (grouping.py), so PP boundaries fall on the weaker links. A TP group that crosses
CPU sockets is rejected (`link`) whenever the same number of GPUs can run without doing so, unless
the operator forces TP with --tp. Nodes with identical hardware, free memory and topology are
evaluated once and reported together (`equivalent_nodes`).
Multi-node: PP across nodes with TP inside each node (vLLM, SGLang) and llama.cpp RPC, over the
nodes of one GPU type with the most free memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from placement.cluster import GPU, Cluster, Node
from placement.errors import PlacementError
from placement.evaluate import Candidate, Evaluator
from placement.grouping import by_free_memory, divisors, tp_groups
from placement.layout import Layout, even_layers, make_layout
from placement.links import CROSS_SOCKET
from placement.memory import GIB, Issue
from placement.request import LLAMA_CPP, OLLAMA, Request, validate
from placement.result import PlanResult, shape_text
from placement.spec import ModelSpec

MAX_NODES = 8  # largest multi-node group tried
RANK_BAND = 1.03  # plans within 3 % of each other's throughput rank by fewer GPUs, then fewer risks


def plan(model: ModelSpec, cluster: Cluster, request: Request | None = None) -> PlanResult:
    """Ranked plans (best first) and the rejected configurations, for one model on one cluster."""
    request = validate(request or Request())
    evaluator = Evaluator(model, cluster, request)
    if not evaluator.backends:
        wanted = request.backend or "any backend"
        raise PlacementError(f"{wanted} cannot run {model.name} as {request.dtype or model.native_format}")
    nodes = _eligible_nodes(cluster, request)
    candidates: list[Candidate] = []
    for members in _equivalence_classes(nodes):
        found = list(_node_candidates(evaluator, members[0], request))
        _reject_cross_socket_tp(found, request)
        for candidate in found:
            candidate.equivalent_nodes = [node.name for node in members[1:]]
        candidates += found
    candidates += _multi_node_candidates(evaluator, nodes, request)
    plans = rank([c for c in candidates if c.feasible])
    return PlanResult(model, cluster, request, plans, [c for c in candidates if not c.feasible])


def rank(plans: list[Candidate]) -> list[Candidate]:
    def key(c: Candidate) -> tuple[float, ...]:
        band = math.floor(math.log(max(c.throughput, 1e-9)) / math.log(RANK_BAND))
        free = sum(g.memory_free_mib for g in c.layout.gpus)
        return (-band, len(c.layout.gpus), len(c.risks), -free)

    return sorted(plans, key=key)


# ---------------------------------------------------------------- nodes and GPU pools


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


def _pool(node: Node, request: Request) -> list[GPU]:
    if request.gpus is None:
        return list(node.gpus)
    return [gpu for gpu in node.gpus if gpu.index in request.gpus]


def _shapes(backend: str, n: int, request: Request) -> list[tuple[int, int]]:
    if backend == LLAMA_CPP and request.split_mode != "layer":
        shapes = [(n, 1)]  # row/tensor split: every GPU works on every layer
    elif backend in (LLAMA_CPP, OLLAMA):
        shapes = [(1, n)]
    else:
        shapes = [(tp, n // tp) for tp in divisors(n)]
    return [(tp, pp) for tp, pp in shapes
            if (request.tp is None or request.tp == tp) and (request.pp is None or request.pp == pp)]


# ---------------------------------------------------------------- single node


def _node_candidates(ev: Evaluator, node: Node, request: Request) -> Iterator[Candidate]:
    pool = _pool(node, request)
    counts = [len(pool)] if request.gpus is not None else range(1, len(pool) + 1)
    for backend in ev.backends:
        for n in counts:
            shapes = _shapes(backend, n, request)
            if not shapes:
                continue
            short = _weights_exceed(ev, backend, pool, n)
            if short:
                yield _quick_reject(ev, backend, pool, n, shapes[0], short)
                continue
            for tp, pp in shapes:
                layout = _layout(ev, node, pool, backend, tp, pp)
                if layout is not None:
                    yield ev.evaluate(layout)


def _layout(ev: Evaluator, node: Node, pool: list[GPU], backend: str, tp: int, pp: int) -> Layout | None:
    if backend == LLAMA_CPP and ev.request.split_mode != "layer":
        chosen = tuple(sorted(by_free_memory(pool)[:tp], key=lambda g: g.index))
        return make_layout(ev.cluster, backend, [chosen], [ev.model.num_layers])
    if backend in (LLAMA_CPP, OLLAMA):
        chosen = sorted(by_free_memory(pool)[:pp], key=lambda g: g.index)
        return ev.layer_split(backend, chosen)
    groups = tp_groups(node, pool, tp, pp)
    if groups is None:
        return None
    return make_layout(ev.cluster, backend, groups, even_layers(ev.model.num_layers, pp))


def _weights_exceed(ev: Evaluator, backend: str, pool: list[GPU], n: int) -> Issue | None:
    """A problem when the weights alone cannot fit in the n GPUs with the most free memory."""
    wb = ev.weights[backend]
    on_gpu = (wb.total - (wb.embed if backend in (LLAMA_CPP, OLLAMA) else 0.0)) / GIB
    best = by_free_memory(pool)[:n]
    free = sum(g.free_gib for g in best)
    if on_gpu <= free:
        return None
    busy = on_gpu <= sum(g.total_gib for g in best)  # it would fit if other processes let go
    message = (f"the weights alone ({on_gpu:.1f} GiB as {ev.settings[backend].fmt.name}) exceed the {free:.1f} GiB "
               f"free on the best {n} GPU(s){' (other processes hold the rest)' if busy else ''}; any TP x PP "
               f"over {n} GPU(s) fails")
    return Issue("busy" if busy else "memory", message)


def _quick_reject(ev: Evaluator, backend: str, pool: list[GPU], n: int, shape: tuple[int, int],
                  problem: Issue) -> Candidate:
    chosen = sorted(by_free_memory(pool)[:n], key=lambda g: g.index)
    tp, pp = shape
    stages = [tuple(chosen[i * tp:(i + 1) * tp]) for i in range(pp)]
    layout = make_layout(ev.cluster, backend, stages, even_layers(ev.model.num_layers, pp))
    return Candidate(layout, ev.settings[backend], None, None, [problem], [])


def _crosses_socket(c: Candidate) -> bool:
    return any(link is not None and link.kind == CROSS_SOCKET for link in c.layout.tp_links)


def _reject_cross_socket_tp(found: list[Candidate], request: Request) -> None:
    """Reject TP across CPU sockets when anything on the node runs without it (unless --tp forces TP)."""
    if request.tp is not None:
        return
    safe = [c for c in found if c.feasible and not _crosses_socket(c)]
    if not safe:
        return
    for c in found:
        if c.feasible and _crosses_socket(c):
            same = [a for a in safe if len(a.layout.gpus) == len(c.layout.gpus)] or safe
            c.problems.append(_cross_socket_issue(c, max(same, key=lambda a: a.throughput)))


def _cross_socket_issue(c: Candidate, alt: Candidate) -> Issue:
    link = next(link for link in c.layout.tp_links if link is not None and link.kind == CROSS_SOCKET)
    return Issue("link", f"TP={c.layout.tp} would all-reduce over {link.describe()}, where NCCL hangs or crawls "
                 f"(the seed scenario); {shape_text(alt)} on {len(alt.layout.gpus)} GPU(s) runs without TP across "
                 f"that link ({alt.throughput:.1f} vs {c.throughput:.1f} tok/s predicted in total); force this "
                 f"with --tp {c.layout.tp} and NCCL_P2P_DISABLE=1 if you accept the risk")


# ---------------------------------------------------------------- multi node


def _multi_node_candidates(ev: Evaluator, nodes: list[Node], request: Request) -> list[Candidate]:
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
        for tp in divisors(per_node):
            pp = len(nodes) * per_node // tp
            if (request.tp or tp) == tp and (request.pp or pp) == pp:
                layout = _multi_layout(ev, nodes, backend, tp)
                found += [ev.evaluate(layout)] if layout else []
    return found


def _multi_layout(ev: Evaluator, nodes: list[Node], backend: str, tp: int) -> Layout | None:
    stages: list[tuple[GPU, ...]] = []
    for node in nodes:
        groups = tp_groups(node, node.gpus, tp, len(node.gpus) // tp)
        if groups is None:
            return None
        stages += groups
    return make_layout(ev.cluster, backend, stages, even_layers(ev.model.num_layers, len(stages)))


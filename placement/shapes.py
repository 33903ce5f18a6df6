"""Node-level placements: every backend x GPU count x (TP, PP) factorization on one node.

TP groups are built inside the best-linked GPUs (grouping.py), so PP boundaries fall on the weaker
links. A TP group that crosses CPU sockets is rejected (`link`) whenever anything on the node runs
without doing so, unless the operator forces TP with --tp.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from placement.cluster import GPU, Node
from placement.evaluate import Candidate, Evaluator
from placement.grouping import by_free_memory, divisors, tp_groups
from placement.layout import Layout, even_layers, make_layout
from placement.links import CROSS_SOCKET
from placement.memory import GIB, Issue
from placement.request import LLAMA_CPP, OLLAMA, Request
from placement.result import shape_text


def pool_of(node: Node, request: Request) -> list[GPU]:
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
    return [
        (tp, pp)
        for tp, pp in shapes
        if (request.tp is None or request.tp == tp) and (request.pp is None or request.pp == pp)
    ]


def node_candidates(ev: Evaluator, node: Node, request: Request) -> Iterator[Candidate]:
    pool = pool_of(node, request)
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
                layout = layout_for(ev, node, pool, backend, tp, pp)
                if layout is not None:
                    yield ev.evaluate(layout)


def layout_for(ev: Evaluator, node: Node, pool: list[GPU], backend: str, tp: int, pp: int) -> Layout | None:
    if backend == LLAMA_CPP and ev.request.split_mode != "layer":
        chosen = tuple(sorted(by_free_memory(pool)[:tp], key=lambda g: g.index))
        return make_layout(ev.cluster, backend, [chosen], [ev.model.num_layers])
    if backend in (LLAMA_CPP, OLLAMA):
        chosen = sorted(by_free_memory(pool)[:pp], key=lambda g: g.index)
        return ev.layer_split(backend, chosen)
    key = (node.name, tuple(g.index for g in pool), tuple(g.memory_free_mib for g in pool), tp, pp)
    if key not in ev.layouts:  # vLLM and SGLang share the GPU choice and its links
        groups = tp_groups(node, pool, tp, pp)
        ev.layouts[key] = (
            None
            if groups is None
            else make_layout(ev.cluster, backend, groups, even_layers(ev.model.num_layers, pp))
        )
    cached = ev.layouts[key]
    return None if cached is None else replace(cached, backend=backend)


def _weights_exceed(ev: Evaluator, backend: str, pool: list[GPU], n: int) -> Issue | None:
    """A problem when the weights alone cannot fit in the n GPUs with the most free memory."""
    wb = ev.weights[backend]
    on_gpu = (wb.total - (wb.embed if backend in (LLAMA_CPP, OLLAMA) else 0.0)) / GIB
    best = by_free_memory(pool)[:n]
    free = sum(g.free_gib for g in best)
    if on_gpu <= free:
        return None
    busy = on_gpu <= sum(g.total_gib for g in best)  # it would fit if other processes let go
    message = (
        f"the weights alone ({on_gpu:.1f} GiB as {ev.settings[backend].fmt.name}) exceed the {free:.1f} GiB "
        f"free on the best {n} GPU(s){' (other processes hold the rest)' if busy else ''}; any TP x PP "
        f"over {n} GPU(s) fails"
    )
    return Issue("busy" if busy else "memory", message)


def _quick_reject(
    ev: Evaluator, backend: str, pool: list[GPU], n: int, shape: tuple[int, int], problem: Issue
) -> Candidate:
    chosen = sorted(by_free_memory(pool)[:n], key=lambda g: g.index)
    tp, pp = shape
    stages = [tuple(chosen[i * tp : (i + 1) * tp]) for i in range(pp)]
    layout = make_layout(ev.cluster, backend, stages, even_layers(ev.model.num_layers, pp))
    return Candidate(layout, ev.settings[backend], None, None, [problem], [])


def _crosses_socket(c: Candidate) -> bool:
    return any(link is not None and link.kind == CROSS_SOCKET for link in c.layout.tp_links)


def reject_cross_socket_tp(found: list[Candidate], request: Request) -> None:
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
    return Issue(
        "link",
        f"TP={c.layout.tp} would all-reduce over {link.describe()}, where NCCL hangs or crawls "
        f"(the seed scenario); {shape_text(alt)} on {len(alt.layout.gpus)} GPU(s) runs without TP across "
        f"that link ({alt.throughput:.1f} vs {c.throughput:.1f} tok/s predicted in total); force this "
        f"with --tp {c.layout.tp} and NCCL_P2P_DISABLE=1 if you accept the risk",
    )

"""Choosing GPUs: TP groups inside the best-connected sets, pipeline stages across the weaker links."""

from __future__ import annotations

from placement.cluster import GPU, Node
from placement.links import QUALITY


def by_free_memory(gpus: list[GPU]) -> list[GPU]:
    return sorted(gpus, key=lambda g: (-g.memory_free_mib, g.index))


def _group_at(node: Node, pool: list[GPU], size: int, count: int, level: int) -> list[tuple[GPU, ...]] | None:
    """`count` disjoint groups of `size` GPUs whose every pair has link quality <= level."""
    left = by_free_memory(pool)
    groups = []
    while len(groups) < count:
        group = _grow(node, left, size, level)
        if group is None:
            return None
        groups.append(group)
        left = [g for g in left if g not in group]
    return groups


def _grow(node: Node, candidates: list[GPU], size: int, level: int) -> tuple[GPU, ...] | None:
    quality = node.quality
    for seed in candidates:
        group = [seed]
        for gpu in candidates:
            if gpu is seed or len(group) == size:
                continue
            if all(quality[(gpu.index, member.index)] <= level for member in group):
                group.append(gpu)
        if len(group) == size:
            return tuple(sorted(group, key=lambda g: g.index))
    return None


def tp_groups(node: Node, pool: list[GPU], tp: int, count: int) -> list[tuple[GPU, ...]] | None:
    """Disjoint TP groups with the best worst-link possible, in PCI order (stage order)."""
    if tp * count > len(pool):
        return None
    if tp == 1:
        chosen = by_free_memory(pool)[:count]
        return [(gpu,) for gpu in sorted(chosen, key=lambda g: g.index)]
    for level in sorted(set(QUALITY.values())):
        groups = _group_at(node, pool, tp, count, level)
        if groups is not None:
            return sorted(groups, key=lambda group: group[0].index)
    return None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]

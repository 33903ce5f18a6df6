"""A concrete placement: which GPUs form each pipeline stage (TP group) and how many layers each holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from placement.cluster import GPU, Cluster, cross_node_link
from placement.links import Link, worst


@dataclass(frozen=True)
class Layout:
    backend: str
    stages: tuple[tuple[GPU, ...], ...]  # pipeline stages in order; each is one TP group
    layers: tuple[int, ...]  # decoder layers per stage
    tp_links: tuple[Link | None, ...]  # the worst link inside each TP group
    boundaries: tuple[Link | None, ...]  # the link between stage i and i+1 (None: unknown network)
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def tp(self) -> int:
        return len(self.stages[0])

    @property
    def pp(self) -> int:
        return len(self.stages)

    @cached_property
    def gpus(self) -> list[GPU]:
        return [gpu for stage in self.stages for gpu in stage]

    @cached_property
    def node_names(self) -> list[str]:
        names: list[str] = []
        for gpu in self.gpus:
            if gpu.node not in names:
                names.append(gpu.node)
        return names

    @property
    def multi_node(self) -> bool:
        return len(self.node_names) > 1

    def first_layer(self, stage: int) -> int:
        return sum(self.layers[:stage])


def pair_link(cluster: Cluster, a: GPU, b: GPU) -> Link | None:
    if a.node == b.node:
        return cluster.node(a.node).link(a.index, b.index)
    return cross_node_link(cluster.node(a.node), cluster.node(b.node))


def group_link(cluster: Cluster, group: tuple[GPU, ...]) -> Link | None:
    """Worst link inside a group; None when the group spans nodes with no network description."""
    links = []
    for i, a in enumerate(group):
        for b in group[i + 1 :]:
            link = pair_link(cluster, a, b)
            if link is None:
                return None
            links.append(link)
    return worst(links)


def boundary_link(cluster: Cluster, left: tuple[GPU, ...], right: tuple[GPU, ...]) -> Link | None:
    """Pipeline hand-off link: rank i of one stage sends to rank i of the next; the worst pair gates it."""
    links = [pair_link(cluster, a, b) for a, b in zip(left, right, strict=False)]
    if any(link is None for link in links):
        return None
    return worst([link for link in links if link is not None])


def make_layout(cluster: Cluster, backend: str, stages: list[tuple[GPU, ...]], layers: list[int]) -> Layout:
    tp_links = tuple(group_link(cluster, stage) if len(stage) > 1 else None for stage in stages)
    boundaries = tuple(boundary_link(cluster, stages[i], stages[i + 1]) for i in range(len(stages) - 1))
    return Layout(backend, tuple(stages), tuple(layers), tp_links, boundaries)


def even_layers(total: int, stages: int) -> list[int]:
    """vLLM's default partition (`get_pp_indices`): equal shares; the remainder goes one layer each to the
    second-to-last stage and backwards (never the last stage, which also runs the LM head)."""
    shares = [total // stages] * stages
    for i in range(2, total % stages + 2):
        shares[-i] += 1
    return shares

"""Read-side of the fleet: what the pages show, computed from the models."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Avg, F, OuterRef, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Round
from django.utils import timezone

from dashboard import metric_hours, storage
from dashboard.choices import DeploymentState, LinkClass, NodeStatus
from dashboard.live import TIMED_POINT_KEYS, GpuPoint, gpu_point
from dashboard.models import Deployment, DeploymentMember, Gpu, GpuSample, LogChunk, Node
from dashboard.models.fleet import GpuHour, GpuRollup


@dataclass
class GpuRow:
    gpu: Gpu
    point: GpuPoint | None
    sample: GpuSample | None = None  # the newest sample the point comes from (the API shows all of it)
    holder: Deployment | None = None  # the active deployment running on this GPU


def latest_samples(gpus: list[Gpu]) -> dict[int, GpuSample]:
    # One index lookup per GPU row. (Annotating the sample rows instead ran the lookup once per stored sample:
    # 1.06 s for 800 GPUs with ten minutes of samples, growing with the raw window.)
    newest = GpuSample.objects.filter(gpu=OuterRef("pk")).order_by("-t").values("pk")[:1]
    ids = Gpu.objects.filter(pk__in=[g.pk for g in gpus]).annotate(last=Subquery(newest)).values("last")
    # No order_by: Meta ordering (gpu, t) follows Gpu's and Node's and joins both tables only to sort.
    return {s.gpu_id: s for s in GpuSample.objects.filter(pk__in=ids).order_by()}


def fleet_overview(nodes: QuerySet[Node] | None = None) -> list[tuple[Node, list[GpuRow]]]:
    """Each node (all, or those of `nodes`) with its GPUs and their newest points."""
    nodes = list((Node.objects.all() if nodes is None else nodes).prefetch_related("gpus"))
    gpus = [g for n in nodes for g in n.gpus.all()]
    latest = latest_samples(gpus)
    holders = gpu_holders(nodes)
    return [
        (
            n,
            [
                GpuRow(g, _point(latest.get(g.pk)), latest.get(g.pk), holders.get((n.pk, g.index)))
                for g in n.gpus.all()
            ],
        )
        for n in nodes
    ]


def gpu_holders(nodes: list[Node]) -> dict[tuple[int, int], Deployment]:
    """(node id, GPU index) -> the active deployment running there: the head's GPUs and each member's."""
    active = Deployment.objects.filter(state__in=DeploymentState.ACTIVE)
    holders: dict[tuple[int, int], Deployment] = {}
    for d in active.filter(node__in=nodes).select_related("node"):
        holders.update({(d.node_id, i): d for i in d.launch.get("gpus", [])})
    members = DeploymentMember.objects.filter(deployment__in=active, node__in=nodes)
    for m in members.select_related("deployment__node"):
        holders.update({(m.node_id, i): m.deployment for i in m.gpus})
    return holders


def _point(sample: GpuSample | None) -> GpuPoint | None:
    return gpu_point(sample) if sample else None


# The charts' range buttons: name -> minutes. Each reads the tier that fits it (storage.tier_for).
CHART_RANGES = {"15m": 15, "1h": 60, "6h": 360, "24h": 1440, "7d": 7 * 1440, "90d": 90 * 1440}
GAP_STEPS = 3  # no point for this many steps (sampling intervals or buckets) is a gap, not a line
CHART_POINTS = 360  # at most this many points per GPU from a tier: a chart is a few hundred pixels wide
CHART_METRICS = ("util_gpu", "mem_used_mib", "temp_c", "power_w", "util_mem")  # in GpuPoint's order


def chart_step(tier: type[GpuRollup], minutes: int) -> int:
    """Seconds per chart point: the tier's bucket, or whole buckets enough to stay within CHART_POINTS."""
    buckets = math.ceil(minutes * 60 / tier.SECONDS / CHART_POINTS)
    return tier.SECONDS * max(1, buckets)


def chart_minutes(name: str) -> int:
    """The minutes of a range button's name; a ValueError naming the choices for anything else."""
    if name not in CHART_RANGES:
        raise ValueError(f"range must be one of {', '.join(CHART_RANGES)}, not {name[:20]!r}")
    return CHART_RANGES[name]


def gpu_history(
    node: Node, minutes: int, indices: list[int] | None = None, after: datetime | None = None
) -> dict[str, Any]:
    """{"keys": TIMED_POINT_KEYS, "gpus": {GPU id: [[unix_ms, *point], ...]}, "step_s", "tier"} for the charts, from
    raw samples or the minute or hour averages as the range calls for (storage.tier_for). Where no point came
    for GAP_STEPS steps a row of nulls stands between, so charts break the line there.
    `after`: only the points newer than that (a page that reconnects fills its gap)."""
    since = timezone.now() - timedelta(minutes=minutes)
    gpus = node.gpus.all() if indices is None else node.gpus.filter(index__in=indices)
    tier = storage.tier_for(minutes)
    if tier is None:
        history, step = _raw_history(list(gpus), since, after), node.interval_s or 1.0
    else:
        step = chart_step(tier, minutes)
        history = _rollup_history(tier, list(gpus), since, after, step)
    gap_ms = GAP_STEPS * step * 1000
    return {
        "keys": TIMED_POINT_KEYS,
        "gpus": {gpu: with_gaps(points, gap_ms) for gpu, points in history.items()},
        "step_s": step,
        "tier": "raw" if tier is None else tier.__name__.removeprefix("Gpu").lower(),
    }


def _raw_history(gpus: list[Gpu], since: datetime, after: datetime | None) -> dict[str, list[list]]:
    rows = GpuSample.objects.filter(gpu__in=gpus, t__gte=since).order_by("t")
    if after is not None:
        rows = rows.filter(t__gt=after)
    history: dict[str, list[list]] = {}
    for row in rows.values_list(
        "gpu_id", "t", "util_gpu", "mem_used_mib", "mem_free_mib", "temp_c", "power_w", "util_mem", named=True
    ):
        history.setdefault(str(row.gpu_id), []).append([row.t.timestamp() * 1000, *gpu_point(row)])
    return history


def _rollup_history(
    tier: type[GpuRollup], gpus: list[Gpu], since: datetime, after: datetime | None, step: int
) -> dict[str, list[list]]:
    """The buckets' averages, merged in the database into `step`-second points; a point is drawn at its start."""
    first = int(max(since, after).timestamp()) if after else int(since.timestamp())
    totals = {gpu.pk: float(gpu.memory_total_mib) for gpu in gpus}
    rows = (
        tier.objects.filter(gpu_id__in=totals, start__gte=first)
        .annotate(b=F("start") / step * step)
        .values_list("gpu_id", "b")
        .annotate(**{metric: Round(Avg(f"{metric}_avg"), 1) for metric in CHART_METRICS})
        .order_by("gpu_id", "b")
    )
    history: dict[str, list[list]] = {}
    for gpu_id, start, util, mem, temp, power, util_mem in rows:
        history.setdefault(str(gpu_id), []).append(
            [start * 1000, util, mem, totals[gpu_id], temp, power, util_mem]
        )
    return history


def with_gaps(points: list[list], gap_ms: float) -> list[list]:
    """The points with a row of nulls wherever two are further apart than `gap_ms`."""
    if not points:
        return points
    out = [points[0]]
    nulls = [None] * (len(points[0]) - 1)
    for before, point in zip(points, points[1:], strict=False):
        if point[0] - before[0] > gap_ms:
            out.append([(before[0] + point[0]) / 2, *nulls])
        out.append(point)
    return out


@dataclass(frozen=True)
class NodeFilter:
    """Which nodes a list shows; None: any. `stale`: True for nodes gone silent (stale or offline)."""

    name: str | None = None
    state: str | None = None
    gpu_model: str | None = None
    simulated: bool | None = None
    stale: bool | None = None

    def matching(self) -> QuerySet[Node]:
        # Only what the filters read: the list reads the page's nodes again in full (1,000 whole Node rows, even
        # without their ~14 KB topology JSON, were a quarter of /api/v1/nodes/'s time).
        nodes = Node.objects.only("pk", "name", "last_seen", "interval_s", "connected")
        if self.name:
            nodes = nodes.filter(name__icontains=self.name)
        if self.gpu_model:
            nodes = nodes.filter(gpus__name__icontains=self.gpu_model).distinct()
        if self.simulated is not None:
            nodes = nodes.filter(simulated=self.simulated)
        return nodes

    def keeps(self, node: Node, now: datetime) -> bool:
        status = node.status(now)
        silent = status in (NodeStatus.STALE, NodeStatus.OFFLINE)
        return (self.state is None or status == self.state) and (self.stale is None or silent == self.stale)


def filtered_nodes(which: NodeFilter) -> list[Node]:
    """The nodes `which` keeps, as rows with only the fields that decide it (a caller pages them first, then
    reads the page's nodes whole with fleet_overview); the status is computed from each row, so that part is
    filtered here."""
    now = timezone.now()
    return [node for node in which.matching() if which.keeps(node, now)]


def thinned_history(history: dict[str, Any], step_s: float) -> dict[str, Any]:
    """A gpu_history at a coarser step: per GPU, one point per `step_s` window (the window's start time and the
    mean of each value in it); gap rows stay gaps."""
    step_ms = step_s * 1000
    gap_ms = GAP_STEPS * max(step_s, history.get("step_s") or step_s) * 1000
    thinned: dict[str, list[list]] = {}
    for gpu, points in history["gpus"].items():
        windows: dict[int, list[list]] = {}
        for point in points:
            if any(value is not None for value in point[1:]):
                windows.setdefault(int(point[0] // step_ms), []).append(point)
        means = [_window_mean(start * step_ms, rows) for start, rows in windows.items()]
        thinned[gpu] = with_gaps(means, gap_ms)
    return {**history, "gpus": thinned, "step_s": step_s}


def _window_mean(start_ms: float, rows: list[list]) -> list:
    columns = [[v for v in column if v is not None] for column in list(zip(*rows, strict=True))[1:]]
    return [start_ms, *(round(sum(c) / len(c), 1) if c else None for c in columns)]


def topology_grid(node: Node, selected: set[int] | None = None) -> dict[str, Any] | None:
    """Rows and columns of the node's topology matrix, each cell with its label, class color and P2P;
    `selected` GPU indices (a plan's) are flagged so the page can highlight them."""
    topo = node.topology
    if not topo:
        return None
    names = [d["name"] for d in topo["gpus"]] + [n["name"] for n in topo.get("nics", [])]
    links = {frozenset((x.a, x.b)): x for x in node.links.all()}
    rows = [{"name": a, "cells": [_cell(a, b, links) for b in names]} for a in names]
    affinity = {d["name"]: d for d in topo["gpus"]}
    for row in rows:
        row["cpu_affinity"] = affinity.get(row["name"], {}).get("cpu_affinity") or ""
        row["numa_affinity"] = affinity.get(row["name"], {}).get("numa_affinity") or ""
    nics = {n["name"]: n["device"] for n in topo.get("nics", [])}
    chosen = {f"GPU{i}" for i in selected or ()}
    for row in rows:
        row["selected"] = row["name"] in chosen
        for cell in row["cells"]:
            cell["selected"] = row["name"] in chosen and cell["peer"] in chosen
    return {"columns": names, "rows": rows, "nics": nics, "selected": sorted(chosen)}


def _cell(a: str, b: str, links: dict) -> dict[str, str]:
    if a == b:
        return _colored({"label": "X", "color": LinkClass.color("X"), "p2p": "", "peer": b})
    link = links.get(frozenset((a, b)))
    if link is None:
        return _colored({"label": "?", "color": "#ffffff", "p2p": "", "peer": b})
    p2p = "/".join(x for x in (link.p2p_read, link.p2p_write) if x)
    return _colored({"label": link.link, "color": LinkClass.color(link.link_class), "p2p": p2p, "peer": b})


def _colored(cell: dict[str, str]) -> dict[str, str]:
    return {**cell, "text": readable_text(cell["color"])}


def relative_luminance(color: str) -> float:
    """WCAG 2 relative luminance of a #rrggbb colour."""
    channels = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a: str, b: str) -> float:
    light, dark = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def readable_text(background: str) -> str:
    """Black or white, whichever contrasts more with the cell's background."""
    return max(("#111111", "#ffffff"), key=lambda text: contrast_ratio(text, background))


def link_legend() -> list[tuple[str, str, str]]:
    return [c for c in LinkClass.CHOICES if c[0] not in ("SOC", "X")]


def active_deployments() -> list[Deployment]:
    return list(Deployment.objects.select_related("node").exclude(state__in=(DeploymentState.STOPPED,))[:100])


def log_tail(deployment: Deployment, lines: int = 200) -> list[str]:
    """The newest log lines the agent sent for this deployment's process."""
    chunks = LogChunk.objects.filter(node=deployment.node, source=deployment.pk).order_by("-t", "-seq")[:50]
    tail: list[str] = []
    for chunk in chunks:
        tail[:0] = chunk.lines
        if len(tail) >= lines:
            break
    return tail[-lines:]


def metric_history(deployment: Deployment, minutes: int) -> list[list[float | None]]:
    """[[unix_ms, generation tok/s, running, waiting], ...] for the deployment chart, with gaps as in
    gpu_history; past the raw window, averaged per bucket of the tier that range reads: a minute from the rows,
    an hour from the deployment's hourly averages."""
    since = timezone.now() - timedelta(minutes=minutes)
    rows = deployment.metrics.filter(t__gte=since)
    tier = storage.tier_for(minutes)
    if tier is GpuHour:  # the 7 d and 90 d ranges: hours outlive the rows (METRIC_RETENTION_DAYS)
        step = chart_step(tier, minutes)
        return with_gaps(metric_hours.history(deployment.pk, since, step), GAP_STEPS * step * 1000)
    if tier is None:
        points = [
            [m.t.timestamp() * 1000, m.generation_tokens_per_s, m.requests_running, m.requests_waiting]
            for m in rows.order_by("t")
        ]
        return with_gaps(points, GAP_STEPS * (deployment.node.interval_s or 1.0) * 1000)
    buckets = (
        rows.annotate(b=RawSQL(storage.bucket_sql(chart_step(tier, minutes)), ()))
        .values("b")
        .annotate(
            tok=Avg("generation_tokens_per_s"), run=Avg("requests_running"), wait=Avg("requests_waiting")
        )
        .order_by("b")
    )
    points = [[b["b"] * 1000, b["tok"], b["run"], b["wait"]] for b in buckets]
    return with_gaps(points, GAP_STEPS * chart_step(tier, minutes) * 1000)

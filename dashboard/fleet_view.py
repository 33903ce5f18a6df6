"""The fleet page at fleet size: a summary line, a heatmap of every GPU, and a filtered, sorted, paged list.

At 1,000 nodes x 8 GPUs one card per node and one row per GPU made 2.9 MB of HTML and 228,740 DOM nodes.
So every GPU is one heatmap cell on a canvas (colour by utilization or memory, hover for the values, click
through to its node; static/js/fleet.js), and only one page of node cards (PAGE_SIZE) is drawn in detail. Rows, not model instances: the page reads
8,000 GPUs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from dashboard.choices import AlertStatus, DeploymentState, NodeStatus
from dashboard.fleet import GpuRow, gpu_holders
from dashboard.live import GpuPoint, heat_cell
from dashboard.models import Alert, Deployment, Gpu, GpuSample, Node
from dashboard.models.fleet import node_status

PAGE_SIZE = 50
BUSY_UTIL = 10.0  # % utilization from which a GPU counts as busy
STATES = ("online", "stale", "offline", "new")
LOADS = ("busy", "idle")
SORTS = {"name": "name", "util": "mean utilization, highest first", "memory": "memory used, most first"}


@dataclass
class FleetFilter:
    """What the operator asked the list for (the page's query string), checked."""

    q: str = ""
    state: str = ""
    model: str = ""
    simulated: str = ""  # "", "yes", "no"
    load: str = ""  # "", "busy", "idle"
    deployed: bool = False
    alerting: bool = False
    sort: str = "name"
    page: int = 1

    @classmethod
    def from_query(cls, params: Any) -> FleetFilter:
        """ValueError naming the parameter and its choices for anything not understood."""
        chosen = cls(
            q=params.get("q", "")[:63].strip(),
            model=params.get("model", "")[:200],
            deployed=params.get("deployed") == "on",
            alerting=params.get("alerting") == "on",
        )
        for name, allowed in (
            ("state", STATES),
            ("simulated", ("yes", "no")),
            ("load", LOADS),
            ("sort", SORTS),
        ):
            value = params.get(name, "") or ("name" if name == "sort" else "")
            if value and value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value[:20]!r}")
            setattr(chosen, name, value)
        chosen.page = _page(params.get("page", "1"))
        return chosen


def _page(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"page must be a whole number from 1, not {text[:20]!r}")
    return int(text)


# What the whole fleet's entries read of each node: the filters, the state and the heatmap. Only the cards of the
# page shown get their Node (`NodeEntry.detail`): 1,000 model instances were a sixth of the page's time.
NODE_COLUMNS = ("pk", "name", "interval_s", "last_seen", "connected", "simulated")


@dataclass
class NodeEntry:
    node: Any  # a row of NODE_COLUMNS, by name
    status: str
    rows: list[GpuRow] = field(default_factory=list)
    deployed: bool = False
    alerting: bool = False
    detail: Node | None = None  # the node itself, for the cards of the page shown (with_details)

    @property
    def points(self) -> list[GpuPoint]:
        return [r.point for r in self.rows if r.point is not None]

    @property
    def mean_util(self) -> float:
        points = self.points
        return sum(p.util for p in points) / len(points) if points else -1.0

    @property
    def memory_used(self) -> float:
        return sum(p.mem_used for p in self.points)

    @property
    def busy(self) -> bool:
        return any(p.util >= BUSY_UTIL for p in self.points)


def page_query(params: Any, page: int) -> str:
    """The page's query string with another page number: the filters stay."""
    query = params.copy()
    query["page"] = str(page)
    return query.urlencode()


def fleet_page_context(chosen: FleetFilter, now: datetime | None = None) -> dict[str, Any]:
    entries = fleet_entries(now or timezone.now())
    shown = sorted_entries([e for e in entries if matches(e, chosen)], chosen.sort)
    pages = max(1, -(-len(shown) // PAGE_SIZE))
    page = min(chosen.page, pages)
    return {
        "summary": summary(entries),
        "heatmap": heatmap_data(entries),
        "page_entries": with_details(shown[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]),
        "matching": len(shown),
        "page": page,
        "pages": pages,
        "filter": chosen,
        "models": sorted({r.gpu.name for e in entries for r in e.rows}),
        "states": STATES,
        "sorts": SORTS,
    }


def with_details(entries: list[NodeEntry]) -> list[NodeEntry]:
    """One page's entries with their Node and each GPU row naming the active deployment that holds it (a node
    deleted since the fleet was read is left out)."""
    nodes = Node.objects.defer("topology").in_bulk([e.node.pk for e in entries])
    holders = gpu_holders(list(nodes.values()))
    shown = [e for e in entries if e.node.pk in nodes]
    for entry in shown:
        entry.detail = nodes[entry.node.pk]
        for row in entry.rows:
            row.holder = holders.get((entry.node.pk, row.gpu.index))
    return shown


def fleet_entries(now: datetime) -> list[NodeEntry]:
    nodes = Node.objects.order_by("name").values_list(*NODE_COLUMNS, named=True)
    gpus = Gpu.objects.order_by("node_id", "index")
    latest = latest_points()
    entries = {n.pk: NodeEntry(n, _status(n, now)) for n in nodes}
    for gpu in gpus.values_list("pk", "node_id", "index", "name", "memory_total_mib", named=True):
        entries[gpu.node_id].rows.append(GpuRow(gpu, latest.get(gpu.pk)))
    for node_id in _deployed_nodes():
        if node_id in entries:
            entries[node_id].deployed = True
    for node_id in _alerting_nodes():
        if node_id in entries:
            entries[node_id].alerting = True
    return list(entries.values())


def latest_points() -> dict[int, GpuPoint]:
    """Every GPU's newest sample as a point: one index seek per GPU (the unique (gpu, t) index), read as rows."""
    newest = GpuSample.objects.filter(gpu=OuterRef("pk")).order_by("-t").values("pk")[:1]
    ids = Gpu.objects.annotate(last=Subquery(newest)).values("last")
    columns = ("gpu_id", "util_gpu", "mem_used_mib", "mem_free_mib", "temp_c", "power_w", "util_mem")
    rows = (
        GpuSample.objects.filter(pk__in=ids).order_by().values_list(*columns)
    )  # no Meta ordering: its joins
    # Plain tuples, rounded as live.gpu_point rounds: named rows and a point per row cost 30 of this read's 50 ms.
    return {
        gpu: GpuPoint(
            round(util, 1),
            round(used, 1),
            round(used + free, 1),
            round(temp, 1),
            round(power, 1),
            round(um, 1),
        )
        for gpu, util, used, free, temp, power, um in rows
    }


def _status(node: Any, now: datetime) -> str:
    return node_status(node.last_seen, node.interval_s, node.connected, now)


def _deployed_nodes() -> set[int]:
    return set(Deployment.objects.filter(state__in=DeploymentState.ACTIVE).values_list("node_id", flat=True))


def _alerting_nodes() -> set[int]:
    unresolved = Alert.objects.filter(status__in=AlertStatus.UNRESOLVED)
    rows = unresolved.filter(Q(node__isnull=False) | Q(deployment__isnull=False))
    return {n or d for n, d in rows.values_list("node_id", "deployment__node_id")} - {None}


def matches(e: NodeEntry, f: FleetFilter) -> bool:
    checks = (
        not f.q or f.q.lower() in e.node.name.lower(),
        not f.state or e.status == f.state,
        not f.model or any(r.gpu.name == f.model for r in e.rows),
        not f.simulated or e.node.simulated == (f.simulated == "yes"),
        not f.load or (e.status == NodeStatus.ONLINE and bool(e.points) and e.busy == (f.load == "busy")),
        not f.deployed or e.deployed,
        not f.alerting or e.alerting,
    )
    return all(checks)


def sorted_entries(entries: list[NodeEntry], sort: str) -> list[NodeEntry]:
    if sort == "util":
        return sorted(entries, key=lambda e: (-e.mean_util, e.node.name))
    if sort == "memory":
        return sorted(entries, key=lambda e: (-e.memory_used, e.node.name))
    return entries  # fleet_entries reads them by name


def summary(entries: list[NodeEntry]) -> dict[str, Any]:
    online = [e for e in entries if e.status == NodeStatus.ONLINE]
    states = Counter(e.status for e in entries)
    points = [p for e in online for p in e.points]
    return {
        "node_states": [(s, n) for s, n in ((s, states[s]) for s in STATES) if n],
        "node_count": len(entries),
        "gpus_busy": sum(p.util >= BUSY_UTIL for p in points),
        "gpus_idle": sum(p.util < BUSY_UTIL for p in points),
        "gpus_silent": sum(len(e.rows) for e in entries) - len(points),
        "memory_used_gib": round(sum(p.mem_used for p in points) / 1024),
        "memory_free_gib": round(sum(p.mem_total - p.mem_used for p in points) / 1024),
        "deployments": _deployment_states(),
        "open_alerts": Alert.objects.filter(status__in=AlertStatus.UNRESOLVED).count(),
    }


def _deployment_states() -> list[tuple[str, int]]:
    counts = Counter(
        Deployment.objects.exclude(state=DeploymentState.STOPPED).values_list("state", flat=True)
    )
    return [(DeploymentState.label(state), n) for state, n in sorted(counts.items())]


def heatmap_data(entries: list[NodeEntry]) -> dict[str, Any]:
    """What static/js/fleet.js draws the heatmap canvas from and keeps the summary line live with.

    Per node [id, name, status, interval s, GPU ids, cells (live.heat_cell; -1: no sample), utilization %,
    memory used MiB, memory total MiB]; the deployments not stopped (id -> state) and the open alerts' ids,
    which the page's live messages then change. As one JSON block: 8,000 cells as DOM elements made the
    page's every repaint touch them.
    """
    return {
        "nodes": [_node_heat(e) for e in entries],
        "stale_after_intervals": settings.STALE_AFTER_INTERVALS,
        "busy_util": BUSY_UTIL,
        "deployments": dict(
            Deployment.objects.exclude(state=DeploymentState.STOPPED).values_list("pk", "state")
        ),
        "state_labels": {state: label for state, label, _ in DeploymentState.CHOICES},
        "open_alerts": list(
            Alert.objects.filter(status__in=AlertStatus.UNRESOLVED).values_list("pk", flat=True)
        ),
    }


def _node_heat(e: NodeEntry) -> list[Any]:
    points = [row.point for row in e.rows]
    return [
        e.node.pk,
        e.node.name,
        e.status,
        e.node.interval_s,
        [row.gpu.pk for row in e.rows],
        [-1 if p is None else heat_cell(p) for p in points],
        [None if p is None else round(p.util) for p in points],
        [None if p is None else round(p.mem_used) for p in points],
        [
            round(p.mem_total) if p else row.gpu.memory_total_mib
            for p, row in zip(points, e.rows, strict=True)
        ],
    ]

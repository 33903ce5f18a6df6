"""`/metrics`: the fleet in the Prometheus text format, rendered by prometheus_client from the live state.

Where the values come from: each GPU's newest reading from this process's memory (telemetry.LIVE, fed by the
ingest buffer), the fleet's inventory from a handful of bulk queries (nodes every scrape; GPUs and links only
when some node's inventory changed), deployments and alerts one query each.

Cost at 1,000 nodes x 8 GPUs (bench/metrics.py): about 122,000 series. Each family's text is kept with the
inputs it was made from and made again only when they changed: the topology, the inventory and the counters
that rarely move (ECC, XIDs) cost nothing on most scrapes. The per-GPU readings change every scrape; their
text is made from kept pieces that prometheus_client rendered (dashboard/exposition.py), not by
prometheus_client's ~7 us per sample.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, OuterRef, Q, Subquery
from django.utils import timezone
from prometheus_client.core import Metric

from dashboard.choices import AlertStatus, DeploymentState, NodeStatus
from dashboard.exposition import Family, FamilyText, Labels, Points
from dashboard.models import Alert, Deployment, DeploymentMetric, Gpu, Link, Node
from dashboard.telemetry import Snapshot

MIB = 1024 * 1024
GPU_LABELS = ("node", "gpu", "uuid", "model")
DEPLOYMENT_LABELS = ("deployment", "model", "node", "backend")
# A failed deployment stays on /metrics this long (then only the page shows it): the label set stays bounded.
FAILED_SHOWN = timedelta(hours=1)


@dataclass(frozen=True)
class GpuRow:
    gpu_id: int
    node_id: int
    labels: Labels  # node, gpu, uuid, model: the same tuple object every scrape (cheap comparisons)
    memory_total_bytes: float
    power_limit_w: float | None


@dataclass(frozen=True)
class Inventory:
    """The fleet's GPUs and GPU-to-GPU links, read again only when a node's name or inventory changed."""

    key: tuple
    gpus: tuple[GpuRow, ...]
    links: Points


@dataclass(frozen=True)
class FleetView:
    """Everything one scrape reads from the database, at `now`."""

    nodes: list[Node]
    status: dict[int, str]
    inventory: Inventory
    deployments: list[Deployment]
    alerts: list[dict[str, Any]]


def read_inventory(nodes: list[Node], previous: Inventory | None) -> Inventory:
    key = tuple((n.pk, n.name, n.inventory_digest) for n in nodes)
    if previous is not None and previous.key == key:
        return previous
    names = {n.pk: n.name for n in nodes}
    rows = Gpu.objects.order_by("node__name", "index").values_list(
        "pk", "node_id", "index", "uuid", "name", "memory_total_mib", "power_limit_w"
    )  # all of them, no IN list of every node (SQLite takes at most 32,766 parameters)
    gpus = tuple(
        GpuRow(pk, node_id, (names[node_id], str(index), uuid, model), total * MIB, limit)
        for pk, node_id, index, uuid, model, total, limit in rows
        if node_id in names  # a node added since the nodes were read waits for the next scrape
    )
    return Inventory(key, gpus, _gpu_links(names))


def _gpu_links(names: dict[int, str]) -> Points:
    """GPU-to-GPU pairs only: the NIC pairs of an 8-GPU HGX node would be 180 more series each."""
    rows = Link.objects.filter(a__startswith="GPU", b__startswith="GPU").order_by("node", "a", "b")
    points = []
    for node_id, a, b, link, read, write in rows.values_list(
        "node_id", "a", "b", "link", "p2p_read", "p2p_write"
    ):
        if node_id not in names:
            continue
        p2p = read if read == write or not write else f"{read}/{write}"
        points.append(((names[node_id], a, b, link, p2p), 1.0))
    return tuple(points)


def read_fleet(previous: Inventory | None) -> FleetView:
    now = timezone.now()
    nodes = list(
        Node.objects.only(
            "name", "hostname", "agent_version", "driver_version", "cuda_version", "gpu_source",
            "inventory_digest", "interval_s", "last_seen", "connected",
        ).order_by("name")
    )  # fmt: skip
    return FleetView(
        nodes=nodes,
        status={n.pk: n.status(now) for n in nodes},
        inventory=read_inventory(nodes, previous),
        deployments=shown_deployments(now),
        alerts=list(Alert.objects.values("kind", "severity", "status").annotate(n=Count("pk"))),
    )


def shown_deployments(now: Any) -> list[Deployment]:
    newest = DeploymentMetric.objects.filter(deployment=OuterRef("pk")).order_by("-t")
    rows = (
        Deployment.objects.select_related("node")
        .exclude(state=DeploymentState.STOPPED)
        .exclude(Q(state=DeploymentState.FAILED) & Q(state_since__lt=now - FAILED_SHOWN))
        .annotate(prompt_tokens_per_s=Subquery(newest.values("prompt_tokens_per_s")[:1]))
    )
    return list(rows)


class FleetCollector:
    """A prometheus_client collector over one snapshot of the live state and one read of the database."""

    def __init__(self, live: Snapshot, fleet: FleetView) -> None:
        self.live, self.fleet = live, fleet

    def collect(self) -> Iterator[Metric]:
        for family in self.families():
            yield family.metric()

    def families(self) -> Iterator[Family]:
        yield from gpu_families(self.live, self.fleet)
        yield from node_families(self.live, self.fleet)
        yield from deployment_families(self.fleet.deployments)
        yield from alert_families(self.fleet.alerts)
        yield from server_families(self.live)


# ---- per GPU ---------------------------------------------------------------------------------------------
# (name, help, value of a stored row or None when the GPU did not report it)
READING_GAUGES: tuple[tuple[str, str, Callable[[Any], float | None]], ...] = (
    ("layercake_gpu_utilization_ratio", "Share of time a kernel ran (NVML utilization.gpu / 100).",
     lambda r: r.util_gpu / 100),
    ("layercake_gpu_memory_used_bytes", "Device memory in use.", lambda r: r.mem_used_mib * MIB),
    ("layercake_gpu_temperature_celsius", "GPU core temperature.", lambda r: r.temp_c),
    ("layercake_gpu_power_watts", "Power draw.", lambda r: r.power_w),
    ("layercake_gpu_sm_clock_hertz", "Streaming multiprocessor clock.",
     lambda r: None if r.sm_clock_mhz is None else r.sm_clock_mhz * 1e6),
    ("layercake_gpu_throttle_reasons", "NVML clock event (throttle) reasons bit mask; 0: none, 1: idle, "
     "4: software power cap, 8: hardware slowdown, 32: software thermal, 64: hardware thermal.",
     lambda r: r.throttle_reasons),
)  # fmt: skip
READING_COUNTERS: tuple[tuple[str, str, Callable[[Any], float | None]], ...] = (
    ("layercake_gpu_ecc_corrected_errors", "Corrected ECC errors since the driver loaded (volatile).",
     lambda r: r.ecc_corrected),
    ("layercake_gpu_ecc_uncorrected_errors", "Uncorrected ECC errors since the driver loaded (volatile).",
     lambda r: r.ecc_uncorrected),
)  # fmt: skip


def gpu_families(live: Snapshot, fleet: FleetView) -> Iterator[Family]:
    gpus = fleet.inventory.gpus
    fresh = reporting_here(live, fleet)
    online = [g for g in gpus if g.node_id in fresh and g.gpu_id in live.readings]
    rows = [(g.labels, live.readings[g.gpu_id]) for g in online]
    for name, doc, value in READING_GAUGES:
        yield Family(name, doc, GPU_LABELS, _points(rows, value))
    for name, doc, value in READING_COUNTERS:
        yield Family(name, doc, GPU_LABELS, _points(rows, value), counter=True)
    yield Family(
        "layercake_gpu_power_limit_watts",
        "Power limit (enforced) as the agent last reported it.",
        GPU_LABELS,
        tuple((g.labels, g.power_limit_w) for g in gpus if g.power_limit_w is not None),
    )
    yield Family(
        "layercake_gpu_memory_total_bytes",
        "Device memory.",
        GPU_LABELS,
        tuple((g.labels, g.memory_total_bytes) for g in gpus),
    )
    yield from xid_families(live, gpus)


def reporting_here(live: Snapshot, fleet: FleetView) -> set[int]:
    """Online nodes whose samples this process stored within their stale window. With several web processes an
    agent that moved to another one is online still; its last reading here must not pass for current."""
    return {
        n.pk
        for n in fleet.nodes
        if fleet.status[n.pk] == NodeStatus.ONLINE
        and live.taken - live.stored_at.get(n.pk, 0.0) <= n.stale_after().total_seconds()
    }


def _points(rows: list[tuple[Labels, Any]], value: Callable[[Any], float | None]) -> Points:
    return tuple([(labels, v) for labels, row in rows if (v := value(row)) is not None])


def xid_families(live: Snapshot, gpus: tuple[GpuRow, ...]) -> Iterator[Family]:
    yield Family(
        "layercake_gpu_xid_events",
        "XID errors the GPU reported (NVML critical XID events), counted since this server process started.",
        GPU_LABELS,
        tuple((g.labels, float(live.xid_events.get(g.gpu_id, 0))) for g in gpus),
        counter=True,
    )
    yield Family(
        "layercake_gpu_last_xid",
        "The code of the GPU's most recent XID error since this server process started (e.g. 79: fallen off the bus).",
        GPU_LABELS,
        tuple((g.labels, float(live.last_xid[g.gpu_id])) for g in gpus if g.gpu_id in live.last_xid),
    )


# ---- per node --------------------------------------------------------------------------------------------
def node_families(live: Snapshot, fleet: FleetView) -> Iterator[Family]:
    nodes = fleet.nodes
    yield Family(
        "layercake_node_status",
        "1 for the node's status: new (never connected), online, stale (connected, silent) or offline.",
        ("node", "status"),
        tuple(
            ((n.name, status), float(fleet.status[n.pk] == status))
            for n in nodes
            for status, _, _ in NodeStatus.CHOICES
        ),
    )
    yield Family(
        "layercake_node_last_sample_age_seconds",
        "Seconds since the node's newest GPU sample was taken (or, before this process got one, last stored).",
        ("node",),
        tuple(((n.name,), age) for n in nodes if (age := _sample_age(n, live)) is not None),
    )
    yield Family(
        "layercake_node_info",
        "1 per node, with its agent's versions and GPU source (nvml or sim).",
        ("node", "hostname", "agent_version", "driver_version", "cuda_version", "gpu_source"),
        tuple(
            ((n.name, n.hostname, n.agent_version, n.driver_version, n.cuda_version, n.gpu_source), 1.0)
            for n in nodes
        ),
    )
    yield Family(
        "layercake_gpu_link_info",
        "1 per pair of GPUs on a node: the link as nvidia-smi topo -m labels it (NV#, PIX, PXB, PHB, NODE, SYS) "
        "and the P2P read status (OK, NS, CNS...; read/write when they differ).",
        ("node", "a", "b", "link", "p2p"),
        fleet.inventory.links,
    )


def _sample_age(node: Node, live: Snapshot) -> float | None:
    sampled = live.sampled_at.get(node.pk) or (node.last_seen.timestamp() if node.last_seen else None)
    return None if sampled is None else max(0.0, round(live.taken - sampled, 3))


# ---- per deployment --------------------------------------------------------------------------------------
def deployment_families(deployments: list[Deployment]) -> Iterator[Family]:
    shown = [(_deployment_labels(d), d) for d in deployments]
    yield Family(
        "layercake_deployment_state",
        "1 for the deployment's state (planned, launching, loading, ready, serving, stopping, failed).",
        (*DEPLOYMENT_LABELS, "state"),
        tuple(
            ((*labels, s), float(d.state == s)) for labels, d in shown for s, _, _ in DeploymentState.CHOICES
        ),
    )
    for name, doc, value, counter in DEPLOYMENT_VALUES:
        points = tuple((labels, v) for labels, d in shown if (v := value(d)) is not None)
        yield Family(name, doc, DEPLOYMENT_LABELS, points, counter=counter)


def _deployment_labels(d: Deployment) -> Labels:
    return (d.pk, d.name[:200], d.node.name, str(d.plan.get("backend", "")))


def _counter(name: str) -> Callable[[Deployment], float | None]:
    return lambda d: (d.last_counters or {}).get(name)


def _predicted(d: Deployment) -> float | None:
    plan = d.chosen_plan
    return plan.decode_tok_s_total or plan.decode_tok_s


DEPLOYMENT_VALUES: tuple[tuple[str, str, Callable[[Deployment], float | None], bool], ...] = (
    ("layercake_deployment_generation_tokens_per_second",
     "Tokens generated per second, measured between the inference server's last two scrapes.",
     lambda d: d.tokens_per_s, False),
    ("layercake_deployment_prompt_tokens_per_second",
     "Prompt tokens processed per second, measured between the inference server's last two scrapes.",
     lambda d: d.prompt_tokens_per_s, False),
    ("layercake_deployment_predicted_generation_tokens_per_second",
     "Tokens per second the planner predicted for this deployment's plan at its planned concurrency.",
     _predicted, False),
    ("layercake_deployment_requests_running", "Requests the inference server is running.",
     _counter("requests_running"), False),
    ("layercake_deployment_requests_waiting", "Requests waiting in the inference server's queue.",
     _counter("requests_waiting"), False),
    ("layercake_deployment_generation_tokens", "Tokens generated, as the inference server counts them.",
     _counter("generation_tokens_total"), True),
    ("layercake_deployment_prompt_tokens", "Prompt tokens processed, as the inference server counts them.",
     _counter("prompt_tokens_total"), True),
)  # fmt: skip


# ---- alerts and the server itself ------------------------------------------------------------------------
def alert_families(rows: list[dict[str, Any]]) -> Iterator[Family]:
    """Every (kind, severity) ever seen, 0 when none is open, so that a quiet fleet still has the series."""
    counts: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        entry = counts.setdefault((row["kind"], row["severity"]), [0.0, 0.0])
        if row["status"] in AlertStatus.UNRESOLVED:
            entry[0] += row["n"]
        if row["status"] == AlertStatus.ACKNOWLEDGED:
            entry[1] += row["n"]
    labels = ("kind", "severity")
    ordered = sorted(counts.items())
    yield Family("layercake_alerts_open", "Alerts not resolved yet (open or acknowledged).", labels,
                 tuple((key, n[0]) for key, n in ordered))  # fmt: skip
    yield Family("layercake_alerts_acknowledged", "Unresolved alerts an operator acknowledged.", labels,
                 tuple((key, n[1]) for key, n in ordered))  # fmt: skip


def server_families(live: Snapshot) -> Iterator[Family]:
    def one(name: str, doc: str, value: float | None, counter: bool = False) -> Family:
        return Family(name, doc, (), () if value is None else (((), float(value)),), counter=counter)

    yield one("layercake_agents_connected", "Node agents connected to this server process (hello done).",
              live.agents_connected)  # fmt: skip
    yield Family("layercake_websocket_clients", "Open websockets on this server process, by kind.", ("kind",),
                 tuple(((kind,), float(n)) for kind, n in sorted(live.sockets.items())))  # fmt: skip
    yield one(
        "layercake_ingest_samples_stored",
        "GPU samples this server process stored.",
        live.samples_stored,
        True,
    )
    yield one("layercake_ingest_lag_seconds", "Age of the oldest sample in the last batch stored, when stored.",
              live.ingest_lag_s)  # fmt: skip
    yield one(
        "layercake_ingest_buffer_rows",
        "Rows waiting in the ingest buffer for the next write.",
        live.buffer_rows,
    )
    yield one(
        "layercake_metrics_scrapes", "Scrapes of /metrics this server process answered.", live.scrapes, True
    )
    yield one("layercake_metrics_render_cpu_seconds", "CPU time spent reading and rendering /metrics.",
              live.render_cpu_s, True)  # fmt: skip


# ---- rendering -------------------------------------------------------------------------------------------
@dataclass
class Renderer:
    """Renders a collector's families as prometheus_client would, keeping each family's text with its points."""

    texts: dict[str, tuple[Points, bytes]] = field(default_factory=dict)
    pieces: FamilyText = field(default_factory=FamilyText)
    inventory: Inventory | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def render(self, live: Snapshot) -> tuple[bytes, float]:
        """The exposition text and the CPU seconds this thread spent on it (the database reads included)."""
        with self.lock:
            began = time.thread_time()
            try:
                fleet = read_fleet(self.inventory)
            finally:
                # A pool thread, not a request's: its connection would outlive the scrape (and keep PostgreSQL
                # from dropping a test database); one connection per scrape costs a few ms every 15 s.
                connections.close_all()
            self.inventory = fleet.inventory
            text = b"".join(self.family_text(f) for f in FleetCollector(live, fleet).families())
            return text, time.thread_time() - began

    def family_text(self, family: Family) -> bytes:
        kept = self.texts.get(family.name)
        if kept is not None and kept[0] == family.points:
            return kept[1]
        text = self.pieces.render(family)
        self.texts[family.name] = (family.points, text)
        return text


RENDERER = Renderer()  # this process's

"""/api/v1/nodes/: the fleet, one node with its topology, a node's GPU history. Reads only."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router
from ninja.pagination import paginate

from dashboard import fleet
from dashboard.api.errors import ApiError
from dashboard.api.schemas import ERRORS, HistoryOut, NodeDetailOut, NodeOut
from dashboard.choices import NodeStatus
from dashboard.live import gpu_point
from dashboard.models import Gpu, GpuSample, Node

router = Router(tags=["nodes"])
STATES = [value for value, _, _ in NodeStatus.CHOICES]


@router.get("/", response={200: list[NodeOut], **ERRORS}, summary="List nodes")
@paginate
def list_nodes(
    request: HttpRequest,
    name: str | None = None,
    state: str | None = Query(None, description="new, online, stale or offline"),
    gpu_model: str | None = Query(None, description="part of a GPU's name, e.g. A30"),
    simulated: bool | None = None,
    stale: bool | None = Query(None, description="true: nodes gone silent (stale or offline)"),
) -> Sequence[dict[str, Any]]:
    if state is not None and state not in STATES:
        raise ApiError(422, "invalid", f"state must be one of {', '.join(STATES)}", "state")
    return NodePage(fleet.filtered_nodes(fleet.NodeFilter(name, state, gpu_model, simulated, stale)))


class NodePage(Sequence):
    """The filtered nodes; GPUs and newest samples are read only for the page the paginator slices out."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: Any) -> Any:
        chosen = self.nodes[index] if isinstance(index, slice) else [self.nodes[index]]
        now = datetime.now(tz=UTC)
        rows = fleet.fleet_overview(
            Node.objects.filter(pk__in=[node.pk for node in chosen]).defer("topology")
        )
        page = [node_json(node, gpus, now) for node, gpus in rows]
        return page if isinstance(index, slice) else page[0]


@router.get(
    "/{name}/", response={200: NodeDetailOut, **ERRORS}, summary="One node: GPUs, topology, newest samples"
)
def node_detail(request: HttpRequest, name: str) -> dict[str, Any]:
    node = get_object_or_404(Node, name=name)
    [(node, rows)] = fleet.fleet_overview(Node.objects.filter(pk=node.pk))
    topo = node.topology or {}
    return {
        **node_json(node, rows, datetime.now(tz=UTC)),
        "network_gbps": node.network_gbps,
        "rdma": node.rdma,
        "address": node.address,
        "engines": node.engines,
        "topology": {
            "links": [
                {**_fields(x, "a", "b", "link", "p2p_read", "p2p_write"), "link_class": x.link_class}
                for x in node.links.all()
            ],
            "grid": fleet.topology_grid(node),
            "gpus": topo.get("gpus", []),
            "nics": topo.get("nics", []),
        },
    }


@router.get(
    "/{name}/history/", response={200: HistoryOut, **ERRORS}, summary="GPU history (the charts' data)"
)
def node_history(
    request: HttpRequest,
    name: str,
    minutes: int = Query(15, ge=1, le=10080, description="how far back from now"),
    step: float | None = Query(
        None, ge=1, le=3600, description="seconds per point (mean); empty: every sample"
    ),
    gpus: str | None = Query(
        None, description="GPU indices, e.g. 0,1; empty: all", pattern=r"^\d{1,3}(,\d{1,3})*$"
    ),
    after: float | None = Query(None, ge=0, description="only samples after this time, unix ms"),
) -> dict[str, Any]:
    node = get_object_or_404(Node, name=name)
    indices = [int(i) for i in gpus.split(",")] if gpus else None
    since = datetime.fromtimestamp(after / 1000, tz=UTC) if after is not None else None
    history = fleet.gpu_history(node, minutes=minutes, indices=indices, after=since)
    return fleet.thinned_history(history, step) if step else history


def node_json(node: Node, rows: list[fleet.GpuRow], now: datetime) -> dict[str, Any]:
    status = node.status(now)
    return {
        **_fields(node, "name", "hostname", "simulated", "gpu_source", "agent_version", "driver_version"),
        **_fields(node, "cuda_version", "interval_s", "connected", "last_seen"),
        "state": status,
        "state_label": NodeStatus.label(status),
        "gpus": [gpu_json(row.gpu, row.sample) for row in rows],
    }


def gpu_json(gpu: Gpu, sample: GpuSample | None) -> dict[str, Any]:
    fields = _fields(gpu, "id", "index", "uuid", "name", "pci_bus_id", "memory_total_mib", "numa_node")
    return {**fields, "power_limit_w": gpu.power_limit_w, "latest": sample_json(sample) if sample else None}


def sample_json(sample: GpuSample) -> dict[str, Any]:
    extra = ("power_limit_w", "sm_clock_mhz", "throttle_reasons", "ecc_corrected", "ecc_uncorrected", "xids")
    return {"t": sample.t, **gpu_point(sample)._asdict(), **_fields(sample, *extra)}


def _fields(row: Any, *names: str) -> dict[str, Any]:
    return {name: getattr(row, name) for name in names}

"""What the REST API takes and returns (pydantic, like agents/protocol.py); the OpenAPI schema is generated
from these. Plans and check results keep the planner's own JSON (documented in docs/placement.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema

from dashboard import calibration, fleet


class ErrorBody(Schema):
    code: str = Field(description="stable machine-readable code, e.g. unauthorized, forbidden, invalid")
    message: str = Field(description="what is wrong, for people")
    field: str | None = Field(None, description="the request field at fault, if one is")


class ErrorOut(Schema):
    error: ErrorBody


ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


# ---- nodes ---------------------------------------------------------------------------------------------------
class LatestSample(Schema):
    t: datetime
    util: float = Field(description="% of time a kernel ran")
    mem_used: float = Field(description="MiB")
    mem_total: float = Field(description="MiB")
    temp: float = Field(description="degrees C")
    power: float = Field(description="W")
    util_mem: float = Field(description="% of time memory was read or written")
    power_limit_w: float | None
    sm_clock_mhz: float | None
    throttle_reasons: int
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    xids: list[Any]


class GpuOut(Schema):
    id: int = Field(description="the key of this GPU in a history's `gpus`")
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_mib: int
    numa_node: int | None
    power_limit_w: float | None
    latest: LatestSample | None = Field(description="the newest sample the agent sent, if any")


class NodeOut(Schema):
    name: str
    hostname: str
    state: str = Field(description="new, online, stale or offline")
    state_label: str
    simulated: bool
    gpu_source: str
    agent_version: str
    driver_version: str
    cuda_version: str
    interval_s: float
    connected: bool
    last_seen: datetime | None
    gpus: list[GpuOut]


class LinkOut(Schema):
    a: str
    b: str
    link: str = Field(description="as nvidia-smi topo prints it: NV#, PIX, PXB, PHB, NODE, SYS")
    link_class: str
    p2p_read: str
    p2p_write: str


class TopologyOut(Schema):
    links: list[LinkOut]
    grid: dict[str, Any] | None = Field(description="the node page's matrix: columns, rows with cells, NICs")
    gpus: list[dict[str, Any]] = Field(description="GPUs with CPU and NUMA affinity, as the agent read them")
    nics: list[dict[str, Any]]


class EngineOut(Schema):
    backend: str = Field(description="vllm, sglang, llama.cpp or ollama")
    version: str | None = Field(description="as the engine reports it; null: installed, version unknown")
    detail: str = Field(description="why the version is unknown")


class NodeDetailOut(NodeOut):
    network_gbps: float
    rdma: bool
    address: str
    engines: list[EngineOut] = Field(
        description="the inference engines the node's agent found on its PATH (the planner's default vLLM "
        "release for this node)"
    )
    topology: TopologyOut


class HistoryOut(Schema):
    keys: list[str] = Field(description="the names of each point's values: t (unix ms), then the GPU point")
    step_s: float | None = Field(description="seconds between points (the window each one averages)")
    tier: str = Field(description="where the points come from: raw samples, or minute or hour averages")
    gpus: dict[str, list[list[float | None]]] = Field(
        description="GPU id -> points, oldest first; a row of nulls after the time marks a gap in the data"
    )


# ---- plans and check -----------------------------------------------------------------------------------------
class PlanIn(Schema):
    """The deploy form's fields; they are checked by the form itself, so the messages are the form's."""

    model: str = Field("", description="catalog name, HF id, or a path under the server's MODEL_DIRS")
    config: dict[str, Any] | None = Field(None, description="a config.json's contents instead of a model")
    max_model_len: int = 8192
    concurrency: int = 1
    node: str = Field("", description="plan on this node only (its name); empty: any")
    backend: str = Field("", description="vllm, sglang, llama.cpp or ollama; empty: any")
    gpus: str = Field("", description="GPU indices, e.g. 0,1; empty: any")
    tp: int | None = Field(None, description="tensor-parallel size; 1: none; null: any")
    backend_version: str = Field(
        "",
        description="the vLLM release that will serve, e.g. 0.7.3; empty: the one the nodes' agents reported "
        "(the pinned node's, or the one all candidate nodes agree on), else unknown",
    )


class PlanAccepted(Schema):
    id: int
    status: str
    url: str = Field(description="where to GET the outcome")


class RankedPlan(Schema):
    number: int = Field(description="what to deploy: POST /deployments/ with plan_request and number")
    where: str
    needs_override: bool = Field(description="it needs GPUs in use: deploying it takes override_busy=true")
    plan: dict[str, Any] = Field(description="the planner's plan JSON (docs/placement.md)")


class PlanRequestOut(Schema):
    id: int
    status: str = Field(description="queued, running, done or failed")
    error: str
    created: datetime
    status_since: datetime
    model: str
    max_model_len: int
    concurrency: int
    node: str | None
    backend: str
    gpus: str
    tp: int | None
    backend_version: str
    plans: list[RankedPlan] = Field(description="best first")
    rejected: list[dict[str, Any]] = Field(description="configurations and nodes left out, with the reasons")


class CheckIn(Schema):
    command: list[str] | str = Field(description="the launch command, as argv or one shell line")
    node: str | None = Field(None, description="the node it runs on (needed when the fleet has several)")
    visible: str | None = Field(None, description="CUDA_VISIBLE_DEVICES for the command, e.g. 0,1")
    concurrency: int | None = None


class IssueOut(Schema):
    code: str
    message: str


class CheckOut(Schema):
    """`python -m placement check --json`, field for field (suggestion_same_backend: null where it omits it)."""

    feasible: bool
    backend: str
    tp: int
    pp: int
    node: str
    gpus: list[int]
    problems: list[IssueOut]
    risks: list[IssueOut]
    memory_gib_per_gpu: list[float] | None
    breakdown: list[dict[str, Any]] | None
    kv_cache_tokens: int | None
    weights_gib_per_gpu: float | None
    decode_tok_s: float | None
    decode_tok_s_total: float | None
    prefill_tok_s: float | None
    why: str | None
    notes: list[str]
    assumes: list[str] = Field(
        [],
        description="what the estimate assumes: context, efficiencies, the vLLM release and where it came from",
    )
    suggestion: dict[str, Any] | None = Field(description="the planner's best plan on that node")
    suggestion_same_backend: dict[str, Any] | None = Field(
        None, description="the best plan with the command's backend, when that is not the suggestion"
    )


# ---- models --------------------------------------------------------------------------------------------------
class ModelOut(Schema):
    """One choice of the deploy form's model field; the facts are the agent's (null for catalog models)."""

    name: str
    value: str = Field(
        description="what to send as a plan's `model`: the path on the node, or the catalog name"
    )
    source: str = Field(description="reported (found by a node's agent in its --model-dir) or catalog")
    node: str | None
    path: str | None
    format: str | None = Field(description="hf (a config.json folder) or gguf")
    architecture: str | None
    quantization: str | None
    size_bytes: int | None
    size_label: str | None = Field(description="the parameter count the checkpoint states, e.g. 8B")
    plannable: bool = Field(description="the planner can plan it (config reported, or a catalog name)")


# ---- deployments ---------------------------------------------------------------------------------------------
class DeploymentIn(Schema):
    plan_request: int = Field(description="the id of a finished plan request")
    number: int = Field(0, description="which of its ranked plans (0: the best)")
    override_busy: bool = Field(False, description="deploy onto GPUs already in use (the form's tick box)")


class MemberOut(Schema):
    node: str
    rank: int
    gpus: list[int]
    state: str


class EventOut(Schema):
    t: datetime
    state: str
    detail: str


class DeploymentOut(Schema):
    id: str
    name: str
    node: str
    state: str
    state_label: str
    state_since: datetime
    desired: str
    detail: str
    created: datetime
    created_by: str | None
    plan_request: int | None
    backend: str = Field(description="what the agent runs (the plan's, or its stand-in on a simulated node)")
    gpus: list[int]
    port: int | None
    pid: int | None
    exit_code: int | None
    progress: float | None
    override_busy: bool
    tokens_per_s: float | None = Field(description="measured generation tokens/s")
    requests_running: float | None
    requests_waiting: float | None
    members: list[MemberOut]

    @staticmethod
    def resolve_node(obj: Any) -> str:
        return obj.node.name

    @staticmethod
    def resolve_state_label(obj: Any) -> str:
        return obj.state_label()

    @staticmethod
    def resolve_created_by(obj: Any) -> str | None:
        return obj.created_by.get_username() if obj.created_by else None

    @staticmethod
    def resolve_plan_request(obj: Any) -> int | None:
        return obj.plan_request_id

    @staticmethod
    def resolve_backend(obj: Any) -> str:
        return (obj.launch or {}).get("backend", "")

    @staticmethod
    def resolve_gpus(obj: Any) -> list[int]:
        return (obj.launch or {}).get("gpus", [])

    @staticmethod
    def resolve_requests_running(obj: Any) -> float | None:
        return obj.summary()["running"]

    @staticmethod
    def resolve_requests_waiting(obj: Any) -> float | None:
        return obj.summary()["waiting"]

    @staticmethod
    def resolve_members(obj: Any) -> list[dict[str, Any]]:
        return [
            {"node": m.node.name, "rank": m.rank, "gpus": m.gpus, "state": m.shown_state()}
            for m in obj.members.all()
        ]


class ComparisonOut(Schema):
    quantity: str = Field(description="weights per GPU (GiB), KV cache (tokens) or decode per stream (tok/s)")
    predicted: float | None
    measured: float | None
    ratio: float | None = Field(description="measured / predicted")


class CalibrationKeyOut(Schema):
    gpu: str
    backend: str
    link: str = Field(description="the TP link class")


class StartupOut(Schema):
    kv_cache_gib: float | None
    max_concurrency: float | None


class PredictedVsMeasuredOut(Schema):
    """The deployment page's "Predicted against measured" table (dashboard.calibration.predicted_vs_measured)."""

    calibration_key: CalibrationKeyOut
    fleet_factor: float = Field(description="the fleet calibration factor the plan was made with")
    streams: float | None = Field(description="median requests running while decoding")
    total_tok_s: float | None = Field(description="median decode tokens/s over all streams")
    decode_intervals: int = Field(description="metric intervals the decode figures use")
    startup: StartupOut
    rows: list[ComparisonOut] = Field(description="one per quantity, as the page's table")


class LoadTestOut(Schema):
    """One "Measure" run through the agent (a DeploymentLoadTest)."""

    request: str
    created: datetime
    created_by: str | None
    status: str = Field(description="running, done or failed")
    error: str
    streams: int = Field(description="concurrent requests")
    max_tokens: int
    backend: str
    predicted_tok_s: float | None = Field(description="the plan's predicted decode tokens/s per stream")
    completed: int | None
    tokens: int | None
    seconds: float | None
    tok_s_per_stream: float | None
    tok_s_total: float | None
    ttft_s: float | None = Field(description="mean time to first token")
    itl_s: float | None = Field(description="mean inter-token latency")
    ratio: float | None = Field(description="measured per stream / predicted")

    @staticmethod
    def resolve_created_by(obj: Any) -> str | None:
        return obj.created_by.get_username() if obj.created_by else None

    @staticmethod
    def resolve_ratio(obj: Any) -> float | None:
        return obj.ratio_to_prediction()


class DeploymentDetailOut(DeploymentOut):
    events: list[EventOut] = Field(description="the lifecycle, oldest first")
    plan: dict[str, Any]
    launch: dict[str, Any] = Field(description="the command the agent got (agents/protocol.py Launch)")
    log_tail: list[str] = Field(description="the newest lines of the server's log, as the page shows them")
    predicted_vs_measured: PredictedVsMeasuredOut = Field(description="measured when asked, as on the page")
    load_tests: list[LoadTestOut] = Field(
        description="the Measure runs, newest first (as many as the page shows)"
    )

    @staticmethod
    def resolve_predicted_vs_measured(obj: Any) -> dict[str, Any]:
        return calibration.predicted_vs_measured(obj)

    @staticmethod
    def resolve_load_tests(obj: Any) -> list[Any]:
        return list(obj.recent_load_tests())

    @staticmethod
    def resolve_events(obj: Any) -> list[Any]:
        return list(obj.events.all())

    @staticmethod
    def resolve_log_tail(obj: Any) -> list[str]:
        return fleet.log_tail(obj)


# ---- alerts --------------------------------------------------------------------------------------------------
class AlertOut(Schema):
    id: int
    key: str
    kind: str
    severity: str
    status: str
    title: str
    deployment: str | None
    node: str | None
    opened: datetime
    refreshed: datetime
    acknowledged: datetime | None
    acknowledged_by: str | None
    resolved: datetime | None

    @staticmethod
    def resolve_deployment(obj: Any) -> str | None:
        return obj.deployment_id

    @staticmethod
    def resolve_node(obj: Any) -> str | None:
        return obj.node.name if obj.node else None

    @staticmethod
    def resolve_acknowledged_by(obj: Any) -> str | None:
        return obj.acknowledged_by.get_username() if obj.acknowledged_by else None


class AlertEventOut(Schema):
    t: datetime
    old_status: str
    new_status: str
    reason: str


class AlertDetailOut(AlertOut):
    cause: str
    remedy: str
    evidence: dict[str, Any]
    actions: dict[str, Any]
    events: list[AlertEventOut]

    @staticmethod
    def resolve_events(obj: Any) -> list[Any]:
        return list(obj.events.all())


# ---- agent tokens --------------------------------------------------------------------------------------------
class AgentTokenIn(Schema):
    node: str = Field(description="the node's name; the node is created if it is new")
    revoke_others: bool = Field(False, description="revoke the node's earlier tokens")


class AgentTokenOut(Schema):
    id: int
    node: str
    prefix: str
    created: datetime
    last_used: datetime | None
    revoked: datetime | None

    @staticmethod
    def resolve_node(obj: Any) -> str:
        return obj.node.name


class AgentTokenIssued(AgentTokenOut):
    token: str = Field(description="the token itself: shown this once, stored only hashed")

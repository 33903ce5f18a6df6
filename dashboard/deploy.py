"""Deploying: the live fleet as planner input, planning a request, and turning a chosen plan into the
launch command an agent receives. Plain functions over the models; views and tasks call these."""

from __future__ import annotations

import json
import logging
import traceback
from datetime import datetime, timedelta
from typing import Any, get_args

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agents import protocol
from dashboard import calibration
from dashboard.choices import DeploymentState, DesiredState, PlanStatus
from dashboard.fleet import latest_samples
from dashboard.jobs import Job, LaunchMembers, StopProcesses
from dashboard.models import Deployment, DeploymentEvent, DeploymentMember, Node, PlanRequest
from dashboard.models.deployments import member_failure_text
from dashboard.node_engines import default_backend_version
from dashboard.node_models import holder_names, reported_spec
from placement import PlacementError, Request, check_command, load_cluster, plan
from placement.cluster import Cluster, NodeRejection
from placement.command_parse import parse_command
from placement.plan_model import Plan, PlanSettings
from placement.spec import load_model_within, spec_from_hf_config

PLAN_LIMIT, REJECTED_LIMIT = 8, 40
log = logging.getLogger(__name__)


class DeployError(ValueError):
    """A deploy the operator asked for cannot be done as asked; the message says why."""


def fleet_cluster(nodes: list[Node] | None = None) -> dict[str, Any]:
    """The planner's cluster JSON built from what the agents reported (same shape as a cluster file): the
    nodes that reported GPUs and a topology (`not_plannable` says why the others are left out)."""
    if nodes is None:
        nodes = list(Node.objects.filter(topology__isnull=False).prefetch_related("gpus"))
    gpus = [g for n in nodes for g in n.gpus.all()]
    latest = latest_samples(gpus)
    return {"nodes": [_node_entry(n, latest) for n in nodes if n.gpus.all()]}


def not_plannable() -> list[NodeRejection]:
    """The nodes `fleet_cluster` leaves out, each with why: the planner lists them among the rejected."""
    left_out = (
        Node.objects.filter(Q(topology__isnull=True) | Q(gpus__isnull=True)).distinct().order_by("name")
    )
    return [NodeRejection(node.name, _why_not_plannable(node)) for node in left_out.prefetch_related("gpus")]


def _why_not_plannable(node: Node) -> str:
    if not node.gpus.all():
        return f"node {node.name}: no GPUs reported yet (its agent has not connected, or found no GPU)"
    return (
        f"node {node.name}: no topology reported yet (its agent sends `nvidia-smi topo -m` with its hello; "
        "the agent's log says why it could not read it)"
    )


def live_cluster(nodes: list[Node] | None = None) -> Cluster:
    """The live fleet as the planner takes it (or only `nodes`, those that hold a reported model), with the
    nodes it cannot plan among the rejected."""
    fleet, left_out = fleet_cluster(nodes), not_plannable() if nodes is None else []
    if not fleet["nodes"]:
        why = "; ".join(r.reason for r in left_out)
        raise PlacementError(
            f"no node can be planned yet: {why}"
            if why
            else "no node has reported its GPUs yet: start an agent first"
        )
    cluster = load_cluster(fleet)
    cluster.rejected_nodes += left_out
    return cluster


def _node_entry(node: Node, latest: dict) -> dict[str, Any]:
    topo = node.topology or {}
    entry: dict[str, Any] = {
        "name": node.name,
        "network_gbps": node.network_gbps,
        "rdma": node.rdma,
        "gpus": [_gpu_entry(g, latest.get(g.pk)) for g in node.gpus.all()],
    }
    if topo.get("links"):
        entry["topology"] = {
            "kind": "matrix",
            "gpus": topo.get("gpus", []),
            "nics": topo.get("nics", []),
            "links": topo["links"],
        }
    if isinstance(topo.get("p2p"), dict) and topo["p2p"].get("r"):
        entry["p2p"] = {"kind": "p2p", "mode": "r", "gpus": topo.get("gpus", []), "links": topo["p2p"]["r"]}
    return entry


def _gpu_entry(gpu, sample) -> dict[str, Any]:
    entry = {"index": gpu.index, "name": gpu.name, "memory_total_mib": gpu.memory_total_mib}
    if sample is not None:
        entry["memory_free_mib"] = sample.mem_free_mib
    return entry


def run_plan_request(request_id: int) -> PlanRequest:
    """Plan one request against the live fleet; the outcome (plans or a clear error) lands on the row, whatever
    goes wrong: an unexpected error is logged by type and stack only (its message may quote a file) and the row
    says planning failed."""
    row = PlanRequest.objects.get(pk=request_id)
    if row.status in (PlanStatus.DONE, PlanStatus.FAILED):
        return row  # a retried or re-delivered task: the outcome is already there
    start_planning(row)
    try:
        finish_planning(row, PlanStatus.DONE, "", compute_plans(row))
    except PlacementError as exc:
        finish_planning(row, PlanStatus.FAILED, str(exc))
    except Exception as exc:  # a plan request always ends, whatever broke
        log.error(
            "plan request %s: planning raised %s (message withheld: it may quote a file)\n%s",
            row.pk,
            type(exc).__name__,
            "".join(traceback.format_tb(exc.__traceback__)).rstrip(),
        )
        finish_planning(
            row,
            PlanStatus.FAILED,
            f"planning failed on the server ({type(exc).__name__}); the Celery worker's log says where",
        )
    return row


def start_planning(row: PlanRequest) -> None:
    row.status, row.status_since, row.attempts = PlanStatus.RUNNING, timezone.now(), row.attempts + 1
    row.save(update_fields=["status", "status_since", "attempts"])


def finish_planning(row: PlanRequest, status: str, error: str, result: dict[str, Any] | None = None) -> None:
    row.status, row.error, row.result, row.status_since = status, error, result, timezone.now()
    row.save(update_fields=["status", "error", "result", "status_since"])


def compute_plans(row: PlanRequest) -> dict[str, Any]:
    nodes = model_nodes(row)
    cluster = live_cluster(nodes)
    version, version_source = row.backend_version or None, ""
    if version is None:
        version, version_source = default_backend_version(row.node, nodes)
    gpus = tuple(int(g) for g in row.gpus.split(",") if g.strip()) or None
    request = Request(
        max_model_len=row.max_model_len,
        concurrency=row.concurrency,
        gpus=gpus,
        tp=row.tp,
        node=row.node.name if row.node else None,
        backend=row.backend or None,
        decode_factors=calibration.fleet_factors(),
        backend_version=version,
        backend_version_source=version_source,
    )
    return plan(request_model(row), cluster, request).to_json(limit=PLAN_LIMIT, rejected_limit=REJECTED_LIMIT)


def model_nodes(row: PlanRequest) -> list[Node] | None:
    """The nodes a plan request may use (`holding_nodes` of its model and pinned node)."""
    return holding_nodes(row.model_ref, row.node.name if row.node else None)


def holding_nodes(ref: str, node: str | None) -> list[Node] | None:
    """The nodes a plan or a check of model `ref` may use: every node (None) for a catalog name or HF id (the
    backend fetches it), only the nodes whose agents reported the files for a path an agent reported (the
    launch names that path, and no other node has it). Raises PlacementError when `node` is named and has no
    copy, or none of the holders has reported its GPUs."""
    holders = holder_names(ref)
    if not holders:
        return None
    where = ", ".join(holders)
    if node is not None and node not in holders:
        raise PlacementError(
            f"{ref} is only on {where} (as their agents reported); node {node} has no copy: "
            f"plan it on {where}, or pick a catalog name that any node can download"
        )
    nodes = Node.objects.filter(name__in=holders, topology__isnull=False).prefetch_related("gpus")
    found = [n for n in nodes if n.gpus.all()]
    if not found:
        raise PlacementError(f"{ref} is only on {where}, and none of them has reported its GPUs yet")
    return found


def request_model(row: PlanRequest):
    """The model to plan: the uploaded config.json, a file under settings.MODEL_DIRS, or a catalog entry. Any
    other path is never read (an operator's browser must not read the server's files)."""
    if not row.config:
        return reported_spec(row.model_ref) or load_model_within(row.model_ref, settings.MODEL_DIRS)
    try:
        return spec_from_hf_config(row.config, row.model_ref, row.model_ref, "uploaded config.json")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, PlacementError):
            raise
        raise PlacementError(f"uploaded config.json: missing or odd field {exc}") from None


def desired_launches(node: Node) -> list[str]:
    """Launch frames for every deployment that should be running on `node` (sent when its agent says hello):
    those it heads (each after its canary settings), and the multi-node ones it is a further member of (once
    their launch was sent)."""
    return desired_launches_of([node.pk])[node.pk]


def desired_launches_of(node_ids: list[int]) -> dict[int, list[str]]:
    """`desired_launches` of several nodes in two queries (a batch of hellos)."""
    launches: dict[int, list[str]] = {pk: [] for pk in node_ids}
    active = Deployment.objects.filter(node_id__in=node_ids, state__in=DeploymentState.ACTIVE)
    for d in active:
        launches[d.node_id] += [protocol.dump(d.canary_command()), protocol.dump(d.launch_command())]
    members = DeploymentMember.objects.filter(
        node_id__in=node_ids, deployment__state__in=DeploymentState.ACTIVE, launch__isnull=False
    )
    for m in members:
        launches[m.node_id].append(json.dumps(m.launch))
    return launches


def stand_in_on_simulated_node(plan_backend: str, model_ref: str, multi_node: bool) -> str:
    """The backend that runs in place of the plan's on a simulated node, which has no GPU to run vLLM, SGLang
    or llama.cpp's GPU build on: a single-node GGUF plan runs on the real llama.cpp engine on the CPU
    (llama-cpp-python), anything else (and anything across nodes) on the simulated backend at the rate the
    planner predicted. The launch records it, and the deployment page says "the plan's X runs as Y"."""
    if plan_backend in ("llama.cpp", "ollama") and model_ref.lower().endswith(".gguf") and not multi_node:
        return "llama-cpp-python"
    return "simulated"


MULTI_NODE_BACKENDS = ("vllm", "sglang", "simulated")


FORWARDED_ENV = set(protocol.EnvName.__args__)


def launch_for(deployment_id: str, plan: Plan, node: Node, model_ref: str) -> protocol.Launch:
    """The agent command for a chosen plan (on a multi-node plan: the head's, `node`).
    Raises DeployError for what cannot be sent."""
    multi = plan.multi_node
    backend = stand_in_on_simulated_node(plan.backend, model_ref, multi) if node.simulated else plan.backend
    if multi and backend not in MULTI_NODE_BACKENDS:
        raise DeployError(
            f"{plan.backend} across nodes (llama.cpp RPC) cannot be launched by layercake: start "
            f"rpc-server on the other nodes and run the plan's commands by hand"
        )
    env = {k: str(v) for k, v in (plan.env or {}).items() if k in FORWARDED_ENV}
    model = model_ref if backend != "simulated" else _served_name(model_ref)
    gpus = plan.gpus_on(node.name) if multi else plan.head_gpus
    options = launch_options(plan, backend, node if multi else None)
    try:
        return protocol.Launch(
            type="launch",
            v=1,
            deployment=deployment_id,
            backend=backend,
            model=model,
            gpus=gpus,
            options=options,
            env=env,
        )
    except ValueError as exc:
        raise DeployError(f"this plan cannot be sent to the agent: {exc}") from None


def _served_name(model_ref: str) -> str:
    return model_ref.rstrip("/").rsplit("/", 1)[-1] or model_ref


def launch_options(plan: Plan, backend: str, head: Node | None = None) -> protocol.LaunchOptions:
    s = plan.settings or PlanSettings()
    options: dict[str, Any] = {"tp": plan.tp, "pp": plan.pp, "max_model_len": s.max_model_len}
    if head is not None:
        options.update(nnodes=len(plan.nodes), node_rank=0, master_addr=head_address(head))
    if backend in ("vllm", "sglang"):
        options["gpu_memory_utilization"] = s.memory_fraction
        if s.kv_cache_dtype not in (None, "auto"):
            options["kv_cache_dtype"] = s.kv_cache_dtype
    if backend in ("llama.cpp", "llama-cpp-python"):
        options["tensor_split"] = list(s.tensor_split) if s.tensor_split is not None else None
        options["parallel"] = s.n_parallel
        options["max_model_len"] = s.n_ctx or s.max_model_len
    if backend == "simulated":
        options["sim_tokens_per_s"] = max(1.0, float(plan.decode_tok_s or 20.0))
        options["served_model_name"] = None
    try:
        return protocol.LaunchOptions(**{k: v for k, v in options.items() if v is not None})
    except ValueError as exc:
        raise DeployError(f"this plan cannot be sent to the agent: {exc}") from None


def head_address(node: Node) -> str:
    if not node.reach_address:
        raise DeployError(
            f"node {node.name} has no address the other nodes could reach it at: set one in the admin"
        )
    return node.reach_address


@transaction.atomic
def create_deployment(row: PlanRequest, number: int, user, override_busy: bool = False) -> Deployment:
    """The operator clicked "Deploy" on plan `number` of `row`."""
    plan_data = row.plan(number)
    if plan_data is None:
        raise DeployError(f"plan {number + 1} does not exist for this request")
    if plan_data.needs_override and not override_busy:
        raise DeployError(
            "this plan needs GPUs that are already in use; tick 'deploy onto busy GPUs' to override"
        )
    head, *others = plan_nodes(plan_data)
    deployment = Deployment(
        name=_served_name(row.model_ref),
        created_by=user,
        plan_request=row,
        plan=plan_data.to_json(),
        node=head,
        override_busy=override_busy,
        launch={},
    )
    deployment.launch = launch_for(deployment.pk, plan_data, head, row.model_ref).model_dump()
    deployment.save()
    for rank, node in enumerate(others, start=1):
        DeploymentMember.objects.create(
            deployment=deployment, node=node, rank=rank, gpus=plan_data.gpus_on(node.name)
        )
    return deployment


def delete_deployment(deployment: Deployment) -> None:
    """Forget a deployment that runs nowhere (stopped or failed); one that may still run must be stopped first,
    or its server would run on with nothing watching it."""
    if deployment.state not in (DeploymentState.STOPPED, DeploymentState.FAILED):
        raise DeployError(
            f"deployment {deployment.pk} is {DeploymentState.label(deployment.state).lower()}: stop it first, "
            f"then delete it"
        )
    deployment.delete()


def check_launch(
    command: list[str] | str, node: str | None, visible: str | None, concurrency: int | None
) -> dict[str, Any]:
    """`python -m placement check` against the live fleet: an operator's own launch command judged as the CLI
    judges it (feasible, problems, risks, a suggestion). Model paths are read only under MODEL_DIRS, except a
    path an agent reported: its config comes from that agent, and only the nodes holding it are judged and
    suggested (as for a plan). vLLM's release is the one the node's agent reported.
    Raises PlacementError for a command or selection that cannot be judged."""
    ref = parse_command(command).model_ref
    nodes = holding_nodes(ref, node)
    pinned = Node.objects.filter(name=node).first() if node else None
    if pinned is None and nodes is not None and len(nodes) == 1:
        pinned = nodes[0]
    result = check_command(
        command,
        live_cluster(nodes),
        visible=visible,
        env={},
        node=node,
        concurrency=concurrency,
        model_dirs=settings.MODEL_DIRS,
        spec=reported_spec(ref),
        backend_version=default_backend_version(pinned, nodes),
    )
    return result.to_json()


def plan_nodes(plan_data: Plan) -> list[Node]:
    """The plan's nodes from the fleet, head first; all simulated or none (one backend runs on all of them)."""
    names = plan_data.nodes or [None]
    found = {n.name: n for n in Node.objects.filter(name__in=names)}
    missing = [name for name in names if name not in found]
    if missing:
        raise DeployError(f"node {missing[0]!r} is not in the fleet any more")
    nodes = [found[name] for name in names]
    if len({n.simulated for n in nodes}) > 1:
        raise DeployError("this plan mixes simulated and real nodes; they cannot run one server together")
    return nodes


# ---- multi-node: the head first, then the others join it ---------------------------------------------------
def follow_head(deployment: Deployment, status: protocol.DeploymentStatus) -> list[Job]:
    """A multi-node head that is up reports its rendezvous port; then the other nodes are launched to join it.
    A head that failed takes the others down: they would wait for it in NCCL until a timeout.
    Returns the tasks to queue once the caller's transaction commits."""
    if (
        status.state == DeploymentState.FAILED
        and deployment.desired == DesiredState.RUNNING
        and deployment.members.exists()
    ):
        return [StopProcesses(deployment.pk)]
    if (
        status.dist_port is None
        or status.state not in DeploymentState.ACTIVE
        or deployment.desired != DesiredState.RUNNING
    ):
        return []
    if status.dist_port == deployment.dist_port:
        return []
    deployment.dist_port = status.dist_port
    deployment.save(update_fields=["dist_port"])
    return [LaunchMembers(deployment.pk)]


def apply_member_status(
    deployment: Deployment, member: DeploymentMember, status: protocol.DeploymentStatus
) -> list[Job]:
    """A further node reported. Its failure fails the deployment, and the rest are stopped: a model split
    across nodes cannot run with a node missing (the survivors would wait in NCCL until a timeout).
    Returns the tasks to queue once the caller's transaction commits."""
    if deployment.desired == DesiredState.STOPPED and status.state not in (
        DeploymentState.STOPPED,
        DeploymentState.FAILED,
    ):
        return []
    asked_to_stop = member.state == DeploymentState.STOPPING
    member.apply_status(status)
    if status.state != DeploymentState.FAILED or deployment.desired != DesiredState.RUNNING or asked_to_stop:
        return []
    said = f"node {member.node.name} (rank {member.rank}) failed: {status.detail or 'no detail'}"
    if deployment.state == DeploymentState.FAILED:  # the head noticed first (a lost peer breaks its NCCL)
        deployment.move_to(DeploymentState.FAILED, member_failure_text(said, deployment.detail))
        return []
    deployment.move_to(DeploymentState.FAILED, said)
    return [StopProcesses(deployment.pk)]


def member_commands(deployment: Deployment) -> list[tuple[DeploymentMember, list[str]]]:
    """What to send each further node now that the head's port is known; a member already running this
    launch gets nothing, one running an older launch (the head restarted) is stopped first."""
    commands = []
    for member in deployment.members.select_related("node"):
        launch = deployment.member_launch(member).model_dump()
        if member.launch == launch and member.is_active:
            continue
        frames = [stop_frame(deployment)] if member.is_active else []
        member.move_to(DeploymentState.LAUNCHING, f"launch sent to {member.node.name}", launch=launch)
        commands.append((member, [*frames, json.dumps(launch)]))
    return commands


def stop_frame(deployment: Deployment) -> str:
    return protocol.dump(protocol.Stop(type="stop", v=1, deployment=deployment.pk))


# ---- launches lost between the database and the agent --------------------------------------------------
RESENT = "launch re-sent: no word from the agent for"


def lost_launches(now: datetime, grace_s: float) -> tuple[list[Deployment], list[DeploymentMember]]:
    """Heads and further nodes marked launching over `grace_s` ago that their agent has not reported on since
    (it reports the server's pid once it starts one): a worker killed between marking and sending lost the
    launch, and the broker gives the task back only after its visibility timeout."""
    waiting = {
        "state": DeploymentState.LAUNCHING,
        "pid__isnull": True,
        "state_since__lt": now - timedelta(seconds=grace_s),
    }
    heads = Deployment.objects.filter(desired=DesiredState.RUNNING, **waiting).select_related("node")
    members = DeploymentMember.objects.filter(
        deployment__desired=DesiredState.RUNNING, launch__isnull=False, **waiting
    )
    return list(heads), list(members.select_related("node", "deployment"))


def note_resent(target: Deployment | DeploymentMember, now: datetime) -> None:
    """Say on the row that its launch goes out again. The state does not change, so move_to records no event:
    the deployment's history gets one per launching spell here, not one per beat."""
    detail = f"{RESENT} {(now - target.state_since).total_seconds():.0f} s"
    target.move_to(DeploymentState.LAUNCHING, detail)
    who = "" if isinstance(target, Deployment) else f"{target.node.name} (rank {target.rank}): "
    deployment = target.deployment if who else target
    if not deployment.events.filter(t__gte=target.state_since, detail__startswith=who + RESENT).exists():
        DeploymentEvent.objects.create(
            deployment=deployment, state=DeploymentState.LAUNCHING, detail=who + detail
        )


# ---- plan requests whose worker died -----------------------------------------------------------------------
PLAN_ATTEMPTS = 2


def sweep_stale_plans(now: datetime, stale_after_s: float) -> tuple[list[PlanRequest], list[PlanRequest]]:
    """(queue again, failed): plan requests planning for over `stale_after_s` lost their worker (planning takes
    about a second; the broker gives the task back only after its visibility timeout). The first time one is
    queued again; then it fails with the reason. A re-queued request that no worker started is failed too."""
    cutoff = now - timedelta(seconds=stale_after_s)
    stale = PlanRequest.objects.filter(status_since__lt=cutoff).filter(
        Q(status=PlanStatus.RUNNING) | Q(status=PlanStatus.QUEUED, attempts__gt=0)
    )
    again, failed = [], []
    for row in stale:
        if move_stale_plan(row, now, stale_after_s):
            (again if row.status == PlanStatus.QUEUED else failed).append(row)
    return again, failed


def move_stale_plan(row: PlanRequest, now: datetime, stale_after_s: float) -> bool:
    """Queue `row` again or fail it, only if it is still as the sweep saw it: a task that finished meanwhile wins."""
    retry = row.status == PlanStatus.RUNNING and row.attempts < PLAN_ATTEMPTS
    status, error = (
        (PlanStatus.QUEUED, "") if retry else (PlanStatus.FAILED, stale_plan_text(row, stale_after_s))
    )
    moved = PlanRequest.objects.filter(pk=row.pk, status=row.status, status_since=row.status_since).update(
        status=status, error=error, status_since=now
    )
    if moved:
        row.status, row.error, row.status_since = status, error, now
    return bool(moved)


def stale_plan_text(row: PlanRequest, stale_after_s: float) -> str:
    if row.status == PlanStatus.QUEUED:
        return (
            f"planning was queued again after its worker stopped, but no worker started it within "
            f"{stale_after_s:.0f} s: check that the Celery worker is running, then plan again"
        )
    return (
        f"planning stopped without finishing {row.attempts} times (no result after {stale_after_s:.0f} s "
        f"each time): the Celery worker was killed or restarted while planning; see its log, then plan again"
    )


class NotPlanned(DeployError):
    """Only a deployment that was never launched can be discarded."""


def discard_planned(deployment_id: str, why: str) -> Deployment:
    """Take a never-launched deployment off the fleet: stopped (kept, with the reason), never launched later.
    The row lock keeps a launch task that runs at the same moment from sending it."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        if deployment.state != DeploymentState.PLANNED:
            raise NotPlanned(
                f"{deployment.name} is {deployment.state_label().lower()}, not planned: stop it instead"
            )
        deployment.move_to(DeploymentState.STOPPED, why, desired=DesiredState.STOPPED)
    return deployment


def expire_planned(now: datetime, after_s: float) -> list[Deployment]:
    """Discard every deployment still planned (never launched) `after_s` seconds after it was created."""
    cutoff = now - timedelta(seconds=after_s)
    stale = Deployment.objects.filter(state=DeploymentState.PLANNED, created__lt=cutoff)
    why = f"expired: planned {after_s:.0f} s ago and never launched"
    expired = []
    for pk in stale.values_list("pk", flat=True):
        try:
            expired.append(discard_planned(pk, why))
        except NotPlanned:  # launched meanwhile
            continue
    return expired


# The simulated backend's faults, as the launch options name them (one list: agents.protocol's).
SIM_FAULTS = tuple(
    f for f in get_args(protocol.LaunchOptions.model_fields["sim_fault"].annotation) if f != "none"
)
FAULT_LABELS = {
    "nccl-init-hang": "NCCL-init hang (the restarted server hangs setting up NCCL)",
    "stall": "stall with requests in flight (the engine stops stepping; send a prompt with Try it)",
    "crash": "crash (the server dies a few seconds after it is ready)",
    "idle-hang": "hang while idle (/health answers, completions never do: the canary probe finds it)",
}


def fault_choices(deployment: Deployment) -> list[tuple[str, str, str]]:
    """(fault, label, why it cannot be injected here or "") for the deployment page's Inject fault form."""
    return [(f, FAULT_LABELS.get(f, f), _fault_refusal(deployment, f)) for f in SIM_FAULTS]


def _fault_refusal(deployment: Deployment, fault: str) -> str:
    options = deployment.launch.get("options", {})
    if fault == "nccl-init-hang" and options.get("tp", 1) < 2 and options.get("nnodes", 1) < 2:
        return f"needs tensor parallelism (TP 2 or more); this deployment runs TP {options.get('tp', 1)}"
    return ""


def check_fault(deployment: Deployment, fault: str) -> None:
    """Raise DeployError saying why `fault` cannot be injected into this deployment (`none`: cleared)."""
    if deployment.launch.get("backend") != "simulated":
        raise DeployError(
            f"faults are only injected into simulated deployments; {deployment.name} runs "
            f"{deployment.launch.get('backend')}"
        )
    if fault != "none" and fault not in SIM_FAULTS:
        raise DeployError(f"unknown fault {fault[:40]!r}: one of {', '.join(SIM_FAULTS)}")
    refusal = _fault_refusal(deployment, fault) if fault != "none" else ""
    if refusal:
        raise DeployError(f"cannot inject {fault}: {refusal}")
    if deployment.members.exists():
        raise DeployError("faults are injected into single-node deployments only")


def with_sim_fault(deployment_id: str, fault: str, by: str) -> Deployment:
    """Set the fault the simulated server runs with (`none` clears it); the restart that follows applies it."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        check_fault(deployment, fault)
        options = {**deployment.launch.get("options", {}), "sim_fault": fault}
        deployment.launch = {**deployment.launch, "options": options}
        deployment.save(update_fields=["launch"])
        if fault != "none":
            DeploymentEvent.objects.create(
                deployment=deployment, state=deployment.state, detail=f"fault {fault} injected by {by}"
            )
    return deployment


def restart_frame(deployment: Deployment, new_launch: bool) -> str:
    launch = deployment.launch_command() if new_launch else None
    return protocol.dump(protocol.Restart(type="restart", v=1, deployment=deployment.pk, launch=launch))


def injected_fault(deployment: Deployment) -> str:
    return deployment.launch.get("options", {}).get("sim_fault", "none")

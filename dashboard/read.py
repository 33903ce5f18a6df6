"""The read side of the pages: what they show, computed from stored rows without changing them."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from dashboard import fleet
from dashboard.choices import DeploymentState
from dashboard.models import Deployment, DeploymentMember, Node, PlanRequest
from placement.plan_model import Plan


def plans_context(row: PlanRequest) -> dict:
    """Each plan (typed; the page draws its memory bars with `Plan.memory_bars`) with where it runs and the
    topology grid of each of its nodes."""
    plans = row.plans()
    nodes = {n.name: n for n in Node.objects.filter(name__in={name for p in plans for name in p.nodes})}
    items = [
        {
            "number": i,
            "plan": p,
            "where": p.where_text(),
            "grids": _grids(p, nodes),
            "needs_override": p.needs_override,
        }
        for i, p in enumerate(plans)
    ]
    return {"row": row, "plans": items, "rejected": (row.result or {}).get("rejected", [])}


def _grids(plan: Plan, nodes: dict[str, Node]) -> list[dict]:
    grids = [
        (name, fleet.topology_grid(nodes[name], set(gpus)))
        for name, gpus in plan.placements()
        if name in nodes
    ]
    return [{"node": name, **grid} for name, grid in grids if grid is not None]


@dataclass
class MemorySplit:
    """A GPU's memory as three shares (MiB): the holding deployment's processes, other processes, free."""

    total: float
    mine: float
    other: float

    @property
    def free(self) -> float:
        return max(0.0, self.total - self.mine - self.other)

    def percent(self, share: float) -> float:
        return round(100 * share / self.total, 1) if self.total else 0.0

    def bars(self) -> list[tuple[str, str, float, float]]:
        """(css class, label, MiB, percent of total) of each share, in bar order."""
        shares = (("mine", "this deployment", self.mine), ("other", "other", self.other))
        shares += (("free", "free", self.free),)
        return [(css, label, mib, self.percent(mib)) for css, label, mib in shares]


def memory_split(total: float, used: float, processes: list[dict], server_pid: int | None) -> MemorySplit:
    """The deployment's share is the memory NVML lists for its server's pid; the rest of `used` is other."""
    mine = sum(p.get("used_mib", 0) for p in processes if server_pid and p.get("pid") == server_pid)
    mine = min(mine, used)
    return MemorySplit(total=total, mine=mine, other=max(0.0, used - mine))


def node_gpus(node: Node) -> list[dict]:
    """Each GPU of the node with the deployment holding it, its processes and its memory split."""
    gpus = list(node.gpus.all())
    latest = fleet.latest_samples(gpus)
    holders = fleet.gpu_holders([node])
    pids = _server_pids(node)
    rows = []
    for gpu in gpus:
        sample, holder = latest.get(gpu.pk), holders.get((node.pk, gpu.index))
        pid = pids.get(holder.pk) if holder else None
        processes = sample.processes if sample else []
        used = sample.mem_used_mib if sample else 0.0
        split = memory_split(float(gpu.memory_total_mib), used, processes, pid)
        shown = [{**p, "mine": bool(pid) and p.get("pid") == pid} for p in processes]
        rows.append({"gpu": gpu, "holder": holder, "processes": shown, "split": split})
    return rows


def _server_pids(node: Node) -> dict[str, int]:
    """Deployment id -> the pid of its server process on this node (the head's, or this node's rank)."""
    pids = dict(Deployment.objects.filter(node=node, pid__isnull=False).values_list("pk", "pid"))
    members = DeploymentMember.objects.filter(node=node, pid__isnull=False)
    pids.update(dict(members.values_list("deployment_id", "pid")))
    return pids


def node_deployments(node: Node) -> list[Deployment]:
    """The deployments with a process (or a plan) on this node, head or further rank, newest first."""
    rows = Deployment.objects.filter(Q(node=node) | Q(members__node=node)).exclude(
        state=DeploymentState.STOPPED
    )
    return list(rows.select_related("node").distinct()[:50])


@dataclass
class ServerAccess:
    """How to reach a deployment's OpenAI-compatible API. Agents start servers on the node's loopback, so
    the URL works on the node itself; from elsewhere, through an SSH tunnel to the node's address."""

    address: str
    port: int
    model: str

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def tunnel(self) -> str:
        return f"ssh -N -L {self.port}:127.0.0.1:{self.port} {self.address}"


def server_access(deployment: Deployment) -> ServerAccess | None:
    """None until the agent has reported the port."""
    if not deployment.port:
        return None
    options = deployment.launch.get("options", {})
    model = options.get("served_model_name") or deployment.launch.get("model", "")
    return ServerAccess(address=deployment.node.reach_address, port=deployment.port, model=model)

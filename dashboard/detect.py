"""Hang detection: what is wrong with a deployment or a node right now, judged from what agents sent.

Each rule looks at one deployment or node and returns a `Problem` (or None): a dedupe key, what it is,
the likely cause, the remedy tied to the plan, and the evidence. `evaluate_fleet` (a Celery beat task)
opens an alert for every problem found and resolves the ones no longer found. Rules are plain functions
over the models so that tests can drive them without Celery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from math import ceil
from typing import Any

from django.conf import settings
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.utils import timezone

from agents import xids
from agents.logscan import PHASES, LogScanner, Verdict
from dashboard.choices import DeploymentState, DesiredState
from dashboard.fleet import log_tail
from dashboard.models import Alert, Deployment, Gpu, GpuSample, LogChunk, Node

LOG_LINES_SCANNED = 400
XID_QUIET_MINUTES = 30
SCRAPED = (DeploymentState.READY, DeploymentState.SERVING)  # the agent scrapes metrics only in these states
UNLOADING = PHASES["stopping"]
INCIDENT = "nodes-lost"  # the kind of the alert that groups many lost nodes
HUNG_IDLE = "hung-idle"  # a canary probe failed: the server hangs though nobody uses it
EVIDENCE_REFRESH_S = 15.0
EVIDENCE_PER_RUN = 4
# Log tails as last read and scanned, per deployment, with the newest chunk they include (this process only).
LOG_TAILS: dict[str, tuple[int | None, list[str], LogScanner]] = {}
# A scrape's time is the agent's clock, `now` the server's: hosts drift apart by seconds, so a scrape counts as
# recent for this long beyond the node's stale window (the node's own silence is judged on the server's clock).
CLOCK_SLACK_S = 30.0


@dataclass
class Problem:
    key: str
    kind: str
    title: str
    cause: str
    remedy: str
    evidence: dict[str, Any] = field(default_factory=dict)
    actions: dict[str, Any] = field(default_factory=dict)
    severity: str = "critical"
    deployment: Deployment | None = None
    node: Node | None = None
    settled: bool = False  # confirmed only: the open alert keeps its content (see `settled_keys`)


# ---- deployments -----------------------------------------------------------------------------------------
def deployment_problems(d: Deployment, now: datetime, settled: frozenset[str] = frozenset()) -> list[Problem]:
    """What is wrong with `d` now. For keys in `settled` (their alert is open and its evidence recent) a
    rule only confirms the problem and skips gathering evidence again."""
    verdict, lines = scan_logs(d, now)
    found = [
        p
        for p in (
            stall(d, now, verdict, lines, settled),
            startup_overdue(d, now, verdict, lines),
            crashed(d, verdict, lines),
            unload_stuck(d, now, lines),
            hung_idle(d, now, lines),
        )
        if p
    ]
    if not found and verdict.verdict != "healthy" and d.state != DeploymentState.FAILED:
        found.append(log_signature(d, verdict, lines, settled))
    for problem in found:
        problem.deployment, problem.node = d, d.node
        problem.settled = problem.key in settled
    return found


def confirmed(key: str, kind: str) -> Problem:
    """The problem of an open alert whose evidence is recent: seen again, not described again."""
    return Problem(key, kind, "", "", "", settled=True)


def scan_logs(d: Deployment, now: datetime) -> tuple[Verdict, list[str]]:
    last, lines, scanner = log_state(d)
    silent_for = (now - last).total_seconds() if last else 0.0
    return scanner.verdict(silent_for=max(0.0, silent_for)), lines


def log_state(d: Deployment) -> tuple[datetime | None, list[str], LogScanner]:
    """The time of the newest log chunk of `d`, its log tail and a scanner fed with it. From `fleet_queryset`,
    the newest chunk comes annotated and the tail is read and scanned again only when a newer chunk came."""
    if not hasattr(d, "last_log_pk"):
        last = d.node.log_chunks.filter(source=d.pk).order_by("-t").values_list("t", flat=True).first()
        return last, *scanned(log_tail(d, LOG_LINES_SCANNED))
    cached = LOG_TAILS.get(d.pk)
    if cached is None or cached[0] != d.last_log_pk:
        cached = LOG_TAILS[d.pk] = (
            d.last_log_pk,
            *scanned(log_tail(d, LOG_LINES_SCANNED) if d.last_log_pk else []),
        )
    return d.last_log_t, cached[1], cached[2]


def scanned(lines: list[str]) -> tuple[list[str], LogScanner]:
    scanner = LogScanner()
    scanner.feed(lines)
    return lines, scanner


def fleet_queryset() -> QuerySet[Deployment]:
    """Every deployment not stopped, with what the rules read of its node and its newest log chunk."""
    newest = LogChunk.objects.filter(node=OuterRef("node"), source=OuterRef("pk")).order_by("-t", "-seq")
    return (
        Deployment.objects.select_related("node", "plan_request")
        .defer("launch", "node__topology", "plan_request__result", "plan_request__config")
        .prefetch_related("node__links")
        .exclude(state=DeploymentState.STOPPED)
        .annotate(last_log_t=Subquery(newest.values("t")[:1]), last_log_pk=Subquery(newest.values("pk")[:1]))
    )


def stall(
    d: Deployment, now: datetime, verdict: Verdict, lines: list[str], settled: frozenset[str] = frozenset()
) -> Problem | None:
    """Requests in flight and no token, step or prompt progress for the stall window."""
    counters = d.last_counters or {}
    owed = (counters.get("requests_running") or 0) + (counters.get("requests_waiting") or 0)
    if d.state not in (DeploymentState.READY, DeploymentState.SERVING) or not owed or d.progress_at is None:
        return None
    stuck = (now - d.progress_at).total_seconds()
    if stuck < d.stall_window_s:
        return None
    if f"stall:{d.pk}" in settled:
        return confirmed(f"stall:{d.pk}", "stall")
    gpus = gpu_pattern(d, now)
    cause, remedy, actions = stall_cause(d, gpus)
    title = f"{d.name} on {d.node.name}: no tokens for {stuck:.0f} s with {owed:.0f} request(s) in flight"
    evidence = {
        "series": counter_series(d, now),
        "log": lines[-40:],
        "gpus": gpus,
        "log_findings": findings_json(verdict),
        "stuck_s": round(stuck),
    }
    return Problem(f"stall:{d.pk}", "stall", title, cause, remedy, evidence, actions)


def stall_cause(d: Deployment, gpus: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    weak = weak_tp_links(d)
    spin = (
        " GPU utilization is pinned near 100 % with no tokens: NCCL is spinning in a collective."
        if gpus.get("pattern") == "spin"
        else ""
    )
    idle = (
        " GPU memory is full and utilization is 0: the GPUs wait on each other or on the host."
        if gpus.get("pattern") == "idle-full"
        else ""
    )
    if weak:
        cause = (
            f"Tensor parallelism (TP={d.chosen_plan.tp}) all-reduces twice per layer per token across "
            f"{weak}, which has no P2P; NCCL collectives over such links can hang.{spin}{idle}"
        )
        remedy = (
            "Restart with NCCL_P2P_DISABLE=1 (and --disable-custom-all-reduce), check ACS/IOMMU on the "
            "host, or re-plan without tensor parallelism across these links (pipeline / layer split)."
        )
        return cause, remedy, {"replan": replan_fields(d, tp=1)}
    cause = f"The server holds requests but stopped producing tokens.{spin}{idle}"
    remedy = "Look at the log tail below; restart the deployment. If it recurs, capture py-spy dumps of the workers."
    return cause, remedy, {}


def weak_tp_links(d: Deployment) -> str:
    """The TP group's GPU pairs that go through the host without P2P, as text ('' when none)."""
    plan = d.chosen_plan
    if plan.tp < 2:
        return ""
    gpus = {f"GPU{i}" for i in plan.head_gpus}
    weak = [
        f"{x.a}-{x.b} ({x.link}, P2P {x.p2p_read or 'unknown'})"
        for x in d.node.links.all()
        if {x.a, x.b} <= gpus and x.link in ("PHB", "NODE", "SYS", "SOC") and x.p2p_read != "OK"
    ]
    return ", ".join(weak[:6])


def replan_fields(d: Deployment, **constraints: Any) -> dict[str, Any]:
    request = d.plan_request
    return {
        "model_ref": request.model_ref if request else d.name,
        "node": d.node.name,
        "max_model_len": request.max_model_len if request else _planned_context(d),
        "concurrency": request.concurrency if request else 1,
        **constraints,
    }


def _planned_context(d: Deployment) -> int | None:
    settings = d.chosen_plan.settings
    return settings.max_model_len if settings else None


def startup_overdue(d: Deployment, now: datetime, verdict: Verdict, lines: list[str]) -> Problem | None:
    """Launched but not ready within the deadline; loading progress restarts the clock."""
    if d.state not in (DeploymentState.LAUNCHING, DeploymentState.LOADING):
        return None
    since = d.startup_progress_at or d.state_since
    waited = (now - since).total_seconds()
    if waited < d.startup_deadline_s:
        return None
    phase = verdict.phase if verdict.phase not in ("unknown", "starting") else d.state
    title = f"{d.name} on {d.node.name}: not ready after {waited:.0f} s, stuck in {phase}"
    cause, remedy, actions = startup_cause(d, phase)
    evidence = {"log": lines[-40:], "phase": phase, "log_findings": findings_json(verdict)}
    return Problem(f"startup:{d.pk}", "startup", title, cause, remedy, evidence, actions)


def startup_cause(d: Deployment, phase: str) -> tuple[str, str, dict[str, Any]]:
    weak = weak_tp_links(d)
    if phase == "nccl-init" and weak:
        return (
            f"NCCL initialisation never finished; the TP group spans {weak} without P2P.",
            "Restart with NCCL_P2P_DISABLE=1, check ACS/IOMMU, or re-plan without TP across these links.",
            {"replan": replan_fields(d, tp=1)},
        )
    if phase == "nccl-init":
        return (
            "NCCL initialisation never finished (a rank is missing or a link is blocked).",
            "Check that every rank started, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name the right NIC, "
            "and run with NCCL_DEBUG=INFO.",
            {},
        )
    return (
        f"The server has been in {phase} longer than its startup deadline ({d.startup_deadline_s:.0f} s) "
        "without loading progress.",
        "Check the log tail and the model path/storage speed; restart it.",
        {},
    )


def crashed(d: Deployment, verdict: Verdict, lines: list[str]) -> Problem | None:
    if d.state != DeploymentState.FAILED or d.desired != DesiredState.RUNNING:
        return None
    reason = f"exit code {d.exit_code}" if d.exit_code is not None else "the process is gone"
    first = verdict.findings[0] if verdict.findings else None
    cause = first.meaning if first else f"The inference server died ({reason})."
    remedy = first.advice if first else "Read the last log lines below; fix the cause and press Restart."
    return Problem(
        f"crashed:{d.pk}",
        "crashed",
        f"{d.name} on {d.node.name} failed ({reason})",
        cause,
        remedy,
        {"log": lines[-40:], "log_findings": findings_json(verdict), "exit_code": d.exit_code},
    )


def unload_stuck(d: Deployment, now: datetime, lines: list[str]) -> Problem | None:
    """Ollama still lists a model past its unload time ('Stopping...' in `ollama ps`) for longer than an
    unload takes (ollama/ollama#10119). layercake loads with OLLAMA_KEEP_ALIVE=-1 (expires_at ~290 years
    ahead), so this is a client's shorter keep_alive that ran out on a runner something still holds. The
    log shows only /api/ps polls then (fixture 032), so the scraped counter decides, not the log."""
    overdue = (d.last_counters or {}).get("unload_overdue_s")
    if overdue is None or overdue <= UNLOADING.allowance or not counters_current(d, now):
        return None
    secs, allow = f"{overdue:.0f}", f"{UNLOADING.allowance:.0f}"
    title = f"{d.name} on {d.node.name}: model stuck in 'Stopping...' for {secs} s"
    evidence = {
        "log": lines[-40:],
        "unload_overdue_s": round(overdue),
        "allowed_s": UNLOADING.allowance,
        "scraped_at": datetime.fromtimestamp(d.last_counters_t, tz=UTC).isoformat(),
    }
    return Problem(
        f"unload:{d.pk}",
        "unload",
        title,
        UNLOADING.meaning.format(secs=secs, allow=allow),
        UNLOADING.advice,
        evidence,
    )


def counters_current(d: Deployment, now: datetime) -> bool:
    """The last scrape still describes the server: it is scraped, its node reports and the scrape is recent."""
    if d.state not in SCRAPED or d.last_counters_t is None or d.node.last_seen is None:
        return False
    window = d.node.stale_after()
    scraped_ago = now.timestamp() - d.last_counters_t
    return now - d.node.last_seen <= window and scraped_ago <= window.total_seconds() + CLOCK_SLACK_S


def hung_idle(d: Deployment, now: datetime, lines: list[str]) -> Problem | None:
    """The newest canary probe failed while the server runs: it hangs though nobody uses it (agents/canary.py).
    A later probe that answers resolves it; so does no newer probe for two probe periods (the agent stops
    probing once real requests run, and a stuck request is then the stall rule's)."""
    probe = d.last_probe
    if not d.probes_enabled or not probe or probe["ok"] or d.state not in SCRAPED:
        return None
    period = d.probe_interval_s + d.probe_timeout_s
    if now.timestamp() - probe["t"] > 2 * period + CLOCK_SLACK_S:
        return None
    health = health_said(probe)
    title = (
        f"{d.name} on {d.node.name}: hung while idle (a {d.probe_timeout_s:g} s canary probe failed: "
        f"{probe['error'][:80]}; {health})"
    )
    evidence = {
        "probe": {k: probe.get(k) for k in ("t", "elapsed_s", "timeout_s", "idle_s", "error")},
        "health": {k: probe.get(k) for k in ("health_status", "health_s", "health_body")},
        "log": lines[-40:],
    }
    cause, remedy = hung_idle_cause(d, probe)
    return Problem(f"{HUNG_IDLE}:{d.pk}", HUNG_IDLE, title, cause, remedy, evidence)


def health_said(probe: dict[str, Any]) -> str:
    status, took = probe.get("health_status"), probe.get("health_s")
    if status is None:
        return "/health did not answer either" + (f" within {took:g} s" if took else "")
    return f"/health answered {status}" + (f" in {took:.2f} s" if took is not None else "")


def hung_idle_cause(d: Deployment, probe: dict[str, Any]) -> tuple[str, str]:
    idle = f"It had served nothing for {probe.get('idle_s', 0):.0f} s, so no user's request showed it yet."
    if probe.get("health_status") is None:
        cause = (
            "The server's process runs but answers nothing, not even its health check: it is frozen "
            f"(stopped, swapping, or blocked in the kernel or a driver call). {idle}"
        )
    elif probe["health_status"] == 200:
        cause = (
            "The server says it is healthy but does not generate: its engine is stuck while the API process "
            "lives on (for example tensor-parallel ranks deadlocked in a collective, which vLLM has no "
            f"watchdog for: vllm-project/vllm#48720). {idle}"
        )
    else:
        cause = f"The server fails its health check ({probe['health_status']}) and does not generate. {idle}"
    weak = weak_tp_links(d)
    remedy = (
        f"Capture `py-spy dump --pid {d.pid or '<pid>'}` of the server and its workers, then restart the "
        "deployment. The alert resolves when a probe answers again."
        + (
            f" The TP group spans {weak} without P2P: consider NCCL_P2P_DISABLE=1 or a re-plan."
            if weak
            else ""
        )
    )
    return cause, remedy


def log_signature(
    d: Deployment, verdict: Verdict, lines: list[str], settled: frozenset[str] = frozenset()
) -> Problem:
    first = verdict.findings[0]
    evidence = {"log": lines[-40:], "log_findings": findings_json(verdict), "phase": verdict.phase}
    if verdict.verdict == "hang" and d.state in (DeploymentState.READY, DeploymentState.SERVING):
        if f"stall:{d.pk}" in settled:
            return confirmed(f"stall:{d.pk}", "stall")
        # The server's own stats lines show the stall before (or without) the scraped counters: same cause,
        # same alert, whichever evidence sees it first.
        cause, remedy, actions = stall_cause(d, gpu_pattern(d, timezone.now()))
        title = f"{d.name} on {d.node.name}: no tokens with requests in flight ({first.signature} in its log)"
        return Problem(f"stall:{d.pk}", "stall", title, f"{first.meaning} {cause}", remedy, evidence, actions)
    title = f"{d.name} on {d.node.name}: log says {verdict.verdict} ({first.signature})"
    return Problem(f"log:{d.pk}", "log", title, first.meaning, first.advice, evidence)


def findings_json(verdict: Verdict) -> list[dict[str, Any]]:
    return [
        {"signature": f.signature, "line": f.line, "text": f.text, "meaning": f.meaning, "advice": f.advice}
        for f in verdict.findings[:10]
    ]


def counter_series(d: Deployment, now: datetime, minutes: int = 10) -> dict[str, list]:
    rows = d.metrics.filter(t__gte=now - timedelta(minutes=minutes)).order_by("t")
    series: dict[str, list] = {"t": [], "generation_tokens_total": [], "requests_running": []}
    for m in rows:
        series["t"].append(m.t.timestamp())
        series["generation_tokens_total"].append(m.generation_tokens_total)
        series["requests_running"].append(m.requests_running)
    return series


def gpu_pattern(d: Deployment, now: datetime, seconds: float = 30) -> dict[str, Any]:
    """Mean utilization and memory use of the deployment's GPUs over the last seconds, and their pattern."""
    rows = GpuSample.objects.filter(
        gpu__node=d.node, gpu__index__in=d.chosen_plan.head_gpus, t__gte=now - timedelta(seconds=seconds)
    )
    values = list(rows.values_list("util_gpu", "mem_used_mib", "mem_free_mib"))
    if not values:
        return {"pattern": "unknown"}
    util = sum(v[0] for v in values) / len(values)
    mem = sum(v[1] / max(1.0, v[1] + v[2]) for v in values) / len(values)
    pattern = "spin" if util >= 95 else "idle-full" if util <= 5 and mem >= 0.8 else "other"
    return {"pattern": pattern, "util_mean": round(util, 1), "memory_used_fraction": round(mem, 3)}


# ---- nodes ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeSeen:
    """What the node rules read of a node: a row, not a model instance (1,000 of those cost more than the
    rules themselves). An alert about the node gets a Node through `as_node`."""

    pk: int
    name: str
    last_seen: datetime
    interval_s: float
    connected: bool = False

    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.interval_s * settings.STALE_AFTER_INTERVALS)

    def as_node(self) -> Node:
        return Node(pk=self.pk, name=self.name, last_seen=self.last_seen, interval_s=self.interval_s)


SeenNode = Node | NodeSeen


def nodes_seen() -> list[NodeSeen]:
    rows = Node.objects.filter(last_seen__isnull=False).values_list(
        "pk", "name", "last_seen", "interval_s", "connected"
    )
    return [NodeSeen(*row) for row in rows]


def node_problems(nodes: list[SeenNode], now: datetime) -> list[Problem]:
    """Lost nodes (alone, or grouped into incidents) and XID errors, for the whole fleet in a few queries."""
    lost = [n for n in nodes if now - n.last_seen > n.stale_after()]
    problems = lost_node_problems(lost, now) if lost else []
    return problems + xid_problems(nodes, now)


def lost_node_problems(lost: list[SeenNode], now: datetime) -> list[Problem]:
    """One node-lost alert per node lost alone; one incident for many nodes lost within the grouping window.

    A node with an open node-lost alert keeps it. The others belong to an open incident whose span (widened
    by the window) covers their last message, or form new groups: a group of NODE_LOST_GROUP_MIN or more
    opens an incident at once; a smaller one waits out the window (the rest of a storm may follow) before
    its nodes get alerts of their own."""
    window = timedelta(seconds=settings.NODE_LOST_GROUP_WINDOW_S)
    open_keys = dict(
        Alert.objects.unresolved().filter(kind__in=("node-lost", INCIDENT)).values_list("key", "evidence")
    )
    running = deployments_running([n.pk for n in lost])
    alone = [n for n in lost if f"node-lost:{n.pk}" in open_keys]
    incidents = [
        Incident.from_alert(key, evidence) for key, evidence in open_keys.items() if key.startswith(INCIDENT)
    ]
    alone_ids = {n.pk for n in alone}
    loose = [
        n
        for n in sorted(lost, key=lambda n: n.last_seen)
        if n.pk not in alone_ids and not joined(n, incidents, window)
    ]
    for group in groups_within(loose, window):
        if len(group) >= settings.NODE_LOST_GROUP_MIN:
            incidents.append(Incident.new(group))
        else:
            alone += [n for n in group if now - n.last_seen >= n.stale_after() + window]
    problems = [node_lost(n, now, running.get(n.pk, 0)) for n in alone]
    return problems + [p for p in (i.problem(now, running) for i in incidents) if p]


def joined(node: SeenNode, incidents: list[Incident], window: timedelta) -> bool:
    for incident in incidents:
        if incident.covers(node.last_seen, window):
            incident.add(node)
            return True
    return False


def groups_within(nodes: list[SeenNode], window: timedelta) -> list[list[SeenNode]]:
    """Nodes (sorted by last message) in groups whose last messages lie within `window` of the group's first."""
    groups: list[list[Node]] = []
    for node in nodes:
        if groups and node.last_seen - groups[-1][0].last_seen <= window:
            groups[-1].append(node)
        else:
            groups.append([node])
    return groups


def deployments_running(node_ids: list[int]) -> dict[int, int]:
    active = Deployment.objects.filter(node_id__in=node_ids, state__in=DeploymentState.ACTIVE)
    return dict(active.values("node_id").annotate(n=Count("pk")).values_list("node_id", "n"))


def node_lost(node: SeenNode, now: datetime, running: int) -> Problem:
    silent = (now - node.last_seen).total_seconds()
    return Problem(
        f"node-lost:{node.pk}",
        "node-lost",
        f"{node.name}: no agent message for {silent:.0f} s",
        "The agent stopped reporting: the node, its network or the agent process is down."
        + (f" {running} deployment(s) run there." if running else ""),
        "Check that the host is up and `python -m agents run` is running; look at the agent's log.",
        {"last_seen": node.last_seen.isoformat(), "deployments": running},
        node=node.as_node() if isinstance(node, NodeSeen) else node,
    )


@dataclass
class Incident:
    """Many nodes lost within the grouping window: one alert whose evidence lists them, lost or back."""

    key: str
    members: dict[
        int, dict[str, Any]
    ]  # node id -> {"id", "name", "lost_at", "back_at"}, as the evidence keeps them
    lost_now: set[int] = field(default_factory=set)
    first: datetime | None = None
    last: datetime | None = None

    @classmethod
    def from_alert(cls, key: str, evidence: dict[str, Any]) -> Incident:
        incident = cls(key, {m["id"]: dict(m) for m in evidence.get("nodes", [])})
        for member in incident.members.values():
            incident.widen(datetime.fromisoformat(member["lost_at"]))
        return incident

    @classmethod
    def new(cls, nodes: list[SeenNode]) -> Incident:
        first = nodes[0]
        incident = cls(f"{INCIDENT}:{first.last_seen:%Y%m%dT%H%M%S}:{first.pk}", {})
        for node in nodes:
            incident.add(node)
        return incident

    def widen(self, t: datetime) -> None:
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)

    def add(self, node: SeenNode) -> None:
        """`node` is lost now, as part of this incident (again, if it came back in between)."""
        self.members[node.pk] = {
            "id": node.pk,
            "name": node.name,
            "lost_at": node.last_seen.isoformat(),
            "back_at": None,
        }
        self.lost_now.add(node.pk)
        self.widen(node.last_seen)

    def covers(self, t: datetime, window: timedelta) -> bool:
        return self.first is not None and self.first - window <= t <= self.last + window

    def problem(self, now: datetime, running: dict[int, int]) -> Problem | None:
        """The incident as it stands: None once every member reports again (the alert then resolves)."""
        if not self.lost_now:
            return None
        for pk, member in self.members.items():
            if pk not in self.lost_now:
                member["back_at"] = member["back_at"] or now.isoformat()
        span = max(1, ceil((self.last - self.first).total_seconds()))
        lost, back = len(self.lost_now), len(self.members) - len(self.lost_now)
        on_them = sum(running.get(pk, 0) for pk in self.lost_now)
        title = (
            f"{lost} nodes lost within {span} s{f' ({back} back)' if back else ''}: "
            "server overloaded or network partition?"
        )
        cause = (
            f"{len(self.members)} agents stopped reporting within {span} s of each other. So many at once is "
            "rarely that many separate failures: the server may be overloaded (agents time out in their "
            "handshakes and give up), or a network partition cuts these nodes off from it."
            + (f" {on_them} deployment(s) run on the nodes still lost." if on_them else "")
        )
        remedy = (
            "Check the server first: the ASGI process's CPU, the database and Redis, and its log for "
            "handshake timeouts; then the network between the server and these nodes. Each node's part "
            "resolves when its agent reports again; the alert resolves when all of them do."
        )
        nodes = sorted(self.members.values(), key=lambda m: (m["back_at"] is not None, m["name"]))
        evidence = {
            "nodes": nodes,
            "lost": lost,
            "back": back,
            "deployments": on_them,
            "window_s": settings.NODE_LOST_GROUP_WINDOW_S,
        }
        return Problem(self.key, INCIDENT, title, cause, remedy, evidence)


def xid_problems(nodes: list[SeenNode], now: datetime) -> list[Problem]:
    """XID errors of the last XID_QUIET_MINUTES, newest sighting per node, GPU and code. Two queries whatever
    the fleet's size: the samples that carry XIDs come from their own partial index (sample_xid_time)."""
    by_id = {n.pk: n for n in nodes}
    recent = GpuSample.objects.filter(t__gte=now - timedelta(minutes=XID_QUIET_MINUTES)).exclude(xids=[])
    rows = list(recent.order_by().values_list("gpu_id", "t", "xids"))
    where = dict(
        (pk, (node_id, index))
        for pk, node_id, index in Gpu.objects.filter(pk__in={r[0] for r in rows}).values_list(
            "pk", "node_id", "index"
        )
    )
    seen: dict[tuple[int, int, int], datetime] = {}
    for gpu_id, t, codes in rows:
        node_id, index = where.get(gpu_id, (None, 0))
        for code in codes if node_id in by_id else ():
            if xids.is_failure(code):  # 63, 64, 92 only inform
                seen[(node_id, index, code)] = max(seen.get((node_id, index, code), t), t)
    return [xid_problem(by_id[node_id], index, code, t) for (node_id, index, code), t in sorted(seen.items())]


def xid_problem(node: SeenNode, index: int, code: int, t: datetime) -> Problem:
    meaning, remedy = xids.describe(code)
    return Problem(
        f"xid:{node.pk}:{index}:{code}",
        "xid",
        f"{node.name} GPU{index}: XID {code} ({meaning})",
        f"The driver reported XID {code}: {meaning}.",
        remedy[0].upper() + remedy[1:] + ".",
        {"gpu": index, "xid": code, "last_seen": t.isoformat()},
        severity="critical" if code in xids.CRITICAL else "warning",
        node=node.as_node() if isinstance(node, NodeSeen) else node,
    )


def fleet_problems(now: datetime | None = None) -> tuple[list[Problem], set[str]]:
    """Every problem in the fleet now, and the key prefixes that were judged (to resolve the rest)."""
    now = now or timezone.now()
    problems: list[Problem] = []
    judged: set[str] = set()
    settled = settled_keys(now)
    deployments = list(fleet_queryset())
    for d in deployments:
        problems += deployment_problems(d, now, settled)
        judged |= {f"{kind}:{d.pk}" for kind in ("stall", "startup", "crashed", "log", HUNG_IDLE)}
        if d.state not in SCRAPED or counters_current(
            d, now
        ):  # stale counters: leave the unload alert as it is
            judged.add(f"unload:{d.pk}")
    for gone in LOG_TAILS.keys() - {d.pk for d in deployments}:
        del LOG_TAILS[gone]
    nodes = nodes_seen()
    problems += node_problems(nodes, now)
    judged |= {f"node-lost:{n.pk}" for n in nodes} | {f"xid:{n.pk}:" for n in nodes} | {f"{INCIDENT}:"}
    return problems, judged


def settled_keys(now: datetime) -> frozenset[str]:
    """Keys of the deployment alerts that keep their content this run. The open ones have their evidence
    gathered and written again in turn (by id), EVIDENCE_PER_RUN of them per run, so that a run's queries do
    not grow with the number of open alerts (a stall's counter history and GPU pattern cost two queries
    each); with 200 open, each is described again every 50 runs."""
    keys = list(
        Alert.objects.unresolved()
        .filter(deployment__isnull=False)
        .order_by("pk")
        .values_list("key", flat=True)
    )
    if not keys:
        return frozenset()
    per_run = min(EVIDENCE_PER_RUN, len(keys))
    first = int(now.timestamp() / settings.AGENT_INTERVAL) * per_run
    return frozenset(keys) - {keys[(first + i) % len(keys)] for i in range(per_run)}

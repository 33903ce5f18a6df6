"""Plan requests and deployments: what an operator asked for, what was launched, and how it is doing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from agents import protocol
from dashboard.choices import DeploymentState, DesiredState, PlanStatus
from dashboard.models.fleet import Node
from placement.plan_model import Plan

SHOWN_LOAD_TESTS = 20  # Measure runs on the deployment page and in the API


def _deployment_id() -> str:
    return uuid.uuid4().hex[:16]


class PlanRequest(models.Model):
    """One press of "Plan" on the deploy form; the Celery planning task fills in `result`."""

    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    model_ref = models.CharField(
        max_length=500, help_text="catalog name, HF id, or a path to config.json/GGUF"
    )
    config = models.JSONField(null=True, blank=True, help_text="an uploaded config.json")
    max_model_len = models.PositiveIntegerField(default=8192)
    concurrency = models.PositiveIntegerField(default=1)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    backend = models.CharField(max_length=20, blank=True)
    gpus = models.CharField(max_length=200, blank=True, help_text="comma-separated GPU indices")
    tp = models.PositiveSmallIntegerField(null=True, blank=True, help_text="tensor-parallel size (1: none)")
    backend_version = models.CharField(
        max_length=40, blank=True, help_text="the vLLM release that will serve (selects its non-torch memory)"
    )
    status = models.CharField(max_length=10, choices=PlanStatus.choices(), default=PlanStatus.QUEUED)
    status_since = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveSmallIntegerField(default=0, help_text="how many times planning started")
    error = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"plan {self.pk}: {self.model_ref}"

    def get_absolute_url(self) -> str:
        return reverse("plan", args=[self.pk])

    def plans(self) -> list[Plan]:
        return [Plan.from_json(p) for p in (self.result or {}).get("plans", [])]

    def plan(self, number: int) -> Plan | None:
        plans = (self.result or {}).get("plans", [])
        return Plan.from_json(plans[number]) if 0 <= number < len(plans) else None


class Deployment(models.Model):
    """A model served on one or more nodes through their agents, from one chosen plan."""

    id = models.CharField(primary_key=True, max_length=64, default=_deployment_id, editable=False)
    name = models.CharField(max_length=200)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    plan_request = models.ForeignKey(PlanRequest, null=True, blank=True, on_delete=models.SET_NULL)
    plan = models.JSONField(help_text="the planner's plan as chosen")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="deployments")
    launch = models.JSONField(help_text="the launch command sent to the agent (protocol.Launch)")
    state = models.CharField(
        max_length=10, choices=DeploymentState.choices(), default=DeploymentState.PLANNED
    )
    state_since = models.DateTimeField(default=timezone.now)
    progress = models.FloatField(null=True, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)
    # What the operator wants: "running" until they press Stop. Reports that contradict a stop are stale.
    desired = models.CharField(
        max_length=10, choices=DesiredState.choices(), default=DesiredState.RUNNING, editable=False
    )
    override_busy = models.BooleanField(default=False)
    stall_window_s = models.FloatField(
        default=60.0, help_text="requests in flight with no token progress for this long is a stall"
    )
    startup_deadline_s = models.FloatField(
        default=900.0,
        help_text="launched but not ready after this long "
        "(the clock restarts whenever loading makes progress)",
    )
    # When the server last showed progress: tokens or steps moved, or nothing was owed (no requests).
    progress_at = models.DateTimeField(null=True, blank=True)
    # When startup last showed progress: a state change or a loading-progress step.
    startup_progress_at = models.DateTimeField(null=True, blank=True)
    last_counters = models.JSONField(null=True, blank=True)
    last_counters_t = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    # Multi-node: the port the head's rendezvous listens on, as its agent reported; the others join it.
    dist_port = models.PositiveIntegerField(null=True, blank=True)
    # Canary probes (agents/canary.py): the agent's tiny completions while the server is idle.
    probes_enabled = models.BooleanField(default=True, help_text="the agent probes the server while idle")
    probe_idle_s = models.FloatField(default=30.0, help_text="probe after serving nothing for this long")
    probe_interval_s = models.FloatField(default=60.0, help_text="then probe again this often")
    probe_timeout_s = models.FloatField(default=10.0, help_text="a probe not answered in this long failed")
    last_probe = models.JSONField(null=True, blank=True, help_text="the newest probe (protocol.Probe)")

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} on {self.node.name}"

    def get_absolute_url(self) -> str:
        return reverse("deployment", args=[self.pk])

    @property
    def chosen_plan(self) -> Plan:
        """`plan` (the stored JSON) as the typed plan."""
        return Plan.from_json(self.plan)

    def state_color(self) -> str:
        return DeploymentState.color(self.state)

    def state_label(self) -> str:
        return DeploymentState.label(self.state)

    def summary(self) -> dict[str, Any]:
        """What the live pages show of a deployment (sent in fleet ticks)."""
        counters = self.last_counters or {}
        return {
            "id": self.pk,
            "node": self.node_id,
            "state": self.state,
            "label": self.state_label(),
            "progress": self.progress,
            "tokens_per_s": self.tokens_per_s,
            "t": self.last_counters_t,
            "running": counters.get("requests_running"),
            "waiting": counters.get("requests_waiting"),
        }

    @property
    def is_active(self) -> bool:
        return self.state in DeploymentState.ACTIVE

    def launch_command(self) -> protocol.Launch:
        return protocol.Launch.model_validate(self.launch)

    def member_launch(self, member: DeploymentMember) -> protocol.Launch:
        """The launch for one further node: the head's, with that node's rank, GPUs and the head's port."""
        head = self.launch_command()
        options = head.options.model_copy(update={"node_rank": member.rank, "master_port": self.dist_port})
        data = {**head.model_dump(), "gpus": member.gpus, "options": options.model_dump()}
        return protocol.Launch.model_validate(data)

    def canary_command(self) -> protocol.Canary:
        """The probe settings for the agent (sent after every launch and when the operator changes them)."""
        settings = protocol.CanarySettings(
            enabled=self.probes_enabled,
            idle_s=self.probe_idle_s,
            interval_s=self.probe_interval_s,
            timeout_s=self.probe_timeout_s,
        )
        return protocol.Canary(type="canary", v=protocol.VERSION, deployment=self.pk, canary=settings)

    def set_probes(self, enabled: bool) -> protocol.Canary:
        """The operator turns probes on or off; returns the command that tells the agent."""
        self.probes_enabled = enabled
        self.save(update_fields=["probes_enabled"])
        return self.canary_command()

    def record_probe(self, probe: protocol.Probe) -> CanaryProbe:
        """A canary probe's outcome: kept (probes per hour) and the newest one on the row (the hang rule)."""
        self.last_probe = probe.model_dump(exclude={"type", "v", "seq", "deployment"})
        self.save(update_fields=["last_probe"])
        return CanaryProbe.objects.create(
            deployment=self,
            t=datetime.fromtimestamp(probe.t, tz=UTC),
            ok=probe.ok,
            elapsed_s=probe.elapsed_s,
            error=probe.error,
            health_status=probe.health_status,
        )

    def recent_load_tests(self) -> QuerySet[DeploymentLoadTest]:
        """The Measure runs the page and the API show: newest first, at most SHOWN_LOAD_TESTS."""
        return self.load_tests.select_related("created_by")[:SHOWN_LOAD_TESTS]

    def probes_per_hour(self, now: datetime | None = None) -> int:
        since = (now or timezone.now()) - timedelta(hours=1)
        return self.probes.filter(t__gte=since).count()

    def move_to(self, state: str, detail: str = "", **fields: Any) -> None:
        """Change state (recording an event) and any reported fields; a repeated state records nothing."""
        if move_row(self, state, detail, fields, also_on_change=("startup_progress_at",)):
            DeploymentEvent.objects.create(deployment=self, state=state, detail=detail)

    def apply_status(self, status: protocol.DeploymentStatus) -> None:
        """The agent reported on this deployment's process."""
        if self.desired == DesiredState.STOPPED and status.state not in (
            DeploymentState.STOPPED,
            DeploymentState.FAILED,
        ):
            return  # a late report from a process the operator already stopped
        if self.state == DeploymentState.FAILED and status.state == DeploymentState.STOPPED:
            return  # stopped because another node of it failed: the failure is the news
        if self.state == DeploymentState.FAILED == status.state and self.members.exists():
            if HEAD_END not in self.detail:  # another node failed first: keep that, add the head's end
                self.move_to(self.state, member_failure_text(self.detail, status.detail))
            return
        fields = {
            k: getattr(status, k)
            for k in ("port", "pid", "exit_code", "progress")
            if getattr(status, k) is not None
        }
        if status.progress is not None and status.progress != self.progress:
            fields["startup_progress_at"] = timezone.now()
        self.move_to(status.state, status.detail, **fields)

    def record_metrics(self, t: float, counters: protocol.ServerCounters) -> DeploymentMetric | None:
        """Turn the newest cumulative counters into rates against the previous ones, and keep them."""
        previous, previous_t = self.last_counters, self.last_counters_t
        self.last_counters, self.last_counters_t = counters.model_dump(), t
        if made_progress(previous, counters):
            self.progress_at = datetime.fromtimestamp(t, tz=UTC)
        if previous is None or previous_t is None or t <= previous_t:
            self.save(update_fields=["last_counters", "last_counters_t", "progress_at"])
            return None
        from agents.metrics import rates  # the agent's own counter arithmetic: one implementation

        r = rates(protocol.ServerCounters.model_validate(previous), previous_t, counters, t)
        self.tokens_per_s = r.get("generation_tokens_per_s")
        self.save(update_fields=["last_counters", "last_counters_t", "tokens_per_s", "progress_at"])
        return DeploymentMetric.objects.create(
            deployment=self, t=datetime.fromtimestamp(t, tz=UTC), **_metric_fields(r, counters)
        )


PROGRESS_COUNTERS = (
    "generation_tokens_total",
    "prompt_tokens_total",
    "steps_total",
    "requests_finished_total",
)


def made_progress(previous: dict | None, counters: protocol.ServerCounters) -> bool:
    """Did the server move since the previous scrape, or owe nothing (no request running or waiting)?"""
    owed = (counters.requests_running or 0) + (counters.requests_waiting or 0)
    if previous is None or owed == 0:
        return True
    return any((getattr(counters, k) or 0) != (previous.get(k) or 0) for k in PROGRESS_COUNTERS)


def _metric_fields(r: dict[str, Any], counters: protocol.ServerCounters) -> dict[str, Any]:
    return {
        "generation_tokens_per_s": r.get("generation_tokens_per_s"),
        "prompt_tokens_per_s": r.get("prompt_tokens_per_s"),
        "ttft_s": r.get("ttft_mean_s"),
        "itl_s": r.get("itl_mean_s"),
        "requests_running": counters.requests_running,
        "requests_waiting": counters.requests_waiting,
        "kv_cache_usage": counters.kv_cache_usage,
        "generation_tokens_total": counters.generation_tokens_total,
        "steps_total": counters.steps_total,
    }


def move_row(
    row: Deployment | DeploymentMember,
    state: str,
    detail: str,
    fields: dict[str, Any],
    also_on_change: tuple[str, ...] = (),
) -> bool:
    """Set a row's state, detail and fields, saving only those columns (a Celery task and the ingest path may
    hold the same row at once); True when the state changed. `also_on_change` fields get the change time."""
    changed = state != row.state
    for name, value in fields.items():
        setattr(row, name, value)
    written = set(fields)
    if changed:
        row.state, row.state_since = state, timezone.now()
        for name in also_on_change:
            setattr(row, name, row.state_since)
        written |= {"state", "state_since", *also_on_change}
    if detail:
        row.detail = detail
        written.add("detail")
    if written:
        row.save(update_fields=sorted(written))
    return changed


HEAD_END = "\n\nthe head: "


def member_failure_text(member_said: str, head_detail: str) -> str:
    """A multi-node deployment's failure: the node that failed first, then how the head ended."""
    return f"{member_said}{HEAD_END}{head_detail}"[:8000]


class DeploymentMember(models.Model):
    """A further node of a multi-node deployment (rank 1 and up); the head (rank 0) is the Deployment itself.
    Its launch is sent once the head has reported the port where the others join it."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="members")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="deployment_members")
    rank = models.PositiveSmallIntegerField()
    gpus = models.JSONField(help_text="GPU indices on this node")
    launch = models.JSONField(null=True, blank=True, help_text="the launch sent to this node's agent")
    state = models.CharField(
        max_length=10, choices=DeploymentState.choices(), default=DeploymentState.PLANNED
    )
    state_since = models.DateTimeField(default=timezone.now)
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["deployment", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "node"], name="member_unique_node"),
            models.UniqueConstraint(fields=["deployment", "rank"], name="member_unique_rank"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id} rank {self.rank} on {self.node.name}"

    @property
    def is_active(self) -> bool:
        return self.state in DeploymentState.ACTIVE

    def shown_state(self) -> str:
        """A rank that serves no API cannot say it is ready: it is, once the head (which waits for it) is."""
        head = self.deployment.state
        if self.state in (DeploymentState.LAUNCHING, DeploymentState.LOADING) and head in (
            DeploymentState.READY,
            DeploymentState.SERVING,
        ):
            return head
        return self.state

    def state_label(self) -> str:
        return DeploymentState.label(self.shown_state())

    def move_to(self, state: str, detail: str = "", **fields: Any) -> None:
        """Like Deployment.move_to; a change is recorded on the deployment's history, naming this node."""
        if move_row(self, state, detail, fields):
            DeploymentEvent.objects.create(
                deployment=self.deployment,
                state=state,
                detail=f"{self.node.name} (rank {self.rank}): {detail or state}",
            )

    def apply_status(self, status: protocol.DeploymentStatus) -> None:
        fields = {k: getattr(status, k) for k in ("pid", "exit_code") if getattr(status, k) is not None}
        self.move_to(status.state, status.detail, **fields)


class DeploymentEvent(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    t = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=10, choices=DeploymentState.choices())
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["t", "pk"]

    def __str__(self) -> str:
        return f"{self.deployment_id} {self.state} @ {self.t:%H:%M:%S}"


class DeploymentMetric(models.Model):
    """Rates over one scrape interval, derived from the counters the agent scraped."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="metrics")
    t = models.DateTimeField()
    generation_tokens_per_s = models.FloatField(null=True)
    prompt_tokens_per_s = models.FloatField(null=True)
    ttft_s = models.FloatField(null=True)
    itl_s = models.FloatField(null=True)
    requests_running = models.FloatField(null=True)
    requests_waiting = models.FloatField(null=True)
    kv_cache_usage = models.FloatField(null=True)
    generation_tokens_total = models.FloatField(null=True)
    steps_total = models.FloatField(null=True)

    class Meta:
        ordering = ["deployment", "t"]
        indexes = [
            models.Index(fields=["deployment", "t"], name="metric_deployment_time"),
            models.Index(fields=["t"], name="metric_time"),  # retention (storage.prune_metrics)
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id} @ {self.t:%H:%M:%S}"


class DeploymentHour(models.Model):
    """A deployment's metric rows averaged per hour, kept HOUR_RETENTION_DAYS (the 7 d and 90 d charts) while
    the rows themselves go after METRIC_RETENTION_DAYS. Rebuilt from the rows by dashboard/storage.py for
    every hour that got a row since the last pass, so a row an agent replays late lands in its hour."""

    pk = models.CompositePrimaryKey("deployment", "start")
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+", db_index=False)
    start = models.IntegerField(help_text="the hour's start, unix seconds")
    n = models.IntegerField(help_text="metric rows in the hour")
    generation_tokens_per_s = models.FloatField(null=True)
    requests_running = models.FloatField(null=True)
    requests_waiting = models.FloatField(null=True)

    SECONDS = 3600

    def __str__(self) -> str:
        return f"{self.deployment_id} @ {self.start}"


class MetricRollupMark(models.Model):
    """How far DeploymentHour has read DeploymentMetric: rows with ids up to `rolled_id` are in their hours;
    the next pass reads up to `seen_id`, the highest id when the last one ran (dashboard/metric_hours.py)."""

    rolled_id = models.BigIntegerField(default=0)
    seen_id = models.BigIntegerField(default=0)


class CanaryProbe(models.Model):
    """One canary probe the agent sent an idle deployment (agents/canary.py); kept for probes per hour."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="probes")
    t = models.DateTimeField()
    ok = models.BooleanField()
    elapsed_s = models.FloatField()
    error = models.CharField(max_length=500, blank=True)
    health_status = models.PositiveSmallIntegerField(null=True, blank=True, help_text="None: no answer")

    class Meta:
        ordering = ["deployment", "t"]
        indexes = [models.Index(fields=["deployment", "t"], name="probe_deployment_time")]

    def __str__(self) -> str:
        return f"{self.deployment_id} probe {'ok' if self.ok else 'failed'} @ {self.t:%H:%M:%S}"


class DeploymentLoadTest(models.Model):
    """A short load test run through the agent ("Measure" on the deployment page): what the server did at a
    concurrency the operator picked, next to what the planner predicted for the plan it runs."""

    RUNNING, DONE, FAILED = "running", "done", "failed"
    STATUSES = [(RUNNING, "Running"), (DONE, "Done"), (FAILED, "Failed")]

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="load_tests")
    request = models.CharField(max_length=32, unique=True, help_text="the ask's request id")
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=10, choices=STATUSES, default=RUNNING)
    error = models.TextField(blank=True)
    streams = models.PositiveSmallIntegerField(help_text="concurrent requests")
    max_tokens = models.PositiveIntegerField()
    backend = models.CharField(max_length=20, help_text="the backend that ran (the launch's)")
    predicted_tok_s = models.FloatField(
        null=True, help_text="the plan's predicted decode tokens/s per stream"
    )
    completed = models.PositiveSmallIntegerField(null=True)
    tokens = models.PositiveIntegerField(null=True)
    seconds = models.FloatField(null=True)
    tok_s_per_stream = models.FloatField(null=True, help_text="mean decode tokens/s of one stream")
    tok_s_total = models.FloatField(null=True, help_text="decode tokens/s of all streams together")
    ttft_s = models.FloatField(null=True, help_text="mean time to first token")
    itl_s = models.FloatField(null=True, help_text="mean inter-token latency")

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.deployment_id} x{self.streams} @ {self.created:%H:%M:%S}"

    def record(self, result: protocol.Measurement, error: str) -> None:
        """The agent's result: done when at least one stream produced tokens, failed (with why) otherwise."""
        for name in ("completed", "tokens", "seconds", "tok_s_per_stream", "tok_s_total", "ttft_s", "itl_s"):
            setattr(self, name, getattr(result, name))
        self.status = self.DONE if result.completed else self.FAILED
        self.error = error
        self.save()

    def ratio_to_prediction(self) -> float | None:
        if not self.predicted_tok_s or self.tok_s_per_stream is None:
            return None
        return self.tok_s_per_stream / self.predicted_tok_s

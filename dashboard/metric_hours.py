"""A deployment's metrics per hour (DeploymentHour), so its 7 d and 90 d charts outlive the metric rows.

The rows (DeploymentMetric, one per scrape) are kept METRIC_RETENTION_DAYS (default 7); their hourly averages
are kept HOUR_RETENTION_DAYS (default 90), like the GPUs' hour tier. Each storage pass rebuilds, from the rows
themselves, every hour that got a row since the previous pass: a row an agent replays late lands in its hour,
and rebuilding (not adding) keeps a pass that runs twice harmless. Like the GPU rollup it reads by id up to
what the previous pass saw: on PostgreSQL a lower id can still be uncommitted when a higher one is visible.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max, Q
from django.db.models.expressions import RawSQL

from dashboard import storage
from dashboard.models import DeploymentHour, DeploymentMetric, MetricRollupMark

HOUR = DeploymentHour.SECONDS
AVERAGED = ("generation_tokens_per_s", "requests_running", "requests_waiting")


def roll_up(now: datetime) -> int:
    """Rebuild the hours touched by the rows the previous pass saw; return how many hours were written."""
    mark, _ = MetricRollupMark.objects.get_or_create(pk=1)
    seen = DeploymentMetric.objects.aggregate(top=Max("pk"))["top"] or 0
    oldest = int((now - timedelta(days=settings.METRIC_RETENTION_DAYS)).timestamp()) // HOUR * HOUR
    with transaction.atomic():
        touched = touched_hours(mark.rolled_id, mark.seen_id, oldest)
        rows = hour_rows(touched)
        DeploymentHour.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["deployment", "start"], update_fields=["n", *AVERAGED]
        )
        MetricRollupMark.objects.filter(pk=1).update(
            rolled_id=max(mark.rolled_id, mark.seen_id), seen_id=seen
        )
    return len(rows)


def _hour() -> RawSQL:
    return RawSQL(storage.bucket_sql(HOUR), ())


def touched_hours(low: int, high: int, oldest: int) -> dict[int, set[int]]:
    """Deployment id -> the hours (unix seconds) of its rows with ids in (low, high]; hours whose rows
    retention already took (before `oldest`) are left as they are."""
    pairs = (
        DeploymentMetric.objects.filter(pk__gt=low, pk__lte=high)
        .annotate(b=_hour())
        .values_list("deployment_id", "b")
        .distinct()
    )
    touched: dict[int, set[int]] = defaultdict(set)
    for deployment_id, hour in pairs:
        if hour >= oldest:
            touched[deployment_id].add(hour)
    return touched


def hour_rows(touched: dict[int, set[int]]) -> list[DeploymentHour]:
    """Each touched hour averaged again from all of its rows."""
    if not touched:
        return []
    spans = Q()
    for deployment_id, hours in touched.items():
        spans |= Q(deployment_id=deployment_id, t__gte=datetime.fromtimestamp(min(hours), tz=UTC))
    groups = (
        DeploymentMetric.objects.filter(spans)
        .annotate(b=_hour())
        .values("deployment_id", "b")
        .annotate(count=Count("id"), **{f: Avg(f) for f in AVERAGED})
    )
    return [
        DeploymentHour(
            deployment_id=g["deployment_id"], start=g["b"], n=g["count"], **{f: g[f] for f in AVERAGED}
        )
        for g in groups
        if g["b"] in touched[g["deployment_id"]]
    ]


def prune(cutoff: datetime) -> int:
    return DeploymentHour.objects.filter(start__lt=int(cutoff.timestamp())).delete()[0]


def history(deployment_id: int, since: datetime, step_s: int) -> list[list[float | None]]:
    """[[unix_ms, generation tok/s, running, waiting], ...] per `step_s` (whole hours), each the average of
    its hours weighted by their row counts."""
    hours = DeploymentHour.objects.filter(deployment_id=deployment_id, start__gte=int(since.timestamp()))
    buckets: dict[int, list[DeploymentHour]] = defaultdict(list)
    for hour in hours.order_by("start"):
        buckets[hour.start // step_s * step_s].append(hour)
    return [[start * 1000, *(_weighted(group, f) for f in AVERAGED)] for start, group in buckets.items()]


def _weighted(hours: list[DeploymentHour], field: str) -> float | None:
    pairs = [(getattr(h, field), h.n) for h in hours if getattr(h, field) is not None]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None

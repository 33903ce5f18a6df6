"""A deployment's metric rows (one per scrape) are pruned by the storage beat task after
METRIC_RETENTION_DAYS, in bounded batches; what calibration measured from them stands after they go."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.protocol import ServerCounters
from dashboard import calibration, deploy, fleet, storage, tasks
from dashboard.models import DeploymentHour, DeploymentMetric
from tests.dashboard.test_fleet_calibration import box, planned  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("box")]  # the node deployments run on


def scrape(deployment, start: float, seconds: int, rate: float = 40.0) -> None:
    """An agent scraping a server generating `rate` tok/s on one stream, every second from `start`."""
    for second in range(seconds + 1):
        counters = ServerCounters(generation_tokens_total=rate * second, requests_running=1)
        deployment.record_metrics(start + second, counters)


def test_it_prunes_metric_rows_past_the_retention_in_bounded_batches(alice, settings, monkeypatch):
    settings.METRIC_RETENTION_DAYS = 2
    monkeypatch.setattr(storage, "METRIC_BATCH", 7)
    deployment = deploy.create_deployment(planned(), 0, alice)
    now = time.time()
    scrape(deployment, now - 3 * 86400, 30)  # 30 intervals three days ago
    scrape(deployment, now - 60, 5)  # 5 in the last minute (the first pair spans the gap: it is 3 days old)
    old = DeploymentMetric.objects.filter(t__lt=timezone.now() - timedelta(days=2)).count()
    assert old == 30 and DeploymentMetric.objects.count() == 36
    with CaptureQueriesContext(connection) as queries:
        result = tasks.maintain_storage()  # what the beat runs
    assert result["deleted_metrics"] == old
    assert DeploymentMetric.objects.count() == 6
    deletes = [
        q["sql"] for q in queries.captured_queries if "DELETE" in q["sql"] and "deploymentmetric" in q["sql"]
    ]
    assert len(deletes) >= old // 7  # one bounded batch per statement
    assert tasks.maintain_storage()["deleted_metrics"] == 0


def test_it_keeps_what_calibration_measured_once_the_metric_rows_are_gone(alice, settings):
    settings.METRIC_RETENTION_DAYS = 1
    deployment = deploy.create_deployment(planned(), 0, alice)
    scrape(deployment, time.time() - 3 * 86400, 4)
    measured = calibration.measure(deployment)
    assert (measured.stream_tok_s, measured.decode_intervals) == (40.0, 4)
    tasks.maintain_storage()
    assert not deployment.metrics.exists()
    again = calibration.measure(deployment)  # the deployment page measures on every view
    assert (again.streams, again.stream_tok_s, again.total_tok_s, again.decode_intervals) == (
        1,
        40.0,
        40.0,
        4,
    )


def two_passes() -> list[dict]:
    """A pass reads the rows the one before it saw (an uncommitted lower id is not skipped), so a row is in
    its hour after the second pass that follows it."""
    return [tasks.maintain_storage(), tasks.maintain_storage()]


def test_it_keeps_a_deployments_hourly_averages_for_the_long_charts_after_its_rows_go(alice, settings):
    deployment = deploy.create_deployment(planned(), 0, alice)
    five_days_ago = (time.time() - 5 * 86400) // 3600 * 3600 + 60
    scrape(deployment, five_days_ago, 30)  # 40 tok/s for 30 s
    scrape(deployment, time.time() - 60, 5, rate=10.0)
    assert sum(run["metric_hours"] for run in two_passes()) >= 2
    settings.METRIC_RETENTION_DAYS = 2
    assert tasks.maintain_storage()["deleted_metrics"] == 30
    for name in ("7d", "90d"):
        points = [p for p in fleet.metric_history(deployment, fleet.chart_minutes(name)) if p[1] is not None]
        assert points[0][1] == pytest.approx(40.0) and points[0][0] <= five_days_ago * 1000
        assert points[-1][0] >= (time.time() - 7 * 3600) * 1000  # the last minute is in its hour too
    hour = DeploymentHour.objects.get(deployment=deployment, start=five_days_ago // 3600 * 3600)
    assert hour.n == 30 and hour.requests_running == 1


def test_it_rebuilds_an_hour_when_a_late_row_arrives_and_not_twice_when_nothing_did(alice):
    deployment = deploy.create_deployment(planned(), 0, alice)
    start = (time.time() - 3 * 3600) // 3600 * 3600 + 60
    scrape(deployment, start, 10)  # 10 intervals at 40 tok/s
    two_passes()
    hour = DeploymentHour.objects.get(deployment=deployment, start=start // 3600 * 3600)
    assert (hour.n, hour.generation_tokens_per_s) == (10, pytest.approx(40.0))
    DeploymentMetric.objects.create(  # an agent's replay of that hour, stored late
        deployment=deployment,
        t=datetime.fromtimestamp(start + 5, tz=UTC),  # inside the hour, whatever the clock's minute
        generation_tokens_per_s=150,
    )
    assert sum(run["metric_hours"] for run in two_passes()) == 1
    hour.refresh_from_db()
    assert (hour.n, hour.generation_tokens_per_s) == (11, pytest.approx(50.0))
    assert [run["metric_hours"] for run in two_passes()] == [0, 0]


def test_it_prunes_hourly_averages_past_the_hour_retention(alice, settings):
    deployment = deploy.create_deployment(planned(), 0, alice)
    old = int(time.time()) // 3600 * 3600 - 100 * 86400
    DeploymentHour.objects.create(deployment=deployment, start=old, n=3, generation_tokens_per_s=1.0)
    DeploymentHour.objects.create(
        deployment=deployment, start=old + 20 * 86400, n=3, generation_tokens_per_s=1.0
    )
    assert tasks.maintain_storage()["deleted_metric_hours"] == 1
    assert list(DeploymentHour.objects.values_list("start", flat=True)) == [old + 20 * 86400]

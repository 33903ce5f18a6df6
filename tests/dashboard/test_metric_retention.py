"""A deployment's metric rows (one per scrape) are pruned by the storage beat task after
METRIC_RETENTION_DAYS, in bounded batches; what calibration measured from them stands after they go."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.protocol import ServerCounters
from dashboard import calibration, deploy, storage, tasks
from dashboard.models import DeploymentMetric
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

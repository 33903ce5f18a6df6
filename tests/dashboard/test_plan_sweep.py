"""Plan requests whose worker died while planning (issue #10, item 13): the beat task `sweep_stale_plans` queues
one again once it has been planning for PLAN_STALE_AFTER_S, and fails it with the reason the second time,
instead of leaving it "planning" for the broker's visibility timeout (an hour)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard import deploy, tasks
from dashboard.choices import PlanStatus
from dashboard.models import PlanRequest
from tests.personas import seed_server

pytestmark = pytest.mark.django_db
STALE_S = 120.0


@pytest.fixture
def queued(monkeypatch, settings) -> list[int]:
    """The plan requests the sweep hands to the broker again (not sent: no worker here)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.PLAN_STALE_AFTER_S = STALE_S
    sent: list[int] = []
    monkeypatch.setattr(tasks.plan_request, "delay", sent.append)
    return sent


def request_in(status: str, seconds_ago: float, attempts: int) -> PlanRequest:
    return PlanRequest.objects.create(
        model_ref="Qwen3-32B",
        max_model_len=8192,
        status=status,
        attempts=attempts,
        status_since=timezone.now() - timedelta(seconds=seconds_ago),
    )


def status_of(row: PlanRequest) -> str:
    row.refresh_from_db()
    return row.status


def test_it_queues_a_request_again_once_it_has_planned_too_long_then_fails_it_with_the_reason(queued):
    seed_server()
    killed = request_in(PlanStatus.RUNNING, STALE_S + 10, attempts=1)
    assert tasks.sweep_stale_plans() == 1
    assert queued == [killed.pk] and status_of(killed) == PlanStatus.QUEUED
    assert tasks.sweep_stale_plans() == 0  # queued just now: the worker gets its time
    deploy.start_planning(killed)  # the second worker starts it, and dies too
    PlanRequest.objects.filter(pk=killed.pk).update(
        status_since=timezone.now() - timedelta(seconds=STALE_S + 1)
    )
    assert tasks.sweep_stale_plans() == 1 and queued == [killed.pk]
    killed.refresh_from_db()
    assert killed.status == PlanStatus.FAILED and killed.attempts == 2
    assert killed.error.startswith(
        "planning stopped without finishing 2 times (no result after 120 s each time)"
    )


def test_it_leaves_requests_that_are_fresh_finished_or_never_started_alone(queued):
    rows = [
        request_in(PlanStatus.RUNNING, STALE_S - 10, attempts=1),
        request_in(PlanStatus.DONE, 9999, attempts=1),
        request_in(PlanStatus.FAILED, 9999, attempts=2),
        request_in(PlanStatus.QUEUED, 9999, attempts=0),
    ]
    assert tasks.sweep_stale_plans() == 0 and queued == []
    assert [status_of(r) for r in rows] == [
        PlanStatus.RUNNING,
        PlanStatus.DONE,
        PlanStatus.FAILED,
        PlanStatus.QUEUED,
    ]


def test_it_fails_a_request_queued_again_that_no_worker_started(queued):
    lost = request_in(PlanStatus.QUEUED, STALE_S + 1, attempts=1)
    assert tasks.sweep_stale_plans() == 1 and queued == []
    lost.refresh_from_db()
    assert lost.status == PlanStatus.FAILED and "no worker started it within 120 s" in lost.error


def test_it_plans_a_request_queued_again_and_ignores_the_broker_giving_a_failed_one_back_later(queued):
    seed_server()
    killed = request_in(PlanStatus.RUNNING, STALE_S + 10, attempts=1)
    tasks.sweep_stale_plans()
    assert tasks.plan_request(killed.pk) == PlanStatus.DONE and status_of(killed) == PlanStatus.DONE
    failed = request_in(PlanStatus.RUNNING, STALE_S + 10, attempts=2)
    tasks.sweep_stale_plans()
    assert (
        tasks.plan_request(failed.pk) == PlanStatus.FAILED
    )  # the original message, redelivered an hour later
    failed.refresh_from_db()
    assert failed.result is None and failed.attempts == 2


def test_it_does_not_overwrite_a_request_that_finished_while_the_sweep_looked(queued):
    seed_server()
    row = request_in(PlanStatus.RUNNING, STALE_S + 10, attempts=1)
    seen = PlanRequest.objects.get(pk=row.pk)
    deploy.run_plan_request(row.pk)  # the slow worker was alive after all and finishes now
    assert not deploy.move_stale_plan(seen, timezone.now(), STALE_S)
    row.refresh_from_db()
    assert row.status == PlanStatus.DONE and row.result["plans"]


def test_it_sweeps_on_the_beat_schedule_more_often_than_a_request_goes_stale(settings):
    from layercake.celery import app

    entry = next(
        e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "dashboard.tasks.sweep_stale_plans"
    )
    assert entry["task"] in app.tasks and entry["schedule"] < settings.PLAN_STALE_AFTER_S

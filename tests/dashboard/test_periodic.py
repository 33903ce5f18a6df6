"""Periodic detection at fleet size: runs never pile up, and a run's queries do not grow with the fleet or
with the number of open problems."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard import tasks
from dashboard.models import Alert, Deployment, Node, TaskLease, leases
from tests import storm

pytestmark = pytest.mark.django_db


def test_it_lets_one_run_hold_the_lease_at_a_time():
    held = TaskLease.claim("evaluate_fleet", 60)
    assert held is not None
    assert TaskLease.claim("evaluate_fleet", 60) is None
    TaskLease.release("evaluate_fleet", held)
    assert TaskLease.claim("evaluate_fleet", 60) is not None


def test_it_gives_the_lease_of_a_run_that_died_to_the_next_after_it_ran_out():
    now = timezone.now()
    dead = TaskLease.claim("evaluate_fleet", 60, now=now - timedelta(seconds=61))
    successor = TaskLease.claim("evaluate_fleet", 60, now=now)
    assert successor is not None
    TaskLease.release(
        "evaluate_fleet", dead
    )  # the dead run's late release leaves the successor's lease alone
    assert TaskLease.claim("evaluate_fleet", 60) is None


def test_it_skips_a_run_while_the_previous_one_is_still_going():
    storm.silence(storm.fleet(3, timezone.now()), 30)
    with leases.held("evaluate_fleet", 60) as mine:
        assert mine
        assert tasks.evaluate_fleet() is None and not Alert.objects.exists()
    assert tasks.evaluate_fleet() == 3 and Alert.objects.count() == 3


HOLD_AND_WAIT = """
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3", reason="SQLite's"
)
def test_it_skips_while_another_process_runs_and_takes_over_when_that_process_dies():
    storm.silence(storm.fleet(2, timezone.now()), 30)
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, str(leases.lock_path("evaluate_fleet"))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "held"
        assert tasks.evaluate_fleet() is None and not Alert.objects.exists()
    finally:
        other.kill()  # a worker that dies holding the lease: the lock goes with it
        other.wait()
    assert tasks.evaluate_fleet() == 2 and Alert.objects.count() == 2


def test_it_expires_queued_detection_runs_and_routes_them_to_their_own_queue():
    schedule = settings.CELERY_BEAT_SCHEDULE
    for entry in ("evaluate-fleet", "announce-silent-nodes"):
        task = schedule[entry]["task"]
        assert schedule[entry]["options"]["expires"] == schedule[entry]["schedule"]
        assert settings.CELERY_TASK_ROUTES[task] == {"queue": "detect"}


def steady_queries() -> int:
    tasks.evaluate_fleet()  # opens the alerts: a cost per new alert, once
    with CaptureQueriesContext(connection) as queries:
        tasks.evaluate_fleet()
    return len(queries)


def test_it_judges_lost_nodes_in_queries_that_do_not_grow_with_them():
    counts = []
    for count in (10, 40):
        Node.objects.all().delete()
        Alert.objects.all().delete()
        storm.silence(storm.fleet(count, timezone.now(), gpus=2), 30)
        counts.append(steady_queries())
        assert Alert.objects.unresolved().count() == 1  # one incident for nodes lost together
    assert counts[0] == counts[1]


def test_it_judges_stalled_deployments_in_queries_that_do_not_grow_with_them():
    counts = []
    for count in (6, 30):
        Alert.objects.all().delete()
        Deployment.objects.all().delete()
        Node.objects.all().delete()
        storm.stalled_deployments(count, history_s=20, stuck_s=120)
        counts.append(steady_queries())
        assert Alert.objects.unresolved().filter(kind="stall").count() == count
    # Equal but for the one bulk update of alerts whose text changed between the two runs (a stall's age can
    # cross a rounding step in between, or not, with the machine's speed): 0 or 1 query, never one per alert.
    assert abs(counts[0] - counts[1]) <= 1, counts


def test_it_announces_every_silent_node_in_one_message(settings):
    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    layer = channel_layers["default"]
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("fleet", channel)
    quiet = storm.fleet(30, timezone.now() - timedelta(seconds=5))
    storm.fleet(2, timezone.now(), prefix="chatty")
    assert sorted(tasks.announce_silent_nodes()) == sorted(n.name for n in quiet)
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "fleet.nodes" and {n["status"] for n in message["nodes"]} == {"stale"}
    assert sorted(n["node"] for n in message["nodes"]) == sorted(n.pk for n in quiet)
    channel_layers.backends.clear()

"""Alert storms (issue #10): many nodes lost at once open one incident and send one mail, and judging a
fleet with many open problems costs a bounded number of queries. Wall times: bench/alerts.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard import alerts, detect, tasks
from dashboard.choices import AlertStatus
from dashboard.models import Alert, Notification
from dashboard.tasks import evaluate_fleet
from tests import storm
from tests.smtp import smtp_server

pytestmark = pytest.mark.django_db
QUERIES_PER_RUN = 25  # whatever the number of nodes; the code before grouping made 2,403 for 300 lost nodes


@pytest.fixture(autouse=True)
def quiet_settings(settings, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    monkeypatch.setattr(tasks, "queue_delivery", lambda: None)  # the test delivers itself


@pytest.fixture
def inbox(settings):
    with smtp_server() as box:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", box.port
        yield box


def incident() -> Alert:
    (alert,) = Alert.objects.filter(kind="nodes-lost")
    return alert


def states(alert: Alert) -> dict[str, str]:
    return {m["name"]: "back" if m["back_at"] else "lost" for m in alert.evidence["nodes"]}


def test_it_opens_one_incident_and_sends_one_mail_when_300_nodes_go_silent_together(
    alice, inbox, django_assert_max_num_queries
):
    nodes = storm.fleet(300, timezone.now())
    assert evaluate_fleet() == 0
    storm.silence(nodes, 5.0)
    for _ in range(3):  # the run that opens it, then runs that find it open
        with django_assert_max_num_queries(QUERIES_PER_RUN):
            assert evaluate_fleet() == 1
    alert = incident()
    assert alert.title == "300 nodes lost within 1 s: server overloaded or network partition?"
    assert alert.status == AlertStatus.OPEN and Alert.objects.count() == 1
    assert len(alert.evidence["nodes"]) == 300 and set(states(alert).values()) == {"lost"}
    alerts.deliver_pending()
    (mail,) = inbox.wait_for(1)
    assert mail["Subject"] == f"[layercake] OPEN: {alert.title}" and mail["To"] == "alice@example.com"
    assert "node-0000" in mail.get_content() and "node-0299" in mail.get_content()


def test_it_resolves_each_nodes_part_and_then_the_incident(
    alice, inbox, client, django_assert_max_num_queries
):
    nodes = storm.fleet(300, timezone.now())
    storm.silence(nodes, 5.0)
    evaluate_fleet()
    storm.report(nodes[:100])
    with django_assert_max_num_queries(QUERIES_PER_RUN):
        assert evaluate_fleet() == 1
    alert = incident()
    assert alert.status == AlertStatus.OPEN and alert.title.startswith("200 nodes lost within 1 s (100 back)")
    assert list(states(alert).values()).count("back") == 100 and states(alert)["node-0000"] == "back"
    client.force_login(alice)
    page = client.get(alert.get_absolute_url()).content.decode()
    assert 'id="evidence-nodes"' in page and page.count("reports again since") == 100 and "node-0299" in page
    storm.report(nodes)
    with django_assert_max_num_queries(QUERIES_PER_RUN):
        assert evaluate_fleet() == 0
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED
    assert alert.events.last().reason == "every node of the incident reports again"
    alerts.deliver_pending()
    assert [m["Subject"].split(":")[0] for m in inbox.wait_for(2)] == [
        "[layercake] OPEN",
        "[layercake] RESOLVED",
    ]
    assert not Alert.objects.filter(kind="node-lost").exists()


def test_it_gives_a_node_lost_alone_its_own_alert_once_the_window_has_passed(alice, settings):
    lone = storm.fleet(1, timezone.now(), prefix="lone")
    storm.silence(lone, 5.0)
    assert evaluate_fleet() == 0  # lost, but the rest of a storm could still follow
    storm.silence(lone, 3.0 + settings.NODE_LOST_GROUP_WINDOW_S + 1)
    assert evaluate_fleet() == 1
    assert list(Alert.objects.values_list("kind", "key")) == [("node-lost", f"node-lost:{lone[0].pk}")]


def evaluate_at(now) -> None:
    problems, judged = detect.fleet_problems(now)
    alerts.sync(problems, judged)


def test_it_adds_nodes_lost_soon_after_to_the_open_incident_and_not_those_lost_much_later(alice, settings):
    settings.NODE_LOST_GROUP_MIN = 3
    t0 = timezone.now()
    storm.fleet(3, t0, "first")
    later, alone = storm.fleet(2, t0, "later"), storm.fleet(1, t0, "alone")
    storm.silence(later, -8, t0)  # their agents' last messages: 8 s after the first three's
    storm.silence(alone, -60, t0)  # and a minute after
    evaluate_at(t0 + timedelta(seconds=5))
    assert incident().title == "3 nodes lost within 1 s: server overloaded or network partition?"
    evaluate_at(t0 + timedelta(seconds=12))
    assert incident().title == "5 nodes lost within 8 s: server overloaded or network partition?"
    evaluate_at(t0 + timedelta(seconds=60 + 3 + settings.NODE_LOST_GROUP_WINDOW_S + 1))
    assert sorted(Alert.objects.values_list("kind", flat=True)) == ["node-lost", "nodes-lost"]
    assert Alert.objects.get(kind="node-lost").node == alone[0]
    assert len(incident().evidence["nodes"]) == 5 and Notification.objects.count() == 2


@pytest.mark.slow
def test_it_judges_300_stalled_deployments_in_a_bounded_number_of_queries(
    alice, django_assert_max_num_queries
):
    deployments = storm.stalled_deployments(300)
    nodes = [d.node for d in deployments]
    storm.report(nodes)  # their agents keep reporting; only their servers are stuck
    evaluate_fleet()  # opens the 300 stall alerts (opening costs queries per alert)
    assert Alert.objects.filter(kind="stall", status=AlertStatus.OPEN).count() == 300
    for _ in range(3):
        storm.report(nodes)
        with django_assert_max_num_queries(80):  # the code before made 3,303
            assert evaluate_fleet() == 300
    assert Alert.objects.count() == 300 and Notification.objects.count() == 300

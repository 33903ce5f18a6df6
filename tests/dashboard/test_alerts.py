"""Alerts: lifecycle and dedupe, notifications (mail, webhooks against a real local HTTP server), pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core import mail
from django.utils import timezone

from dashboard import alerts, deploy, tasks
from dashboard.choices import AlertStatus, ChannelKind, NotificationStatus, PlanStatus
from dashboard.live import FLEET_GROUP
from dashboard.models import Alert, Channel, Notification, PlanRequest
from dashboard.transports import WebhookTransport
from tests.personas import seed_server
from tests.smtp import smtp_server

pytestmark = pytest.mark.django_db
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


@pytest.fixture(autouse=True)
def quiet_settings(settings, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.SITE_URL = "https://layercake.example"
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]  # the test receivers listen on loopback
    monkeypatch.setattr(WebhookTransport, "RETRY_DELAYS", (0.0, 0.0))


def stall(key: str = "stall:d1", **fields) -> Alert:
    values = {
        "kind": "stall",
        "title": "qwen on a30-seed: no tokens for 75 s with 2 request(s) in flight",
        "cause": "TP=2 all-reduces across SYS without P2P.",
        "remedy": "Restart with NCCL_P2P_DISABLE=1.",
        "evidence": {
            "log": ["INFO Avg generation throughput: 0.0 tokens/s, Running: 2 reqs"],
            "series": {"t": [1.0, 2.0], "generation_tokens_total": [10, 10], "requests_running": [2, 2]},
        },
    }
    return alerts.raise_alert(key=key, **{**values, **fields})


def statuses(alert: Alert) -> list[tuple[str, str]]:
    return list(alert.events.values_list("old_status", "new_status"))


# ---- lifecycle ---------------------------------------------------------------------------------------------
def test_it_opens_an_alert_with_one_event_and_one_notification_per_operator(alice, django_user_model):
    django_user_model.objects.create_user("bob", "bob@example.com", "pw", is_staff=True)
    django_user_model.objects.create_user("carol", "carol@example.com", "pw")  # not an operator
    alert = stall()
    assert alert.status == AlertStatus.OPEN and statuses(alert) == [("", "open")]
    recipients = Notification.objects.values_list("channel__value", flat=True)
    assert sorted(recipients) == ["alice@example.com", "bob@example.com"]


def test_it_refreshes_the_unresolved_alert_of_a_key_without_a_new_event_or_mail(alice):
    first = stall()
    again = stall(evidence={"log": ["still nothing"]}, remedy="Re-plan without TP.")
    assert again.pk == first.pk and Alert.objects.count() == 1
    again.refresh_from_db()
    assert again.log_lines() == ["still nothing"] and again.remedy == "Re-plan without TP."
    assert statuses(again) == [("", "open")] and Notification.objects.count() == 1


def test_it_keeps_an_acknowledged_alert_acknowledged_when_the_rule_sees_it_again(alice):
    alert = stall()
    alerts.acknowledge(alert, alice)
    assert stall().status == AlertStatus.ACKNOWLEDGED and Alert.objects.count() == 1


def test_it_goes_open_acknowledged_resolved_and_records_each_change(alice):
    alert = stall()
    event = alerts.acknowledge(alert, alice)
    assert event.reason == "acknowledged by alice" and alert.acknowledged_by == alice
    resolved = alerts.resolve_alert("stall:d1", "tokens flow again")
    assert resolved.pk == alert.pk and resolved.resolved is not None
    assert statuses(alert) == [("", "open"), ("open", "acknowledged"), ("acknowledged", "resolved")]
    assert alert.events.last().reason == "tokens flow again"
    assert alerts.resolve_alert("stall:d1", "again") is None and alert.events.count() == 3


def test_it_does_not_acknowledge_an_alert_that_is_no_longer_open(alice):
    alert = stall()
    alerts.resolve_alert(alert.key, "cleared")
    assert alerts.acknowledge(alert, alice) is None
    assert Alert.objects.get().status == AlertStatus.RESOLVED and alert.events.count() == 2


def test_it_opens_a_new_alert_when_a_resolved_problem_comes_back(alice):
    first = stall()
    alerts.resolve_alert(first.key, "cleared")
    second = stall()
    assert second.pk != first.pk and second.status == AlertStatus.OPEN
    assert list(alerts.open_alerts("stall")) == [second] and list(alerts.open_alerts("xid")) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"severity": "urgent"}, "severity 'urgent' is not one of"),
        ({"title": " "}, "title must be a non-empty string"),
        ({"evidence": ["a line"]}, "evidence must be a dict, not list"),
        ({"actions": {"replan": {1, 2}}}, "actions must be plain JSON"),
        ({"key": ""}, "alert key must be 1-200 characters"),
    ],
)
def test_it_names_what_is_wrong_with_bad_alert_input(fields, message):
    with pytest.raises(ValueError, match=message):
        stall(**fields)
    assert not Alert.objects.exists()


def test_it_tells_browsers_when_an_alert_opens_and_resolves(
    alice, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(tasks, "queue_delivery", lambda: None)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(FLEET_GROUP, channel)
    with django_capture_on_commit_callbacks(execute=True):
        alert = stall()
    with django_capture_on_commit_callbacks(execute=True):
        alerts.resolve_alert(alert.key, "cleared")
    messages = [async_to_sync(layer.receive)(channel) for _ in range(2)]
    assert [(m["type"], m["alert"]["status"]) for m in messages] == [
        ("fleet.alert", "open"),
        ("fleet.alert", "resolved"),
    ]
    assert messages[0]["alert"]["url"] == f"/alerts/{alert.pk}/"


# ---- e-mail --------------------------------------------------------------------------------------------------
def test_it_mails_when_an_alert_opens_and_resolves_but_not_on_acknowledge(alice):
    alert = stall()
    alerts.acknowledge(alert, alice)
    alerts.resolve_alert(alert.key, "tokens flow again")
    assert alerts.deliver_pending() == 2
    opened, resolved = mail.outbox
    assert opened.subject == f"[layercake] OPEN: {alert.title}" and opened.to == ["alice@example.com"]
    for text in (
        alert.cause,
        alert.remedy,
        "Avg generation throughput: 0.0",
        f"https://layercake.example/alerts/{alert.pk}/",
    ):
        assert text in opened.body
    assert resolved.subject == f"[layercake] RESOLVED: {alert.title}" and "tokens flow again" in resolved.body
    assert set(Notification.objects.values_list("status", flat=True)) == {NotificationStatus.SENT}


def test_it_limits_mail_per_channel_and_summarises_what_it_held_back(alice, settings):
    settings.ALERT_MAIL_LIMIT = 2
    for n in range(4):
        stall(key=f"stall:{n}", title=f"stall number {n}")
    alerts.deliver_pending()
    assert len(mail.outbox) == 2
    skipped = Notification.objects.filter(status=NotificationStatus.SKIPPED)
    assert skipped.count() == 2 and skipped.first().error == "rate limit: 2 mails in the last 10 minutes"
    Notification.objects.filter(status=NotificationStatus.SENT).update(
        finished=timezone.now() - timedelta(minutes=11)
    )
    stall(key="stall:4", title="stall number 4")
    alerts.deliver_pending()
    summary = mail.outbox[-1].body
    assert (
        "held back 2 notifications" in summary
        and "OPEN: stall number 2" in summary
        and "stall number 3" in summary
    )


def test_it_disables_an_address_the_mail_server_refuses_and_says_why(alice, settings):
    with smtp_server(refuse=("alice@example.com",)) as inbox:
        settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = (
            SMTP_BACKEND,
            "127.0.0.1",
            inbox.port,
        )
        stall()
        alerts.deliver_pending()
    channel = Channel.objects.get(owner=alice)
    assert (
        not channel.enabled
        and "550" in channel.disabled_reason
        and "alice@example.com" in channel.disabled_reason
    )
    assert Notification.objects.get().status == NotificationStatus.FAILED and inbox.messages == []
    alerts.resolve_alert("stall:d1", "cleared")
    assert Notification.objects.count() == 1  # a disabled channel gets nothing queued


def test_it_retries_mail_later_when_the_mail_server_is_down(alice, settings):
    from dashboard import stack

    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = (
        SMTP_BACKEND,
        "127.0.0.1",
        stack.free_port(),
    )
    stall()
    alerts.deliver_pending()
    first, retry = Notification.objects.order_by("attempt")
    assert first.status == NotificationStatus.FAILED and "mail server 127.0.0.1" in first.error
    assert (
        retry.status == NotificationStatus.PENDING
        and retry.attempt == 2
        and retry.not_before > timezone.now()
    )
    assert Channel.objects.get(owner=alice).enabled


# ---- channels and claiming -----------------------------------------------------------------------------------
def test_it_makes_one_mail_channel_per_staff_operator_that_follows_their_address(alice, django_user_model):
    django_user_model.objects.create_user("dave", "", "pw", is_staff=True)  # no address: no channel
    Channel.ensure_operator_emails()
    alice.email = "alice@ops.example"
    alice.save()
    Channel.ensure_operator_emails()
    assert list(Channel.objects.values_list("owner__username", "value")) == [("alice", "alice@ops.example")]


def test_it_sends_nothing_to_a_channel_its_owner_turned_off(alice):
    Channel.ensure_operator_emails()
    Channel.objects.get(owner=alice).disable("")
    stall()
    Channel.ensure_operator_emails()
    assert not Channel.objects.get(owner=alice).enabled and not Notification.objects.exists()


def test_it_lets_only_one_worker_claim_a_notification(alice):
    stall()
    claimed = Notification.claim_next()
    assert claimed.status == NotificationStatus.SENDING and Notification.claim_next() is None
    Notification.objects.filter(pk=claimed.pk).update(claimed=timezone.now() - timedelta(minutes=6))
    assert Notification.claim_next().pk == claimed.pk  # that worker died: another takes the row over


def test_it_skips_a_retry_that_the_alert_has_overtaken(alice):
    alert = stall()
    Notification.objects.update(attempt=2)
    alerts.resolve_alert(alert.key, "cleared")
    alerts.deliver_pending()
    stale = Notification.objects.get(event__new_status=AlertStatus.OPEN)
    assert (
        stale.status == NotificationStatus.SKIPPED and stale.error == "superseded: the alert is resolved now"
    )
    assert [m.subject.split(":")[0] for m in mail.outbox] == ["[layercake] RESOLVED"]


# ---- webhooks ------------------------------------------------------------------------------------------------
def webhook(owner, url: str) -> Channel:
    return Channel.objects.create(owner=owner, kind=ChannelKind.WEBHOOK, value=url)


def test_it_posts_every_change_to_a_webhook_as_json(alice, receiver):
    hook = receiver(200)
    webhook(alice, hook.url)
    alert = stall()
    alerts.acknowledge(alert, alice)
    alerts.deliver_pending()
    assert [b["event"]["new_status"] for b in hook.bodies] == ["open", "acknowledged"]
    first = hook.bodies[0]
    assert first["alert"]["key"] == "stall:d1" and first["alert"]["remedy"] == alert.remedy
    assert first["alert"]["url"] == f"https://layercake.example/alerts/{alert.pk}/"
    assert first["alert"]["evidence"]["series"]["requests_running"] == [2, 2]


def test_it_tries_a_webhook_three_times_on_server_errors(alice, receiver):
    hook = receiver(503, 502, 200)
    channel = webhook(alice, hook.url)
    stall()
    alerts.deliver_pending()
    assert len(hook.bodies) == 3
    assert Notification.objects.get(channel=channel).status == NotificationStatus.SENT


def test_it_gives_up_after_three_tries_and_queues_a_later_attempt(alice, receiver):
    hook = receiver(500)
    channel = webhook(alice, hook.url)
    stall()
    alerts.deliver_pending()
    failed, later = Notification.objects.filter(channel=channel).order_by("attempt")
    assert len(hook.bodies) == 3 and failed.error.endswith("answered 500 Internal Server Error")
    assert later.status == NotificationStatus.PENDING and later.attempt == 2
    channel.refresh_from_db()
    assert channel.enabled and channel.last_error == failed.error


def test_it_disables_a_webhook_that_answers_4xx_without_retrying(alice, receiver):
    hook = receiver(404)
    channel = webhook(alice, hook.url)
    stall()
    alerts.deliver_pending()
    channel.refresh_from_db()
    assert len(hook.bodies) == 1 and not channel.enabled
    assert f"{hook.url} answered 404 Not Found (permanent error on" in channel.disabled_reason
    assert Notification.objects.filter(channel=channel).count() == 1


def test_it_counts_an_unreachable_webhook_as_a_transient_failure(alice):
    from dashboard import stack

    channel = webhook(alice, f"http://127.0.0.1:{stack.free_port()}/hook")
    stall()
    alerts.deliver_pending()
    failed = Notification.objects.filter(channel=channel).order_by("attempt").first()
    assert failed.status == NotificationStatus.FAILED and "could not reach" in failed.error
    channel.refresh_from_db()
    assert channel.enabled


# ---- pages ---------------------------------------------------------------------------------------------------
def test_it_lists_open_acknowledged_and_resolved_alerts(client, alice):
    open_one, acked, done = (
        stall("a", title="first open"),
        stall("b", title="second acked"),
        stall("c", title="third done"),
    )
    alerts.acknowledge(acked, alice)
    alerts.resolve_alert(done.key, "cleared")
    client.force_login(alice)
    html = client.get("/alerts/").content.decode()
    unresolved, resolved = html.split("Recently resolved")
    assert "first open" in unresolved and "second acked" in unresolved and "by alice" in unresolved
    assert "third done" in resolved and "third done" not in unresolved and open_one.pk


def test_it_shows_cause_remedy_evidence_and_history_on_the_detail_page(client, alice):
    alert = stall(
        evidence={
            "log": ["NCCL WARN timeout"],
            "series": {"t": [1.0], "requests_running": [2]},
            "stuck_s": 75,
            "gpus": {"pattern": "spin"},
        }
    )
    alerts.acknowledge(alert, alice)
    client.force_login(alice)
    html = client.get(f"/alerts/{alert.pk}/").content.decode()
    for text in (
        alert.cause,
        alert.remedy,
        "NCCL WARN timeout",
        'id="evidence-series"',
        "evidence-chart",
        "stuck s",
        "{&quot;pattern&quot;: &quot;spin&quot;}",
        "acknowledged by alice",
        "alert_chart.js",
    ):
        assert text in html
    assert 'id="acknowledge"' not in html and 'id="replan"' not in html


def test_it_shows_open_alerts_in_a_banner_on_every_page(client, alice):
    client.force_login(alice)
    assert 'alert-banner"' not in client.get("/deployments/").content.decode()
    alert = stall()
    for url in ("/", "/deployments/", "/alerts/settings/", "/alerts/banner/"):
        assert alert.title in client.get(url).content.decode(), url
    alerts.resolve_alert(alert.key, "cleared")
    assert alert.title not in client.get("/alerts/banner/").content.decode()


def test_it_acknowledges_from_the_detail_page(client, alice):
    alert = stall()
    client.force_login(alice)
    response = client.post(f"/alerts/{alert.pk}/acknowledge/")
    assert response.status_code == 302 and response.url == f"/alerts/{alert.pk}/"
    alert.refresh_from_db()
    assert alert.status == AlertStatus.ACKNOWLEDGED and alert.acknowledged_by == alice
    assert client.get(f"/alerts/{alert.pk}/acknowledge/").status_code == 405


def test_it_replans_from_the_alerts_suggestion(client, alice, monkeypatch):
    seed_server()
    # Not task_always_eager: Celery binds its producer pool to the default broker even for eager calls.
    queued = []
    monkeypatch.setattr(tasks.plan_request, "delay", queued.append)
    suggestion = {
        "model_ref": "Qwen3-VL-32B-Instruct",
        "max_model_len": 10000,
        "concurrency": 2,
        "node": "a30-seed",
        "backend": "vllm",
        "tp": 1,
    }
    alert = stall(actions={"replan": suggestion})
    client.force_login(alice)
    assert 'id="replan"' in client.get(f"/alerts/{alert.pk}/").content.decode()
    response = client.post(f"/alerts/{alert.pk}/replan/")
    row = PlanRequest.objects.get()
    assert response.status_code == 302 and response.url == f"/deploy/plans/{row.pk}/"
    assert (row.model_ref, row.max_model_len, row.concurrency, row.node.name, row.backend, row.tp) == (
        "Qwen3-VL-32B-Instruct",
        10000,
        2,
        "a30-seed",
        "vllm",
        1,
    )
    assert queued == [row.pk] and row.created_by == alice
    assert tasks.plan_request(row.pk) == PlanStatus.DONE


def test_it_explains_a_replan_suggestion_it_cannot_use(client, alice):
    alert = stall(
        actions={"replan": {"model_ref": "Qwen3-VL-32B-Instruct", "max_model_len": 8192, "node": "gone"}}
    )
    client.force_login(alice)
    response = client.post(f"/alerts/{alert.pk}/replan/", follow=True)
    assert "not a valid request: node:" in response.content.decode() and not PlanRequest.objects.exists()


def test_it_lets_operators_turn_off_mail_and_add_a_webhook(client, alice):
    client.force_login(alice)
    assert "alice@example.com" in client.get("/alerts/settings/").content.decode()
    email_channel = Channel.objects.get(owner=alice)
    client.post("/alerts/settings/", {"action": "disable", "channel": email_channel.pk})
    client.post(
        "/alerts/settings/", {"action": "add", "url": "https://93.184.215.14/layercake"}
    )  # a public address
    assert list(Channel.objects.values_list("kind", "value", "enabled")) == [
        ("email", "alice@example.com", False),
        ("webhook", "https://93.184.215.14/layercake", True),
    ]


def test_it_refuses_a_webhook_that_is_not_http(client, alice):
    client.force_login(alice)
    response = client.post("/alerts/settings/", {"action": "add", "url": "ftp://hooks.example/x"})
    assert "the webhook URL must start with http:// or https://" in response.content.decode()
    assert not Channel.objects.filter(kind=ChannelKind.WEBHOOK).exists()


def test_it_keeps_other_operators_channels_out_of_reach(client, alice, django_user_model):
    bob = django_user_model.objects.create_user("bob", "bob@example.com", "pw", is_staff=True)
    theirs = webhook(bob, "https://hooks.example/bob")
    client.force_login(alice)
    assert client.post("/alerts/settings/", {"action": "delete", "channel": theirs.pk}).status_code == 404
    assert Channel.objects.filter(pk=theirs.pk).exists()


def test_it_builds_deployment_alerts_with_the_deployment_and_node(alice):
    node = seed_server()
    row = deploy.run_plan_request(
        PlanRequest.objects.create(model_ref="Qwen3-VL-32B-Instruct", max_model_len=10000).pk
    )
    deployment = deploy.create_deployment(row, 0, alice)
    alert = stall(key=f"stall:{deployment.pk}", deployment=deployment, node=node)
    assert alert.summary()["deployment"] == deployment.pk and alert.summary()["node"] == "a30-seed"
    assert alerts.open_alerts().get().deployment == deployment

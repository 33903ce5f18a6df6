"""Alert mail for real: a Celery worker process delivers through SMTP to an aiosmtpd server the test runs."""

from __future__ import annotations

import time

import pytest

from dashboard import alerts, tasks
from dashboard.choices import NotificationStatus
from dashboard.models import Notification
from dashboard.tasks import deliver_notifications
from tests.smtp import smtp_server

pytestmark = pytest.mark.slow
SITE = "https://layercake.example"


@pytest.fixture
def inbox(server_env, settings):
    """The SMTP server, and the worker's environment pointing at it (before `celery_worker` starts it)."""
    with smtp_server() as box:
        server_env.update(
            {
                "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "SITE_URL": SITE,
                "EMAIL_HOST": "127.0.0.1",
                "EMAIL_PORT": str(box.port),
            }
        )
        settings.SITE_URL = SITE
        yield box


def raise_stall(evidence: dict) -> alerts.Alert:
    batch = alerts.Batch()
    alert = alerts.raise_alert(
        key="stall:seed",
        kind="stall",
        title="qwen on a30-seed: no tokens for 70 s with 3 request(s) in flight",
        cause="Tensor parallelism (TP=2) all-reduces across GPU0-GPU1 (SYS, P2P NS).",
        remedy="Restart with NCCL_P2P_DISABLE=1, or re-plan without tensor parallelism across these links.",
        evidence=evidence,
        batch=batch,
    )
    tasks.enqueue(batch.jobs())  # as evaluate_fleet does with what alerts.sync returns
    return alert


def test_it_mails_once_on_open_and_once_on_resolve_but_not_on_acknowledge(inbox, notify_worker, alice):
    alert = raise_stall({"log": ["INFO Avg generation throughput: 0.0 tokens/s, Running: 3 reqs"]})
    (opened,) = inbox.wait_for(1)
    assert opened["Subject"] == f"[layercake] OPEN: {alert.title}" and opened["To"] == "alice@example.com"
    body = opened.get_content()
    for text in (
        alert.cause,
        alert.remedy,
        "Avg generation throughput: 0.0 tokens/s",
        f"{SITE}/alerts/{alert.pk}/",
    ):
        assert text in body
    raise_stall({"log": ["still stuck"]})  # the rule sees it again: refreshed, not mailed
    alerts.acknowledge(alert, alice)
    assert deliver_notifications.delay().get(timeout=60) == 0
    batch = alerts.Batch()
    alerts.resolve_alert(alert.key, "generation resumed: 40 tokens in the last 2 s", batch)
    tasks.enqueue(batch.jobs())
    opened, resolved = inbox.wait_for(2)
    assert resolved["Subject"] == f"[layercake] RESOLVED: {alert.title}"
    assert "generation resumed: 40 tokens in the last 2 s" in resolved.get_content()
    time.sleep(1.0)  # nothing else is on its way
    assert len(inbox.messages) == 2
    assert list(Notification.objects.values_list("status", flat=True)) == [NotificationStatus.SENT] * 2

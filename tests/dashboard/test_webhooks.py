"""Safe webhooks (issue #10, item 7): only public addresses, checked when saved and when connecting, to the
address checked; short timeouts; raw errors for admins only; delivery on its own queue and worker."""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from ipaddress import ip_address

import pytest
from django.utils import timezone

from dashboard import alerts, egress, roles, stack, tasks
from dashboard.choices import ChannelKind, NotificationStatus
from dashboard.models import Alert, Channel, Node, Notification
from tests.dashboard.test_alerts import stall, webhook
from tests.harness import wait_until
from tests.personas import person

pytestmark = pytest.mark.django_db
PUBLIC = "93.184.215.14"  # any global unicast address: nothing connects to it in these tests


@pytest.fixture(autouse=True)
def quiet_settings(settings, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.WEBHOOK_ALLOWED_HOSTS = []
    monkeypatch.setattr(tasks, "queue_delivery", lambda: None)


@pytest.fixture
def bob(db):
    """Bob is an operator: he adds webhooks, but is no admin."""
    return person("bob", roles.OPERATOR)


@pytest.fixture
def ada(db):
    """Ada is an admin: she may see what a refused or failed webhook ran into."""
    return person("ada", roles.ADMIN)


@pytest.fixture
def silent_receiver():
    """A port that accepts connections (the kernel completes the handshake) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::1", "loopback"),
        ("64:ff9b::a00:1", "private"),
        ("10.1.2.3", "private"),
        ("192.168.1.1", "private"),
        ("fd12::1", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"),
        ("192.0.0.192", "cloud metadata"),
        ("169.254.10.1", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.1.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),
        ("8.8.8.8", ""),
        ("2606:4700::1111", ""),
        ("::ffff:8.8.8.8", ""),
    ],
)
def test_it_names_why_an_address_is_not_public(address, kind):
    assert egress.category(ip_address(address)) == kind


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/",
        "http://localhost:8000/alerts/",
        "http://10.0.0.5/hook",
        "http://[::1]:22/",
        "http://[::ffff:127.0.0.1]:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0:5432/",
    ],
)
def test_it_refuses_to_save_a_webhook_to_an_internal_address(client, bob, url):
    client.force_login(bob)
    html = client.post("/alerts/settings/", {"action": "add", "url": url}).content.decode()
    assert "is not a public internet address" in html
    assert " resolves to " not in html  # which address it resolves to is for admins
    assert not Channel.objects.filter(kind=ChannelKind.WEBHOOK).exists()


def test_it_tells_an_admin_which_address_it_refused(client, ada):
    client.force_login(ada)
    html = client.post(
        "/alerts/settings/", {"action": "add", "url": "http://localhost:6379/"}
    ).content.decode()
    assert (
        "localhost resolves to 127.0.0.1, a loopback address" in html or "localhost resolves to ::1" in html
    )


def test_it_lets_an_admin_setting_allow_named_internal_hosts_but_never_metadata(client, bob, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["localhost", "169.254.169.254"]
    client.force_login(bob)
    for url in ("http://localhost:9000/hook", "http://127.0.0.1:9000/hook", "http://169.254.169.254/x"):
        client.post("/alerts/settings/", {"action": "add", "url": url})
    assert list(Channel.objects.filter(kind=ChannelKind.WEBHOOK).values_list("value", flat=True)) == [
        "http://localhost:9000/hook"
    ]


def test_it_checks_the_address_again_when_it_connects(bob, dns, receiver):
    hook = receiver(200)
    dns["hooks.test"] = [PUBLIC, "127.0.0.1"]  # public when saved, loopback by the time it sends (rebinding)
    egress.checked_addresses("hooks.test", 80)
    channel = webhook(bob, f"http://hooks.test:{hook.server_address[1]}/hook")
    stall()
    alerts.deliver_pending()
    failed = Notification.objects.get(channel=channel)
    assert failed.status == NotificationStatus.FAILED and hook.bodies == []
    assert (
        failed.error == "refused to connect: hooks.test resolves to 127.0.0.1, a loopback address "
        "(an admin can allow it with WEBHOOK_ALLOWED_HOSTS)"
    )
    channel.refresh_from_db()
    assert not channel.enabled


def test_it_connects_to_the_address_it_checked_not_to_a_second_answer(bob, dns, receiver, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["hooks.test"]
    hook = receiver(200)
    dns["hooks.test"] = ["127.0.0.1", "127.0.0.2"]  # a second lookup would get an address nobody listens on
    channel = webhook(bob, f"http://hooks.test:{hook.server_address[1]}/hook")
    stall()
    alerts.deliver_pending()
    assert (
        Notification.objects.get(channel=channel).status == NotificationStatus.SENT and len(hook.bodies) == 1
    )


def test_it_gives_up_on_a_receiver_that_never_answers_after_the_read_timeout(bob, silent_receiver, settings):
    settings.WEBHOOK_ALLOWED_HOSTS, settings.WEBHOOK_READ_TIMEOUT_S = ["127.0.0.1"], 1.0
    channel = webhook(bob, silent_receiver)
    stall()
    started = time.monotonic()
    alerts.deliver_pending()
    took = time.monotonic() - started
    failed, later = Notification.objects.filter(channel=channel).order_by("attempt")
    assert (
        failed.status == NotificationStatus.FAILED
        and failed.error == f"{silent_receiver} did not answer within 1 s"
    )
    assert 1.0 <= failed.duration < 2.0 and took < 2.5  # tried once, not three times in a row
    assert later.status == NotificationStatus.PENDING and later.not_before > timezone.now()


def test_it_shows_raw_delivery_errors_to_admins_only(client, ada, bob, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    closed = f"http://127.0.0.1:{stack.free_port()}/hook"
    webhook(bob, closed)
    alert = stall()
    Channel.objects.filter(kind=ChannelKind.EMAIL).update(enabled=False)
    alerts.deliver_pending()
    assert (
        "Connection refused"
        in Notification.objects.get(channel__owner=bob, channel__kind=ChannelKind.WEBHOOK, attempt=1).error
    )
    client.force_login(bob)
    for url in ("/alerts/settings/", alert.get_absolute_url()):
        html = client.get(url).content.decode()
        assert "delivery failed" in html and "refused" not in html and "Errno" not in html, url
    client.force_login(ada)
    assert "Connection refused" in client.get(alert.get_absolute_url()).content.decode()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_it_keeps_detecting_while_a_webhook_receiver_hangs(
    server_env, log_dir, django_user_model, silent_receiver
):
    """Real workers as runstack starts them: detection (default queue) and delivery (notify queue)."""
    env = {
        **server_env,
        "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "AGENT_INTERVAL": "0.5",
        "NODE_LOST_GROUP_WINDOW_S": "0",
    }
    owner = django_user_model.objects.create_user("bob", "", "bob-pw-123")
    webhook(owner, silent_receiver)
    first, second = (Node.objects.create(name=name, last_seen=timezone.now()) for name in ("first", "second"))
    services = [
        stack.celery_worker_service(env, log_dir, queues="celery,detect").start(),
        stack.celery_notify_worker_service(env, log_dir).start(),
        stack.celery_beat_service(env, log_dir).start(),
    ]
    try:
        Node.objects.filter(pk=first.pk).update(last_seen=timezone.now() - timedelta(seconds=60))
        sending = wait_until(
            lambda: Notification.objects.filter(status=NotificationStatus.SENDING).first(), 60
        )
        claimed = time.monotonic()
        Node.objects.filter(pk=second.pk).update(last_seen=timezone.now() - timedelta(seconds=60))
        wait_until(lambda: Alert.objects.filter(key=f"node-lost:{second.pk}").exists(), 10)
        assert Notification.objects.get(pk=sending.pk).status == NotificationStatus.SENDING  # still held up
        assert time.monotonic() - claimed < 4.0  # detection ran on schedule meanwhile
        failed = wait_until(
            lambda: Notification.objects.filter(pk=sending.pk, status=NotificationStatus.FAILED).first(), 30
        )
        assert failed.error == f"{silent_receiver} did not answer within 5 s" and 5.0 <= failed.duration < 6.0
        retry = Notification.objects.filter(alert=failed.alert, attempt=2)  # written just after the failure
        assert wait_until(lambda: retry.exists(), 5)
    finally:
        for service in services:
            service.stop()

"""A webhook receiver that sends its answer a header line at a time, each well within the read timeout, must not
hold the notify worker past WEBHOOK_CONNECT_TIMEOUT_S + WEBHOOK_READ_TIMEOUT_S per try: the read timeout bounds
each recv() only, so each try has a deadline of its own (dashboard/transports.py, TryDeadline). Found by an
adversarial test run: before the deadline, such a receiver held the worker as long as it kept sending."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from dashboard import alerts, roles
from dashboard.choices import ChannelKind
from dashboard.models import Channel, Notification
from tests.dashboard.test_alerts import stall, webhook
from tests.personas import person

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quiet_settings(settings, monkeypatch):
    from dashboard import tasks

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    monkeypatch.setattr(tasks, "queue_delivery", lambda: None)


@pytest.fixture
def dripping_receiver():
    """Accepts, reads the request, then sends a status line and one header line every 0.3 s, for 10 s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(33):
                if stop.wait(0.3):
                    return
                try:
                    conn.sendall(b"X-Drip: 1\r\n")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    stop.set()
    listener.close()
    thread.join(timeout=5)


def test_it_gives_up_on_a_receiver_that_drips_its_answer_past_the_try_deadline(dripping_receiver, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.WEBHOOK_CONNECT_TIMEOUT_S, settings.WEBHOOK_READ_TIMEOUT_S = 1.0, 1.0
    webhook(person("bob", roles.OPERATOR), dripping_receiver)
    Channel.objects.filter(kind=ChannelKind.EMAIL).update(enabled=False)
    stall()
    started = time.monotonic()
    alerts.deliver_pending()
    took = time.monotonic() - started
    assert took < 2.5, f"one delivery held the notify worker {took:.1f} s (connect 1 s + read 1 s allowed)"
    errors = Notification.objects.filter(channel__kind=ChannelKind.WEBHOOK).values_list("error", flat=True)
    assert any("did not finish answering within 2 s" in error for error in errors), list(errors)

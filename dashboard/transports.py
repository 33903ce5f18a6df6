"""How an alert event reaches an operator: one small Transport per channel kind (e-mail, JSON webhook)."""

from __future__ import annotations

import contextlib
import http.client
import json
import smtplib
import socket
import threading
import time
from abc import ABC, abstractmethod
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from dashboard import egress
from dashboard.choices import AlertStatus, ChannelKind, NotificationStatus
from dashboard.models import Alert, AlertEvent, Channel

EVIDENCE_LINES_IN_MAIL = 40


GENERIC_FAILURE = "delivery failed"


class TransportError(Exception):
    """A delivery failed. Permanent means retrying cannot help (bad address, 4xx): the channel gets disabled.
    Timed out means the far end took the whole timeout: trying again right away would hold the worker again.
    The message is raw (addresses, errno texts): only admins see it (`shows_raw_errors`)."""

    def __init__(self, message: str, permanent: bool = False, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.timed_out = timed_out


def shows_raw_errors(user: Any) -> bool:
    """Admins see transports' raw errors; to anyone else they would map the network behind the server."""
    return bool(user.is_staff or user.is_superuser)


class Transport(ABC):
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    @abstractmethod
    def notify(self, alert: Alert, event: AlertEvent) -> None:
        """Deliver one state change of `alert`; return on success, raise TransportError on failure."""

    def is_noop(self, event: AlertEvent) -> bool:
        """True if this kind of channel does not report this kind of change (no row is queued for it)."""
        return False

    def rate_limit_reason(self) -> str:
        """Why this channel must not send right now, or "" if it may."""
        return ""


def absolute_url(alert: Alert) -> str:
    return settings.SITE_URL.rstrip("/") + alert.get_absolute_url()


class EmailTransport(Transport):
    """One mail when an alert opens and one when it resolves, at most ALERT_MAIL_LIMIT per window."""

    def is_noop(self, event: AlertEvent) -> bool:
        return event.new_status == AlertStatus.ACKNOWLEDGED

    def rate_limit_reason(self) -> str:
        window = timedelta(seconds=settings.ALERT_MAIL_WINDOW_S)
        limit = settings.ALERT_MAIL_LIMIT
        if self.channel.sent_since(timezone.now() - window) < limit:
            return ""
        return f"rate limit: {limit} mails in the last {window.total_seconds() / 60:g} minutes"

    def notify(self, alert: Alert, event: AlertEvent) -> None:
        message = EmailMessage(
            subject(alert, event),
            self.body(alert, event),
            to=[self.channel.value],
            headers={"Auto-Submitted": "auto-generated", "X-Layercake-Alert": alert.key},
            connection=get_connection(timeout=settings.ALERT_SMTP_TIMEOUT_S),
        )
        try:
            message.send()
        except smtplib.SMTPRecipientsRefused as exc:
            raise refused(exc) from None
        except (smtplib.SMTPException, OSError) as exc:
            where = f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
            raise TransportError(f"mail server {where}: {exc.__class__.__name__}: {exc}") from None

    def body(self, alert: Alert, event: AlertEvent) -> str:
        context = {
            "alert": alert,
            "event": event,
            "url": absolute_url(alert),
            "settings_url": settings.SITE_URL.rstrip("/") + reverse("alert-settings"),
            "log_lines": alert.log_lines()[-EVIDENCE_LINES_IN_MAIL:],
            "skipped": self.skipped_since_last_mail(),
            "lost_nodes": [m["name"] for m in alert.member_nodes() if not m["back_at"]],
        }
        return render_to_string("emails/alert.txt", context)

    def skipped_since_last_mail(self) -> list[Any]:
        """Notifications the rate limit held back since this channel's last mail: summarised in the next one."""
        notifications = self.channel.notifications.select_related("alert", "event")
        last = notifications.filter(status=NotificationStatus.SENT).order_by("-finished").first()
        skipped = notifications.filter(status=NotificationStatus.SKIPPED, error__startswith="rate limit")
        if last is not None:
            skipped = skipped.filter(finished__gt=last.finished)
        return list(skipped.order_by("created"))


def subject(alert: Alert, event: AlertEvent) -> str:
    title = " ".join(alert.title.split())  # a header must not carry newlines
    return f"[layercake] {event.new_status.upper()}: {title}"


def refused(exc: smtplib.SMTPRecipientsRefused) -> TransportError:
    """A 5xx for the address is the channel's fault (unknown user); a 4xx (greylisting, full box) is not."""
    codes = [code for code, _ in exc.recipients.values()]
    detail = "; ".join(
        f"{rcpt}: {code} {msg.decode(errors='replace') if isinstance(msg, bytes) else msg}"
        for rcpt, (code, msg) in exc.recipients.items()
    )
    return TransportError(
        f"the mail server refused the address: {detail}", permanent=all(c >= 500 for c in codes)
    )


class PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to the addresses checked for this request, not to whatever the host resolves to by now."""

    addresses: list[egress.IPAddress]
    connect_timeout: float

    def connect(self) -> None:
        try:
            self.sock = egress.connect(self.addresses, self.port, self.connect_timeout, self.timeout)
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {self.connect_timeout:g} s") from None


class PinnedHTTPSConnection(http.client.HTTPSConnection, PinnedHTTPConnection):
    """TLS over the pinned connection; the certificate is still checked against the URL's host name."""


class ConnectTimeout(OSError):
    pass


class WebhookTransport(Transport):
    """A JSON POST of every state change. 5xx, 429 and refused connections are tried 3 times, a receiver that
    does not answer within the read timeout once (the notification is tried again later); 4xx is permanent.
    Only public addresses are reached (dashboard.egress), and a redirect is reported, never followed."""

    TRIES = 3
    RETRY_DELAYS = (1.0, 3.0)

    def notify(self, alert: Alert, event: AlertEvent) -> None:
        body = json.dumps(webhook_payload(alert, event)).encode()
        for attempt in range(self.TRIES):
            try:
                self.post(body)
                return
            except TransportError as exc:
                if exc.permanent or exc.timed_out or attempt == self.TRIES - 1:
                    raise
                time.sleep(self.RETRY_DELAYS[min(attempt, len(self.RETRY_DELAYS) - 1)])

    def post(self, body: bytes) -> None:
        url = self.channel.value
        connection = pinned_connection(url)
        target = urlsplit(url)
        deadline = TryDeadline(
            connection, settings.WEBHOOK_CONNECT_TIMEOUT_S + settings.WEBHOOK_READ_TIMEOUT_S
        )
        try:
            with deadline:
                connection.request(
                    "POST",
                    (target.path or "/") + (f"?{target.query}" if target.query else ""),
                    body,
                    {"Content-Type": "application/json", "User-Agent": "layercake-alerts"},
                )
                response = connection.getresponse()
                response.read(65536)
            if deadline.expired:  # the cut-off socket can read as a clean end of the headers or the body
                raise deadline.error(url)
        except TimeoutError:
            raise TransportError(
                f"{url} did not answer within {connection.timeout:g} s", timed_out=True
            ) from None
        except (http.client.HTTPException, OSError) as exc:
            if deadline.expired:
                raise deadline.error(url) from None
            raise TransportError(
                f"could not reach {url}: {exc}", timed_out=isinstance(exc, ConnectTimeout)
            ) from None
        finally:
            connection.close()
        if not 200 <= response.status < 300:
            raise http_error(url, response.status, response.reason, response.getheader("Location", "?"))


class TryDeadline:
    """A deadline for one whole try. The socket's read timeout bounds each recv() only: a receiver that sends
    its answer a byte at a time would hold the notify worker for as long as it kept sending. When the deadline
    passes, the socket is shut down, which ends the blocked read at once."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float) -> None:
        self.connection, self.seconds, self.expired = connection, seconds, False
        self.timer = threading.Timer(seconds, self.cut_off)
        self.timer.daemon = True

    def cut_off(self) -> None:
        self.expired = True
        if self.connection.sock is not None:
            with contextlib.suppress(OSError):
                self.connection.sock.shutdown(socket.SHUT_RDWR)

    def error(self, url: str) -> TransportError:
        return TransportError(f"{url} did not finish answering within {self.seconds:g} s", timed_out=True)

    def __enter__(self) -> TryDeadline:
        self.timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.timer.cancel()


def pinned_connection(url: str) -> PinnedHTTPConnection:
    """An HTTP(S) connection to the URL's host that will only connect to its checked addresses."""
    target = urlsplit(url)
    if target.scheme not in ("http", "https") or not target.hostname:
        raise TransportError(f"{url} is not an http:// or https:// URL", permanent=True)
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        addresses = egress.checked_addresses(target.hostname, port)
    except egress.AddressRefused as exc:
        raise TransportError(f"refused to connect: {exc.detail}", permanent=True) from None
    kind = PinnedHTTPSConnection if target.scheme == "https" else PinnedHTTPConnection
    connection = kind(target.hostname, port, timeout=settings.WEBHOOK_READ_TIMEOUT_S)
    connection.addresses, connection.connect_timeout = addresses, settings.WEBHOOK_CONNECT_TIMEOUT_S
    return connection


def http_error(url: str, code: int, reason: str, location: str) -> TransportError:
    if code >= 500 or code == 429:
        return TransportError(f"{url} answered {code} {reason}")
    if 300 <= code < 400:
        return TransportError(f"{url} redirects ({code}) to {location}: enter the final URL", permanent=True)
    return TransportError(f"{url} answered {code} {reason}", permanent=True)


def webhook_payload(alert: Alert, event: AlertEvent) -> dict[str, Any]:
    url = absolute_url(alert)
    return {
        "text": f"[layercake] {event.new_status.upper()}: {alert.title} {url}",
        "alert": {
            **alert.summary(),
            "url": url,
            "cause": alert.cause,
            "remedy": alert.remedy,
            "opened": alert.opened.isoformat(),
            "evidence": alert.evidence,
            "actions": alert.actions,
        },
        "event": {
            "old_status": event.old_status,
            "new_status": event.new_status,
            "reason": event.reason,
            "t": event.t.isoformat(),
        },
    }


TRANSPORTS: dict[str, type[Transport]] = {
    ChannelKind.EMAIL: EmailTransport,
    ChannelKind.WEBHOOK: WebhookTransport,
}


def transport_for(channel: Channel) -> Transport:
    return TRANSPORTS[channel.kind](channel)

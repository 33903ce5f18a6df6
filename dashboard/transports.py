"""How an alert event reaches an operator: one small Transport per channel kind (e-mail, JSON webhook)."""

from __future__ import annotations

import json
import smtplib
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from dashboard.choices import AlertStatus, ChannelKind, NotificationStatus
from dashboard.models import Alert, AlertEvent, Channel

EVIDENCE_LINES_IN_MAIL = 40


class TransportError(Exception):
    """A delivery failed. Permanent means retrying cannot help (bad address, 4xx): the channel gets disabled."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


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
        message = EmailMessage(subject(alert, event), self.body(alert, event), to=[self.channel.value],
                               headers={"Auto-Submitted": "auto-generated", "X-Layercake-Alert": alert.key},
                               connection=get_connection(timeout=settings.ALERT_SMTP_TIMEOUT_S))
        try:
            message.send()
        except smtplib.SMTPRecipientsRefused as exc:
            raise refused(exc) from None
        except (smtplib.SMTPException, OSError) as exc:
            where = f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
            raise TransportError(f"mail server {where}: {exc.__class__.__name__}: {exc}") from None

    def body(self, alert: Alert, event: AlertEvent) -> str:
        context = {"alert": alert, "event": event, "url": absolute_url(alert),
                   "settings_url": settings.SITE_URL.rstrip("/") + reverse("alert-settings"),
                   "log_lines": alert.log_lines()[-EVIDENCE_LINES_IN_MAIL:], "skipped": self.skipped_since_last_mail()}
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
    detail = "; ".join(f"{rcpt}: {code} {msg.decode(errors='replace') if isinstance(msg, bytes) else msg}"
                       for rcpt, (code, msg) in exc.recipients.items())
    return TransportError(f"the mail server refused the address: {detail}", permanent=all(c >= 500 for c in codes))


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would follow a redirect of a POST as a GET without the body; report it instead."""

    def redirect_request(self, req, fp, code, msg, headers, newurl) -> None:
        return None


OPENER = urllib.request.build_opener(NoRedirects)


class WebhookTransport(Transport):
    """A JSON POST of every state change; 5xx, 429 and connection errors are tried 3 times, 4xx is permanent."""

    TRIES = 3
    RETRY_DELAYS = (1.0, 3.0)
    TIMEOUT_S = 10.0

    def notify(self, alert: Alert, event: AlertEvent) -> None:
        body = json.dumps(webhook_payload(alert, event)).encode()
        for attempt in range(self.TRIES):
            try:
                self.post(body)
                return
            except TransportError as exc:
                if exc.permanent or attempt == self.TRIES - 1:
                    raise
                time.sleep(self.RETRY_DELAYS[min(attempt, len(self.RETRY_DELAYS) - 1)])

    def post(self, body: bytes) -> None:
        url = self.channel.value
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "layercake-alerts"})
        try:
            with OPENER.open(request, timeout=self.TIMEOUT_S) as response:
                response.read(65536)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise http_error(url, exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise TransportError(f"could not reach {url}: {getattr(exc, 'reason', exc)}") from None


def http_error(url: str, exc: urllib.error.HTTPError) -> TransportError:
    if exc.code >= 500 or exc.code == 429:
        return TransportError(f"{url} answered {exc.code} {exc.reason}")
    if 300 <= exc.code < 400:
        location = exc.headers.get("Location", "?")
        return TransportError(f"{url} redirects ({exc.code}) to {location}: enter the final URL", permanent=True)
    return TransportError(f"{url} answered {exc.code} {exc.reason}", permanent=True)


def webhook_payload(alert: Alert, event: AlertEvent) -> dict[str, Any]:
    url = absolute_url(alert)
    return {
        "text": f"[layercake] {event.new_status.upper()}: {alert.title} {url}",
        "alert": {**alert.summary(), "url": url, "cause": alert.cause, "remedy": alert.remedy,
                  "opened": alert.opened.isoformat(), "evidence": alert.evidence, "actions": alert.actions},
        "event": {"old_status": event.old_status, "new_status": event.new_status, "reason": event.reason,
                  "t": event.t.isoformat()},
    }


TRANSPORTS: dict[str, type[Transport]] = {ChannelKind.EMAIL: EmailTransport, ChannelKind.WEBHOOK: WebhookTransport}


def transport_for(channel: Channel) -> Transport:
    return TRANSPORTS[channel.kind](channel)

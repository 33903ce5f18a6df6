"""Alerts API for the detection rules, and notification delivery.

The rules call `raise_alert` every time they see a problem and `resolve_alert` when it is over; both are
idempotent per key, so a rule needs no memory of its own. Every state change writes an AlertEvent, queues
one Notification row per subscribed channel, and tells the browsers. Delivery claims those rows one at a
time, so any number of Celery workers can run it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from dashboard.choices import AlertSeverity, AlertStatus, DeploymentState, NotificationStatus
from dashboard.detect import INCIDENT, Problem
from dashboard.jobs import DeliverNotifications, Job
from dashboard.live import FLEET_GROUP
from dashboard.models import Alert, AlertEvent, Channel, Deployment, Node, Notification
from dashboard.transports import TransportError, transport_for

log = logging.getLogger(__name__)
# A transient failure is tried again later as a new Notification row: attempt 2 after 1 minute, 3 after 5.
RETRY_DELAYS = (timedelta(minutes=1), timedelta(minutes=5))
CONTENT_FIELDS = ("kind", "severity", "title", "cause", "remedy", "evidence", "actions", "deployment", "node")


def raise_alert(
    *,
    key: str,
    kind: str,
    title: str,
    cause: str,
    remedy: str,
    severity: str = AlertSeverity.CRITICAL,
    evidence: dict[str, Any] | None = None,
    actions: dict[str, Any] | None = None,
    deployment: Deployment | None = None,
    node: Node | None = None,
    batch: Batch | None = None,
) -> Alert:
    """Open the alert for `key`, or refresh the unresolved one (evidence and text; no event, no mail).
    Notifications of an opened alert are delivered by the caller queuing `batch.jobs()`, else by the beat."""
    content = {
        "kind": kind,
        "severity": severity,
        "title": title,
        "cause": cause,
        "remedy": remedy,
        "evidence": evidence or {},
        "actions": actions or {},
        "deployment": deployment,
        "node": node,
    }
    check_alert_input(key, content)
    existing = Alert.objects.unresolved().filter(key=key).first()
    if existing is not None:
        return refresh(existing, content)
    return open_alert(key, content, batch)


@dataclass
class Batch:
    """State changes made together (one evaluation, or one operator's click): the operators' channels are
    looked up once, and the caller queues one delivery at the end (`jobs`, once committed), not one per alert."""

    channels: list[Channel] | None = None
    notified: bool = False

    def subscribed(self) -> list[Channel]:
        if self.channels is None:
            self.channels = operator_channels()
        return self.channels

    def jobs(self) -> list[Job]:
        return [DeliverNotifications()] if self.notified else []


def open_alert(key: str, content: dict[str, Any], batch: Batch | None = None) -> Alert:
    try:
        with transaction.atomic():
            alert = Alert.objects.create(key=key, **content)
            event = alert.events.create(old_status="", new_status=AlertStatus.OPEN, reason=content["title"])
            changed(alert, event, batch)
        log.info("alert opened: %s (%s)", key, content["title"])
    except IntegrityError:  # another worker opened this key between our lookup and our insert
        return refresh(Alert.objects.unresolved().get(key=key), content)
    return alert


def sync(problems: list[Problem], judged: set[str]) -> list[Job]:
    """Make the alerts match what the rules see now (evaluate_fleet): open an alert for each new problem,
    refresh the ongoing ones, resolve those whose problem is gone. Ongoing problems cost a fixed number of
    queries however many there are (one lookup of every unresolved alert's key, one of the alerts whose
    content is described again, one update of the confirmation time, one bulk update of the alerts whose
    content changed); opening and resolving cost queries per alert. Returns the delivery to queue."""
    unresolved = unresolved_keys()
    now, changed_rows, batch = timezone.now(), [], Batch()
    described = [p for p in problems if not p.settled]  # a settled one keeps its alert's content as it is
    current = Alert.objects.unresolved().filter(key__in=[p.key for p in described if p.key in unresolved])
    alerts = {alert.key: alert for alert in current}
    for problem in described:
        content = problem_content(problem)
        check_alert_input(problem.key, content)
        alert = alerts.get(problem.key)
        if problem.key not in unresolved:  # (a settled one opens on a later run if it was resolved since)
            open_alert(problem.key, content, batch)
        elif alert is not None and differs(alert, content):
            for name, value in content.items():
                setattr(alert, name, value)
            alert.refreshed = now
            changed_rows.append(alert)
    Alert.objects.bulk_update(changed_rows, [*CONTENT_FIELDS, "refreshed"])
    ongoing = [unresolved[p.key].pk for p in problems if p.key in unresolved]
    Alert.objects.filter(pk__in=ongoing).update(refreshed=now)
    found = {p.key for p in problems}
    for row in unresolved.values():
        reason = resolution(row, found, judged)
        if reason:
            resolve_alert(row.key, reason, batch)
    return batch.jobs()


@dataclass(frozen=True)
class UnresolvedKey:
    """What `sync` reads of every unresolved alert: a row, not the alert with its evidence."""

    pk: int
    key: str
    kind: str
    deployment_id: str | None
    deployment_state: str | None


def unresolved_keys() -> dict[str, UnresolvedKey]:
    rows = Alert.objects.unresolved().values_list("pk", "key", "kind", "deployment_id", "deployment__state")
    return {row[1]: UnresolvedKey(*row) for row in rows}


def problem_content(p: Problem) -> dict[str, Any]:
    return {
        "kind": p.kind,
        "severity": p.severity,
        "title": p.title,
        "cause": p.cause,
        "remedy": p.remedy,
        "evidence": p.evidence or {},
        "actions": p.actions or {},
        "deployment": p.deployment,
        "node": p.node,
    }


def differs(alert: Alert, content: dict[str, Any]) -> bool:
    for name, value in content.items():
        if name in ("deployment", "node"):
            if getattr(alert, f"{name}_id") != (value.pk if value is not None else None):
                return True
        elif getattr(alert, name) != value:
            return True
    return False


def resolution(alert: UnresolvedKey, found: set[str], judged: set[str]) -> str | None:
    """Why the unresolved `alert` is over, or None while its problem may still be there."""
    if alert.key in found:
        return None
    if alert.deployment_id and alert.deployment_state == DeploymentState.STOPPED:
        return "the deployment was stopped"
    if alert.kind == INCIDENT and f"{INCIDENT}:" in judged:
        return "every node of the incident reports again"
    parts = alert.key.split(":")
    if alert.key in judged or any(":".join(parts[:n]) + ":" in judged for n in range(1, len(parts))):
        return "the condition cleared"
    return None


def resolve_alert(key: str, reason: str, batch: Batch | None = None) -> Alert | None:
    """Resolve the unresolved alert for `key`; None if there is none (already resolved or never raised)."""
    alert = Alert.objects.unresolved().filter(key=key).first()
    if alert is None:
        return None
    with transaction.atomic():
        event = alert.move_to(AlertStatus.RESOLVED, reason, resolved=timezone.now())
        if event is not None:
            changed(alert, event, batch)
            log.info("alert resolved: %s (%s)", key, reason)
    return alert if alert.status == AlertStatus.RESOLVED else None


def open_alerts(kind: str | None = None) -> QuerySet[Alert]:
    """Alerts not resolved yet (open or acknowledged), newest first; only those of `kind` if given."""
    alerts = Alert.objects.unresolved().select_related("deployment", "node")
    return alerts.filter(kind=kind) if kind else alerts


def acknowledge(alert: Alert, user: Any, batch: Batch | None = None) -> AlertEvent | None:
    """An operator is on it: the alert stays until resolved but stops asking. None if it was not open."""
    with transaction.atomic():
        event = alert.move_to(
            AlertStatus.ACKNOWLEDGED,
            f"acknowledged by {user.get_username()}",
            acknowledged=timezone.now(),
            acknowledged_by=user,
        )
        if event is not None:
            changed(alert, event, batch)
    return event


def check_alert_input(key: str, content: dict[str, Any]) -> None:
    if not key or len(key) > 200:
        raise ValueError(f"alert key must be 1-200 characters, not {key!r}")
    for name in ("kind", "title", "cause", "remedy"):
        if not isinstance(content[name], str) or not content[name].strip():
            raise ValueError(f"alert {key}: {name} must be a non-empty string, not {content[name]!r}")
    if content["severity"] not in dict(AlertSeverity.choices()):
        raise ValueError(
            f"alert {key}: severity {content['severity']!r} is not one of {list(dict(AlertSeverity.choices()))}"
        )
    for name in ("evidence", "actions"):
        if not isinstance(content[name], dict):
            raise ValueError(f"alert {key}: {name} must be a dict, not {type(content[name]).__name__}")
        try:
            json.dumps(content[name])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"alert {key}: {name} must be plain JSON: {exc}") from None


def refresh(alert: Alert, content: dict[str, Any]) -> Alert:
    """The rule still sees the problem: keep its latest evidence and wording, leave status and history alone."""
    now = timezone.now()
    Alert.objects.filter(pk=alert.pk).update(refreshed=now, **content)
    for name, value in content.items():
        setattr(alert, name, value)
    alert.refreshed = now
    return alert


def changed(alert: Alert, event: AlertEvent, batch: Batch | None = None) -> None:
    """After a state change: queue the notifications (the batch's jobs deliver them; without a batch, the beat
    sweep does), then (once committed) tell the browsers."""
    rows = queue_notifications(alert, event, batch.subscribed() if batch else operator_channels())
    if batch is not None:
        batch.notified = batch.notified or bool(rows)
    summary = alert.summary()
    transaction.on_commit(lambda: announce(summary))


def operator_channels() -> list[Channel]:
    Channel.ensure_operator_emails()
    return list(Channel.subscribed())


def queue_notifications(alert: Alert, event: AlertEvent, channels: list[Channel]) -> list[Notification]:
    rows = [
        Notification(alert=alert, event=event, channel=channel)
        for channel in channels
        if not transport_for(channel).is_noop(event)
    ]
    return Notification.objects.bulk_create(rows)


def announce(summary: dict[str, Any]) -> None:
    """Browsers update the banner and the alert pages without a reload (fleet.alert over /ws/fleet/)."""
    try:
        async_to_sync(get_channel_layer().group_send)(FLEET_GROUP, {"type": "fleet.alert", "alert": summary})
    except (RedisError, OSError) as exc:
        log.warning("could not announce alert %s: %s", summary["id"], exc)


def deliver_pending(limit: int = 100) -> int:
    """Deliver due notifications one claimed row at a time; return how many rows this worker handled."""
    handled = 0
    while handled < limit and (notification := Notification.claim_next()) is not None:
        deliver(notification)
        handled += 1
    return handled


def deliver(notification: Notification) -> None:
    channel, transport = notification.channel, transport_for(notification.channel)
    reason = skip_reason(notification) or transport.rate_limit_reason()
    if reason:
        notification.finish(NotificationStatus.SKIPPED, reason)
        return
    started = time.monotonic()
    try:
        transport.notify(notification.alert, notification.event)
    except TransportError as exc:
        failed(notification, exc, time.monotonic() - started)
        return
    notification.finish(NotificationStatus.SENT, duration=time.monotonic() - started)
    channel.record_outcome()


def skip_reason(notification: Notification) -> str:
    if not notification.channel.enabled:  # the reason may be a raw transport error: not repeated here
        return "channel disabled" + (
            " after a failed delivery" if notification.channel.disabled_reason else ""
        )
    if notification.attempt > 1 and notification.alert.status != notification.event.new_status:
        return f"superseded: the alert is {notification.alert.status} now"  # a late retry would mislead
    return ""


def failed(notification: Notification, exc: TransportError, duration: float) -> None:
    notification.finish(NotificationStatus.FAILED, exc.message, duration)
    notification.channel.record_outcome(exc.message)
    if exc.permanent:
        notification.channel.disable(
            f"{exc.message} (permanent error on {timezone.now():%Y-%m-%d %H:%M} UTC)"
        )
    elif notification.attempt <= len(RETRY_DELAYS):
        notification.retry_later(RETRY_DELAYS[notification.attempt - 1])

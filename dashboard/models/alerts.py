"""Alerts, their state-change history, the operators' notification channels and every delivery attempt."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from dashboard.choices import AlertSeverity, AlertStatus, ChannelKind, NotificationStatus
from dashboard.models.deployments import Deployment
from dashboard.models.fleet import Node
from dashboard.roles import ROLE_NAMES

# A worker that claimed a notification and died leaves it "sending"; after this long another may take it.
CLAIM_TIMEOUT = timedelta(minutes=5)
ALLOWED_MOVES = {
    AlertStatus.OPEN: (AlertStatus.ACKNOWLEDGED, AlertStatus.RESOLVED),
    AlertStatus.ACKNOWLEDGED: (AlertStatus.RESOLVED,),
}


class AlertQuerySet(models.QuerySet):
    def unresolved(self) -> AlertQuerySet:
        return self.filter(status__in=AlertStatus.UNRESOLVED)


class Alert(models.Model):
    """One problem, from the moment a rule sees it until it is over. At most one unresolved alert per key."""

    key = models.CharField(max_length=200, help_text='dedupe key, e.g. "stall:<deployment id>"')
    kind = models.CharField(max_length=40)
    severity = models.CharField(
        max_length=10, choices=AlertSeverity.choices(), default=AlertSeverity.CRITICAL
    )
    status = models.CharField(max_length=12, choices=AlertStatus.choices(), default=AlertStatus.OPEN)
    title = models.CharField(max_length=300)
    cause = models.TextField()
    remedy = models.TextField()
    evidence = models.JSONField(default=dict, blank=True)
    actions = models.JSONField(default=dict, blank=True)
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    opened = models.DateTimeField(default=timezone.now)
    refreshed = models.DateTimeField(default=timezone.now, help_text="the rule last confirmed the problem")
    acknowledged = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    resolved = models.DateTimeField(null=True, blank=True)

    objects = AlertQuerySet.as_manager()

    class Meta:
        ordering = ["-opened", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"], condition=~Q(status=AlertStatus.RESOLVED), name="alert_key_unresolved"
            )
        ]
        indexes = [models.Index(fields=["status", "kind"], name="alert_status_kind")]

    def __str__(self) -> str:
        return f"{self.status_label()}: {self.title}"

    def get_absolute_url(self) -> str:
        return reverse("alert", args=[self.pk])

    def status_label(self) -> str:
        return AlertStatus.label(self.status)

    def severity_label(self) -> str:
        return AlertSeverity.label(self.severity)

    @property
    def is_unresolved(self) -> bool:
        return self.status in AlertStatus.UNRESOLVED

    def log_lines(self) -> list[str]:
        """evidence["log"]: the log lines around the onset, as the rule passed them."""
        return [str(line) for line in (self.evidence or {}).get("log", [])]

    def member_nodes(self) -> list[dict[str, Any]]:
        """evidence["nodes"] of an incident grouping many lost nodes: {"id", "name", "lost_at", "back_at"} each."""
        return list((self.evidence or {}).get("nodes", []))

    def replan_fields(self) -> dict[str, Any] | None:
        return (self.actions or {}).get("replan")

    def summary(self) -> dict[str, Any]:
        """What browsers and webhooks get: enough to show and link the alert, not the evidence."""
        return {
            "id": self.pk,
            "key": self.key,
            "kind": self.kind,
            "severity": self.severity,
            "status": self.status,
            "title": self.title,
            "url": self.get_absolute_url(),
            "deployment": self.deployment_id,
            "node": self.node.name if self.node else None,
        }

    def move_to(self, status: str, reason: str, **fields: Any) -> AlertEvent | None:
        """Change status once, even with several workers racing; None if the move is not (or no longer) allowed."""
        old = self.status
        if status not in ALLOWED_MOVES.get(old, ()):
            return None
        if Alert.objects.filter(pk=self.pk, status=old).update(status=status, **fields) != 1:
            self.refresh_from_db()
            return None
        self.status = status
        for name, value in fields.items():
            setattr(self, name, value)
        return self.events.create(old_status=old, new_status=status, reason=reason)


class AlertEvent(models.Model):
    """One state change of an alert (opened, acknowledged, resolved): the history and what gets notified."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    t = models.DateTimeField(default=timezone.now)
    old_status = models.CharField(max_length=12, blank=True, choices=AlertStatus.choices())
    new_status = models.CharField(max_length=12, choices=AlertStatus.choices())
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["t", "pk"]

    def __str__(self) -> str:
        return f"alert {self.alert_id}: {self.old_status or 'new'} -> {self.new_status}"

    def new_status_label(self) -> str:
        return AlertStatus.label(self.new_status)


class Channel(models.Model):
    """Where one operator wants alerts: their e-mail address (made for them) or a webhook they added."""

    kind = models.CharField(max_length=10, choices=ChannelKind.choices())
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_channels"
    )
    value = models.CharField(max_length=500, help_text="e-mail address or webhook URL")
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    last_notify = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["owner", "kind", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner"], condition=Q(kind=ChannelKind.EMAIL), name="one_email_channel_per_operator"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.value}"

    def kind_label(self) -> str:
        return ChannelKind.label(self.kind)

    @classmethod
    def ensure_operator_emails(cls) -> None:
        """Every active user with an address and a role (or staff status) has an e-mail channel (on unless
        they turned it off)."""
        staff = (
            get_user_model()
            .objects.filter(Q(is_staff=True) | Q(groups__name__in=ROLE_NAMES), is_active=True)
            .exclude(email="")
            .distinct()
        )
        for user in staff:
            channel, _ = cls.objects.get_or_create(
                owner=user, kind=ChannelKind.EMAIL, defaults={"value": user.email}
            )
            if channel.value != user.email:  # the address follows the account
                cls.objects.filter(pk=channel.pk).update(value=user.email)

    @classmethod
    def subscribed(cls) -> models.QuerySet[Channel]:
        return cls.objects.filter(enabled=True, owner__is_active=True).select_related("owner")

    def disable(self, reason: str) -> None:
        self.enabled, self.disabled_reason = False, reason
        self.save(update_fields=["enabled", "disabled_reason"])

    def enable(self) -> None:
        self.enabled, self.disabled_reason, self.last_error = True, "", ""
        self.save(update_fields=["enabled", "disabled_reason", "last_error"])

    def record_outcome(self, error: str = "") -> None:
        """Keep the last delivery time and error without overwriting a concurrent enable or disable."""
        self.last_notify, self.last_error = timezone.now(), error
        Channel.objects.filter(pk=self.pk).update(last_notify=self.last_notify, last_error=error)

    def sent_since(self, since: datetime) -> int:
        return self.notifications.filter(status=NotificationStatus.SENT, finished__gte=since).count()


class NotificationQuerySet(models.QuerySet):
    def claimable(self, now: datetime) -> NotificationQuerySet:
        pending = Q(status=NotificationStatus.PENDING, not_before__lte=now)
        abandoned = Q(status=NotificationStatus.SENDING, claimed__lt=now - CLAIM_TIMEOUT)
        return self.filter(pending | abandoned)


class Notification(models.Model):
    """One delivery attempt of one alert event to one channel. Pending rows are the work queue."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    event = models.ForeignKey(AlertEvent, on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="notifications")
    created = models.DateTimeField(default=timezone.now)
    not_before = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveSmallIntegerField(default=1)
    status = models.CharField(
        max_length=10, choices=NotificationStatus.choices(), default=NotificationStatus.PENDING
    )
    claimed = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds the transport took")

    objects = NotificationQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-pk"]
        indexes = [
            models.Index(
                fields=["not_before"],
                name="notification_unfinished",
                condition=Q(status__in=[NotificationStatus.PENDING, NotificationStatus.SENDING]),
            )
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.channel}: {self.status}"

    @property
    def ok(self) -> bool:
        return self.status == NotificationStatus.SENT

    def status_label(self) -> str:
        return NotificationStatus.label(self.status)

    @classmethod
    def claim_next(cls) -> Notification | None:
        """Take the oldest due row for this worker alone: a conditional UPDATE that only one worker wins."""
        now = timezone.now()
        for pk in cls.objects.claimable(now).order_by("not_before", "pk").values_list("pk", flat=True)[:10]:
            won = (
                cls.objects.claimable(now)
                .filter(pk=pk)
                .update(status=NotificationStatus.SENDING, claimed=now)
            )
            if won == 1:
                return cls.objects.select_related("alert", "event", "channel").get(pk=pk)
        return None

    def finish(self, status: str, error: str = "", duration: float | None = None) -> None:
        self.status, self.error, self.duration, self.finished = status, error, duration, timezone.now()
        self.save(update_fields=["status", "error", "duration", "finished"])

    def retry_later(self, delay: timedelta) -> Notification:
        return Notification.objects.create(
            alert=self.alert,
            event=self.event,
            channel=self.channel,
            attempt=self.attempt + 1,
            not_before=timezone.now() + delay,
        )

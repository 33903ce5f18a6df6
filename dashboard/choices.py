"""Status vocabularies, each defined once with its label and the color the UI and e-mails use."""

from __future__ import annotations

from typing import get_args

from agents.protocol import ReportedState


class ChoiceSet:
    CHOICES: list[tuple[str, str, str]] = []

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        return [(value, label) for value, label, _ in cls.CHOICES]

    @classmethod
    def color(cls, value: str) -> str:
        return next((color for v, _, color in cls.CHOICES if v == value), "gray")

    @classmethod
    def label(cls, value: str) -> str:
        return next((label for v, label, _ in cls.CHOICES if v == value), value)


class NodeStatus(ChoiceSet):
    NEW = "new"
    ONLINE = "online"
    STALE = "stale"
    OFFLINE = "offline"
    CHOICES = [
        (NEW, "Never connected", "gray"),
        (ONLINE, "Online", "green"),
        (STALE, "Stale", "orange"),
        (OFFLINE, "Offline", "red"),
    ]


class LinkClass(ChoiceSet):
    """Link labels as nvidia-smi prints them, strongest first; the color is the grid cell's."""

    CHOICES = [
        ("NV", "NVLink (bonded set of # links)", "#1b7f3b"),
        ("PIX", "At most one PCIe bridge (P2P)", "#4caf50"),
        ("PXB", "Several PCIe bridges, no host bridge (P2P)", "#8bc34a"),
        ("PHB", "Through a PCIe host bridge (the CPU)", "#ffc107"),
        ("NODE", "Across host bridges within a NUMA node", "#ff9800"),
        ("SYS", "Across NUMA nodes (QPI/UPI/SMP interconnect)", "#ef5350"),
        ("SOC", "Across CPU sockets (old name of SYS)", "#ef5350"),
        ("X", "Self", "#9e9e9e"),
    ]

    @classmethod
    def of(cls, label: str) -> str:
        """The class of a printed label: NV12 -> NV, everything else as printed."""
        return "NV" if label.startswith("NV") and label[2:].isdigit() else label


class PlanStatus(ChoiceSet):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CHOICES = [
        (QUEUED, "Queued", "gray"),
        (RUNNING, "Planning", "blue"),
        (DONE, "Planned", "green"),
        (FAILED, "Failed", "red"),
    ]


class DeploymentState(ChoiceSet):
    """Every state the dashboard records: what an agent reports (agents.protocol.ReportedState) plus SERVER_ONLY."""

    PLANNED = "planned"
    LAUNCHING = "launching"
    LOADING = "loading"
    READY = "ready"
    SERVING = "serving"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    CHOICES = [
        (PLANNED, "Planned", "gray"),
        (LAUNCHING, "Launching", "blue"),
        (LOADING, "Loading", "blue"),
        (READY, "Ready", "teal"),
        (SERVING, "Serving", "green"),
        (STOPPING, "Stopping", "orange"),
        (STOPPED, "Stopped", "gray"),
        (FAILED, "Failed", "red"),
    ]
    # The agent should be running a process for these; a reconnecting agent is told to again.
    ACTIVE = (LAUNCHING, LOADING, READY, SERVING)
    # The server's own steps, which no agent reports: planned before any launch, stopping until the agent says stopped.
    SERVER_ONLY = (PLANNED, STOPPING)
    REPORTED: tuple[str, ...] = get_args(ReportedState)


class DesiredState(ChoiceSet):
    """What the operator asked of a deployment (Deployment.desired), whatever state it is in now: one asked to
    stop is never launched again by a retry, a resend or a reconnecting agent."""

    RUNNING = "running"
    STOPPED = "stopped"
    CHOICES = [
        (RUNNING, "Running", "green"),
        (STOPPED, "Stopped", "gray"),
    ]


class AlertStatus(ChoiceSet):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"
    CHOICES = [
        (OPEN, "Open", "red"),
        (ACKNOWLEDGED, "Acknowledged", "orange"),
        (RESOLVED, "Resolved", "green"),
    ]
    UNRESOLVED = (OPEN, ACKNOWLEDGED)


class AlertSeverity(ChoiceSet):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
    CHOICES = [
        (CRITICAL, "Critical", "red"),
        (WARNING, "Warning", "orange"),
        (INFO, "Info", "blue"),
    ]


class ChannelKind(ChoiceSet):
    EMAIL = "email"
    WEBHOOK = "webhook"
    CHOICES = [
        (EMAIL, "E-mail", "gray"),
        (WEBHOOK, "Webhook", "gray"),
    ]


class NotificationStatus(ChoiceSet):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    SKIPPED = "skipped"
    CHOICES = [
        (PENDING, "Pending", "gray"),
        (SENDING, "Sending", "blue"),
        (SENT, "Sent", "green"),
        (FAILED, "Failed", "red"),
        (SKIPPED, "Skipped", "orange"),
    ]

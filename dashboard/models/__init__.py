"""Fleet models (nodes, tokens, GPUs, links, samples), deployment models and alert models."""

from dashboard.models.alerts import Alert, AlertEvent, Channel, Notification
from dashboard.models.deployments import (
    Deployment,
    DeploymentEvent,
    DeploymentMember,
    DeploymentMetric,
    PlanRequest,
)
from dashboard.models.fleet import (
    AgentToken,
    Gpu,
    GpuHour,
    GpuMinute,
    GpuSample,
    Link,
    LogChunk,
    Node,
    RollupRun,
)
from dashboard.models.leases import TaskLease

__all__ = [
    "AgentToken",
    "Alert",
    "AlertEvent",
    "Channel",
    "Deployment",
    "DeploymentEvent",
    "DeploymentMember",
    "DeploymentMetric",
    "Gpu",
    "GpuHour",
    "GpuMinute",
    "GpuSample",
    "Link",
    "LogChunk",
    "Node",
    "Notification",
    "PlanRequest",
    "RollupRun",
    "TaskLease",
]

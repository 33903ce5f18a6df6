"""Fleet models (nodes, tokens, GPUs, links, samples), deployment models (and their measurements), alert models."""

from dashboard.models.alerts import Alert, AlertEvent, Channel, Notification
from dashboard.models.api_tokens import ApiToken
from dashboard.models.deployments import (
    CanaryProbe,
    Deployment,
    DeploymentEvent,
    DeploymentHour,
    DeploymentLoadTest,
    DeploymentMember,
    DeploymentMetric,
    MetricRollupMark,
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
    NodeModel,
    RollupRun,
)
from dashboard.models.leases import RateCount, TaskLease
from dashboard.models.measurements import DeploymentMeasurement

__all__ = [
    "AgentToken",
    "Alert",
    "ApiToken",
    "AlertEvent",
    "CanaryProbe",
    "Channel",
    "Deployment",
    "DeploymentEvent",
    "DeploymentMeasurement",
    "DeploymentLoadTest",
    "DeploymentMember",
    "DeploymentHour",
    "DeploymentMetric",
    "Gpu",
    "GpuHour",
    "GpuMinute",
    "GpuSample",
    "Link",
    "LogChunk",
    "MetricRollupMark",
    "Node",
    "NodeModel",
    "Notification",
    "PlanRequest",
    "RollupRun",
    "RateCount",
    "TaskLease",
]

"""Fleet models (nodes, tokens, GPUs, links, samples), deployment models and alert models."""

from dashboard.models.alerts import Alert, AlertEvent, Channel, Notification
from dashboard.models.deployments import (
    Deployment,
    DeploymentEvent,
    DeploymentLoadTest,
    DeploymentMember,
    DeploymentMetric,
    PlanRequest,
)
from dashboard.models.fleet import AgentToken, Gpu, GpuSample, Link, LogChunk, Node

__all__ = [
    "AgentToken",
    "Alert",
    "AlertEvent",
    "Channel",
    "Deployment",
    "DeploymentEvent",
    "DeploymentLoadTest",
    "DeploymentMember",
    "DeploymentMetric",
    "Gpu",
    "GpuSample",
    "Link",
    "LogChunk",
    "Node",
    "Notification",
    "PlanRequest",
]

"""Fleet models (nodes, tokens, GPUs, links, samples), deployment models and alert models."""

from dashboard.models.alerts import Alert, AlertEvent, Channel, Notification
from dashboard.models.api_tokens import ApiToken
from dashboard.models.deployments import (
    Deployment,
    DeploymentEvent,
    DeploymentMember,
    DeploymentMetric,
    PlanRequest,
)
from dashboard.models.fleet import AgentToken, Gpu, GpuSample, Link, LogChunk, Node

__all__ = [
    "AgentToken",
    "Alert",
    "ApiToken",
    "AlertEvent",
    "Channel",
    "Deployment",
    "DeploymentEvent",
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

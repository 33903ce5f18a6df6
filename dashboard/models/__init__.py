"""Fleet models (nodes, tokens, GPUs, links, samples) and deployment models."""

from dashboard.models.deployments import Deployment, DeploymentEvent, DeploymentMetric, PlanRequest
from dashboard.models.fleet import AgentToken, Gpu, GpuSample, Link, LogChunk, Node

__all__ = ["AgentToken", "Deployment", "DeploymentEvent", "DeploymentMetric", "Gpu", "GpuSample", "Link",
           "LogChunk", "Node", "PlanRequest"]

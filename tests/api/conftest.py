"""The API tests' world: the seed node with samples and a model its agent reported, a finished plan, a
deployment with a Measure run, an open alert, an agent token, people in each role with API tokens of each
scope. Queued tasks are recorded, not sent."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.contrib.auth.models import AbstractBaseUser
from django.test import Client
from django.utils import timezone

from dashboard import alerts, deploy, roles, tasks
from dashboard.models import (
    AgentToken,
    Alert,
    ApiToken,
    Deployment,
    DeploymentLoadTest,
    GpuSample,
    Node,
    NodeModel,
    PlanRequest,
)
from tests.personas import person, seed_server

MODEL = "Qwen3-VL-32B-Instruct"


@dataclass
class World:
    node: Node
    plan: PlanRequest
    deployment: Deployment
    alert: Alert
    agent_token: AgentToken
    people: dict[str, AbstractBaseUser]
    queued: list[tuple[str, object]] = field(default_factory=list)

    def token(self, role: str, scope: str = "operate", days: int = 30) -> str:
        return ApiToken.issue(self.people[role], f"{role} {scope}", scope, days)[1]

    def client(self, role: str, scope: str = "operate") -> Client:
        return Client(HTTP_AUTHORIZATION=f"Bearer {self.token(role, scope)}")


@pytest.fixture(autouse=True)
def quick_settings(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def add_samples(node: Node, count: int = 6, used_mib: float = 200.0) -> None:
    """`count` samples per GPU, one a second, ending now; `used_mib` held by other processes (1 GiB: busy)."""
    now = timezone.now()
    for gpu in node.gpus.all():
        for i in range(count):
            GpuSample.objects.create(
                gpu=gpu,
                t=now - timedelta(seconds=count - i),
                seq=i + 1,
                util_gpu=10.0 * i,
                util_mem=5.0,
                mem_used_mib=used_mib + i,
                mem_free_mib=24000.0 - used_mib - i,
                temp_c=40.0,
                power_w=100.0,
                sm_clock_mhz=1400.0,
            )


def add_reported_model(node: Node) -> NodeModel:
    """A GGUF file the node's agent found in its --model-dir, as a hello stores it."""
    return NodeModel.objects.create(
        node=node,
        path="/models/Qwen3-8B-Q4_K_M.gguf",
        name="Qwen3 8B",
        format="gguf",
        architecture="qwen3",
        quantization="Q4_K_M",
        size_bytes=5_027_783_488,
        size_label="8B",
    )


def add_load_test(deployment: Deployment, request: str, per_stream: float = 12.5) -> DeploymentLoadTest:
    """A finished Measure run at two streams (what the agent's result records)."""
    return DeploymentLoadTest.objects.create(
        deployment=deployment,
        request=request,
        status=DeploymentLoadTest.DONE,
        streams=2,
        max_tokens=64,
        backend="simulated",
        predicted_tok_s=25.0,
        completed=2,
        tokens=128,
        seconds=128 / (2 * per_stream),
        tok_s_per_stream=per_stream,
        tok_s_total=2 * per_stream,
        ttft_s=0.05,
        itl_s=1 / per_stream,
    )


@pytest.fixture
def world(db, monkeypatch) -> World:
    people = {role: person(role, role) for role in roles.ROLE_NAMES}
    node = seed_server()
    add_samples(node)
    plan = deploy.run_plan_request(PlanRequest.objects.create(model_ref=MODEL, max_model_len=10000).pk)
    deployment = deploy.create_deployment(plan, 0, people[roles.OPERATOR])
    add_reported_model(node)
    add_load_test(deployment, "first")
    alert = alerts.raise_alert(
        key="stall:x",
        kind="stall",
        title="no tokens",
        cause="c",
        remedy="r",
        evidence={"log": ["a line"]},
        node=node,
        deployment=deployment,
    )
    built = World(node, plan, deployment, alert, AgentToken.issue(node)[0], people)
    for name in ("plan_request", "launch_deployment", "stop_deployment", "restart_deployment"):
        monkeypatch.setattr(
            getattr(tasks, name), "delay", lambda pk, name=name: built.queued.append((name, pk))
        )
    monkeypatch.setattr(tasks, "enqueue", lambda jobs: built.queued.extend(("enqueue", j) for j in jobs))
    return built

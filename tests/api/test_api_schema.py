"""The generated OpenAPI schema is valid, and every operation answers as it says (successes and errors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.test import Client
from openapi_core import OpenAPI
from openapi_core.contrib.django import DjangoOpenAPIRequest, DjangoOpenAPIResponse
from openapi_spec_validator import validate

from dashboard import roles
from dashboard.models import Deployment
from tests.api.conftest import MODEL, World

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Call:
    method: str
    template: str  # the schema's path
    url: Callable[[World], str]
    body: Callable[[World], dict] | None = None
    status: int = 200
    role: str = roles.ADMIN


def fixed(url: str) -> Callable[[World], str]:
    return lambda w: url


CALLS = [
    Call("get", "/api/v1/nodes/", fixed("/api/v1/nodes/?gpu_model=A30&simulated=true&stale=false")),
    Call("get", "/api/v1/nodes/", fixed("/api/v1/nodes/?state=sideways"), status=422),
    Call("get", "/api/v1/nodes/{name}/", fixed("/api/v1/nodes/a30-seed/")),
    Call("get", "/api/v1/nodes/{name}/", fixed("/api/v1/nodes/nowhere/"), status=404),
    Call(
        "get",
        "/api/v1/nodes/{name}/history/",
        fixed("/api/v1/nodes/a30-seed/history/?minutes=5&step=2&gpus=0,1"),
    ),
    Call("get", "/api/v1/nodes/{name}/history/", fixed("/api/v1/nodes/a30-seed/history/?gpus=x"), status=422),
    Call("post", "/api/v1/plans/", fixed("/api/v1/plans/"), lambda w: {"model": MODEL}, status=202),
    Call(
        "post", "/api/v1/plans/", fixed("/api/v1/plans/"), lambda w: {"model": MODEL, "gpus": "a"}, status=422
    ),
    Call("get", "/api/v1/plans/{plan_id}/", lambda w: f"/api/v1/plans/{w.plan.pk}/"),
    Call(
        "post",
        "/api/v1/check/",
        fixed("/api/v1/check/"),
        lambda w: {
            "command": f"vllm serve {MODEL} --tensor-parallel-size 2 --max-model-len 8192",
            "visible": "0,1",
        },
    ),
    Call("post", "/api/v1/check/", fixed("/api/v1/check/"), lambda w: {"command": "sleep 5"}, status=422),
    Call("get", "/api/v1/models/", fixed("/api/v1/models/?limit=200")),
    Call("get", "/api/v1/models/", fixed("/api/v1/models/?node=a30-seed")),
    Call("get", "/api/v1/models/", fixed("/api/v1/models/?node=nowhere"), status=404),
    Call("get", "/api/v1/deployments/", fixed("/api/v1/deployments/?state=planned&node=a30-seed")),
    Call("get", "/api/v1/deployments/{deployment_id}/", lambda w: f"/api/v1/deployments/{w.deployment.pk}/"),
    Call(
        "post",
        "/api/v1/deployments/",
        fixed("/api/v1/deployments/"),
        lambda w: {"plan_request": w.plan.pk, "number": 0},
        status=202,
    ),
    Call(
        "post",
        "/api/v1/deployments/",
        fixed("/api/v1/deployments/"),
        lambda w: {"plan_request": w.plan.pk, "number": 99},
        status=409,
    ),
    Call(
        "post",
        "/api/v1/deployments/{deployment_id}/stop/",
        lambda w: f"/api/v1/deployments/{w.deployment.pk}/stop/",
        status=202,
    ),
    Call(
        "post",
        "/api/v1/deployments/{deployment_id}/restart/",
        lambda w: f"/api/v1/deployments/{w.deployment.pk}/restart/",
        status=202,
    ),
    Call(
        "delete",
        "/api/v1/deployments/{deployment_id}/",
        lambda w: f"/api/v1/deployments/{w.deployment.pk}/",
        status=409,
    ),
    Call("get", "/api/v1/alerts/", fixed("/api/v1/alerts/?status=unresolved&kind=stall&node=a30-seed")),
    Call("get", "/api/v1/alerts/{alert_id}/", lambda w: f"/api/v1/alerts/{w.alert.pk}/"),
    Call(
        "post",
        "/api/v1/alerts/{alert_id}/acknowledge/",
        lambda w: f"/api/v1/alerts/{w.alert.pk}/acknowledge/",
    ),
    Call("get", "/api/v1/agent-tokens/", fixed("/api/v1/agent-tokens/?node=a30-seed")),
    Call("get", "/api/v1/agent-tokens/", fixed("/api/v1/agent-tokens/"), status=403, role=roles.OPERATOR),
    Call(
        "post",
        "/api/v1/agent-tokens/",
        fixed("/api/v1/agent-tokens/"),
        lambda w: {"node": "gpu-node-9"},
        status=201,
    ),
    Call(
        "post",
        "/api/v1/agent-tokens/",
        fixed("/api/v1/agent-tokens/"),
        lambda w: {"node": "bad name!"},
        status=422,
    ),
    Call(
        "post",
        "/api/v1/agent-tokens/{token_id}/revoke/",
        lambda w: f"/api/v1/agent-tokens/{w.agent_token.pk}/revoke/",
    ),
]


def schema(client: Client) -> dict:
    response = client.get("/api/v1/schema/")
    assert response.status_code == 200
    return response.json()


def operations(spec: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in spec["paths"].items() for method in item}


def test_it_serves_a_valid_openapi_schema(client):
    spec = schema(client)
    validate(spec)  # raises naming the first problem
    assert spec["openapi"].startswith("3.") and spec["info"]["version"] == "1"
    assert all(path.startswith("/api/v1/") for path in spec["paths"])


def test_it_answers_every_operation_as_the_schema_says(world, client):
    spec = schema(client)
    openapi = OpenAPI.from_dict(spec)
    for call in CALLS:
        response = send(world.client(call.role), call, world)
        assert response.status_code == call.status, (call, response.content[:500])
        openapi.validate_response(
            DjangoOpenAPIRequest(response.wsgi_request), DjangoOpenAPIResponse(response)
        )
    assert operations(spec) == {(c.method, c.template) for c in CALLS}


def test_it_deletes_a_stopped_deployment_as_the_schema_says(world, client):
    openapi = OpenAPI.from_dict(schema(client))
    Deployment.objects.filter(pk=world.deployment.pk).update(state="stopped")
    call = Call("delete", "", lambda w: f"/api/v1/deployments/{w.deployment.pk}/", status=204)
    response = send(world.client(roles.OPERATOR), call, world)
    assert response.status_code == 204, response.content
    openapi.validate_response(DjangoOpenAPIRequest(response.wsgi_request), DjangoOpenAPIResponse(response))
    assert not Deployment.objects.filter(pk=world.deployment.pk).exists()


def send(client: Client, call: Call, world: World):
    kwargs = (
        {}
        if call.body is None
        else {"data": json.dumps(call.body(world)), "content_type": "application/json"}
    )
    return getattr(client, call.method)(call.url(world), **kwargs)

"""API auth: a wrong, expired or revoked token gets 401, a token without the scope or a user without the role
gets 403, and none of them changes anything; the same request with the right token does change it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboard import roles
from dashboard.models import AgentToken, Alert, ApiToken, Deployment, Node, PlanRequest
from tests.api.conftest import MODEL, World

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Action:
    name: str
    lowest_role: str
    method: str
    url: Callable[[World], str]
    body: dict | Callable[[World], dict] | None
    changed: Callable[[World], bool]


def stopped_deployment(w: World) -> str:
    Deployment.objects.filter(pk=w.deployment.pk).update(state="stopped")
    return f"/api/v1/deployments/{w.deployment.pk}/"


ACTIONS = [
    Action(
        "plan",
        roles.OPERATOR,
        "post",
        lambda w: "/api/v1/plans/",
        {"model": MODEL, "max_model_len": 10000},
        lambda w: (
            PlanRequest.objects.count() > 1 and ("plan_request", PlanRequest.objects.first().pk) in w.queued
        ),
    ),
    Action(
        "deploy",
        roles.OPERATOR,
        "post",
        lambda w: "/api/v1/deployments/",
        lambda w: {"plan_request": w.plan.pk},
        lambda w: Deployment.objects.count() > 1,
    ),
    Action(
        "stop",
        roles.OPERATOR,
        "post",
        lambda w: f"/api/v1/deployments/{w.deployment.pk}/stop/",
        None,
        lambda w: ("stop_deployment", w.deployment.pk) in w.queued,
    ),
    Action(
        "restart",
        roles.OPERATOR,
        "post",
        lambda w: f"/api/v1/deployments/{w.deployment.pk}/restart/",
        None,
        lambda w: ("restart_deployment", w.deployment.pk) in w.queued,
    ),
    Action(
        "delete",
        roles.OPERATOR,
        "delete",
        stopped_deployment,
        None,
        lambda w: not Deployment.objects.filter(pk=w.deployment.pk).exists(),
    ),
    Action(
        "acknowledge",
        roles.OPERATOR,
        "post",
        lambda w: f"/api/v1/alerts/{w.alert.pk}/acknowledge/",
        None,
        lambda w: Alert.objects.get(pk=w.alert.pk).status == "acknowledged",
    ),
    Action(
        "issue agent token",
        roles.ADMIN,
        "post",
        lambda w: "/api/v1/agent-tokens/",
        {"node": "gpu-node-7"},
        lambda w: Node.objects.filter(name="gpu-node-7").exists(),
    ),
    Action(
        "revoke agent token",
        roles.ADMIN,
        "post",
        lambda w: f"/api/v1/agent-tokens/{w.agent_token.pk}/revoke/",
        None,
        lambda w: AgentToken.objects.get(pk=w.agent_token.pk).revoked is not None,
    ),
]
BY_NAME = {a.name: a for a in ACTIONS}


def send(client: Client, action: Action, world: World):
    body = action.body(world) if callable(action.body) else action.body
    kwargs = {} if body is None else {"data": json.dumps(body), "content_type": "application/json"}
    return getattr(client, action.method)(action.url(world), **kwargs)


def bearer(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def spoiled(world: World, how: str) -> str:
    """An admin's operate token made useless: wrong, expired or revoked."""
    if how == "wrong":
        return "lcu_" + "x" * 43
    plaintext = world.token(roles.ADMIN)
    row = ApiToken.objects.get(prefix=plaintext[:10])
    if how == "expired":
        row.expires = timezone.now() - timedelta(seconds=1)
        row.save()
    else:
        row.revoke()
    return plaintext


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
def test_it_does_the_action_with_an_operate_token_of_the_right_role(world, action):
    response = send(world.client(action.lowest_role), action, world)
    assert response.status_code < 300, response.content
    assert action.changed(world)


@pytest.mark.parametrize("how", ["wrong", "expired", "revoked"])
@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
def test_it_refuses_a_bad_token_with_401_and_changes_nothing(world, action, how):
    response = send(bearer(spoiled(world, how)), action, world)
    assert response.status_code == 401, response.content
    error = response.json()["error"]
    assert (
        error["code"] == "unauthorized"
        and {"wrong": "unknown", "expired": "expired", "revoked": "revoked"}[how] in error["message"]
    )
    assert not action.changed(world) and not world.queued


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
def test_it_refuses_no_credentials_with_401_and_changes_nothing(world, action):
    response = send(Client(), action, world)
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
    assert not action.changed(world) and not world.queued


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
def test_it_refuses_a_read_token_with_403_and_changes_nothing(world, action):
    response = send(world.client(roles.ADMIN, "read"), action, world)
    assert response.status_code == 403, response.content
    assert "read scope" in response.json()["error"]["message"]
    assert not action.changed(world) and not world.queued


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.name)
def test_it_refuses_a_role_below_the_uis_with_403_and_changes_nothing(world, action):
    below = roles.ROLE_NAMES[roles.ROLE_NAMES.index(action.lowest_role) - 1]
    response = send(world.client(below), action, world)
    assert response.status_code == 403, response.content
    assert f"needs the {action.lowest_role} role" in response.json()["error"]["message"]
    assert not action.changed(world) and not world.queued


def test_it_lets_a_read_token_read_everything_its_user_may_see(world):
    viewer = world.client(roles.VIEWER, "read")
    for url in (
        "/api/v1/nodes/",
        "/api/v1/deployments/",
        "/api/v1/alerts/",
        f"/api/v1/plans/{world.plan.pk}/",
    ):
        assert viewer.get(url).status_code == 200, url
    assert viewer.get("/api/v1/agent-tokens/").status_code == 403  # admins only, as in the Django admin
    assert world.client(roles.ADMIN, "read").get("/api/v1/agent-tokens/").status_code == 200


def test_it_accepts_the_browsers_session(world):
    browser = Client()
    browser.force_login(world.people[roles.VIEWER])
    assert browser.get("/api/v1/nodes/a30-seed/").json()["name"] == "a30-seed"


def test_it_records_when_a_token_was_last_used(world):
    plaintext = world.token(roles.VIEWER, "read")
    assert ApiToken.objects.get(prefix=plaintext[:10]).last_used is None
    bearer(plaintext).get("/api/v1/nodes/")
    assert ApiToken.objects.get(prefix=plaintext[:10]).last_used is not None


def test_it_stores_only_a_hash_of_the_token(world):
    plaintext = world.token(roles.OPERATOR)
    row = ApiToken.objects.get(prefix=plaintext[:10])
    assert plaintext not in (row.digest, row.prefix) and len(row.digest) == 64


def test_it_refuses_a_session_change_without_the_csrf_token_and_changes_nothing(world):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(world.people[roles.OPERATOR])
    response = send(browser, BY_NAME["stop"], world)
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert not world.queued
    browser.get("/account/tokens/")  # any page sets the CSRF cookie, as the docs page's script reads it
    token = browser.cookies["csrftoken"].value
    response = browser.post(f"/api/v1/deployments/{world.deployment.pk}/stop/", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 202 and world.queued == [("stop_deployment", world.deployment.pk)]

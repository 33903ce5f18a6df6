"""Roles: every role against every action that changes something, on the dashboard and in the Django admin.

The browser websocket (FleetConsumer) only pushes to browsers and takes no actions, so there is no websocket
row; the agent socket authenticates nodes by token, not people.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from io import StringIO
from unittest.mock import patch

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.core.management import CommandError, call_command
from django.http import HttpResponse
from django.test import Client

from dashboard import alerts, deploy, roles, tasks
from dashboard.choices import AlertStatus, ChannelKind
from dashboard.management.commands.runstack import ensure_admin
from dashboard.models import AgentToken, Alert, Channel, Deployment, Node, PlanRequest
from tests.personas import person, seed_server

pytestmark = pytest.mark.django_db
NO_ROLE = "staff without a role"  # how every account made before roles existed starts out
PERSONAS = (NO_ROLE, *roles.ROLE_NAMES)
MODEL = "Qwen3-VL-32B-Instruct"


@pytest.fixture(autouse=True)
def quick_settings(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # ~1 s less per user


@dataclass
class World:
    """What each action acts on: the acting user's own channels, another operator's, a plan, a running
    deployment, an open alert with a re-plan suggestion, a node with an agent token."""

    persona: str
    user: AbstractBaseUser
    other: AbstractBaseUser
    node: Node
    plan: PlanRequest
    deployment: Deployment
    alert: Alert
    email: Channel
    hook: Channel
    token: AgentToken
    queued: list[tuple[str, object]] = field(default_factory=list)


@pytest.fixture(autouse=True)
def public_hook_host(dns):
    """hooks.example stands for a public receiver: webhooks to internal addresses are refused."""
    dns["hooks.example"] = ["93.184.215.14"]


def make_user(persona: str) -> AbstractBaseUser:
    if persona == NO_ROLE:
        return get_user_model().objects.create_user("stan", "stan@example.com", "stan-pw-123", is_staff=True)
    return person(persona, persona)


@pytest.fixture
def world(request, monkeypatch) -> World:
    user, other = make_user(request.param), person("otto", roles.OPERATOR)
    node = seed_server()
    plan = deploy.run_plan_request(PlanRequest.objects.create(model_ref=MODEL, max_model_len=10000).pk)
    deployment = deploy.create_deployment(plan, 0, other)
    suggestion = {"model_ref": MODEL, "max_model_len": 10000, "node": node.name, "tp": 1}
    alert = alerts.raise_alert(
        key="stall:x", kind="stall", title="no tokens", cause="c", remedy="r", actions={"replan": suggestion}
    )
    email = Channel.objects.get(owner=user, kind=ChannelKind.EMAIL)  # the alert subscribed everyone
    hook = Channel.objects.create(owner=user, kind=ChannelKind.WEBHOOK, value="https://hooks.example/mine")
    built = World(
        request.param, user, other, node, plan, deployment, alert, email, hook, AgentToken.issue(node)[0]
    )
    for name in ("plan_request", "launch_deployment", "stop_deployment", "restart_deployment", "send_canary"):
        monkeypatch.setattr(
            getattr(tasks, name), "delay", lambda pk, name=name: built.queued.append((name, pk))
        )
    return built


def fresh(row):
    return type(row).objects.filter(pk=row.pk).first()


def admin_action(model: str, action: str, pk: object) -> Callable[[Client, World], HttpResponse]:
    return lambda c, w: c.post(
        f"/admin/{model}/", {"action": action, "_selected_action": [pk(w)], "index": "0"}
    )


@dataclass(frozen=True)
class Action:
    name: str
    lowest_role: str
    do: Callable[[Client, World], HttpResponse]
    done: Callable[[World], bool]
    in_admin: bool = False  # the Django admin, which sends anyone without staff status to its login


def turn_mail_back_on(c: Client, w: World) -> HttpResponse:
    w.email.disable("")
    return c.post("/alerts/settings/", {"action": "enable", "channel": w.email.pk})


ACTIONS = [
    Action(
        "plan",
        roles.OPERATOR,
        lambda c, w: c.post("/deploy/", {"model": MODEL, "max_model_len": 10000, "concurrency": 1}),
        lambda w: PlanRequest.objects.filter(created_by=w.user).exists(),
    ),
    Action(
        "deploy a plan",
        roles.OPERATOR,
        lambda c, w: c.post(f"/deploy/plans/{w.plan.pk}/0/deploy/"),
        lambda w: Deployment.objects.filter(created_by=w.user).exists(),
    ),
    Action(
        "stop",
        roles.OPERATOR,
        lambda c, w: c.post(f"/deployments/{w.deployment.pk}/stop/"),
        lambda w: ("stop_deployment", w.deployment.pk) in w.queued,
    ),
    Action(
        "restart",
        roles.OPERATOR,
        lambda c, w: c.post(f"/deployments/{w.deployment.pk}/restart/"),
        lambda w: ("restart_deployment", w.deployment.pk) in w.queued,
    ),
    Action(
        "turn canary probes off",
        roles.OPERATOR,
        lambda c, w: c.post(f"/deployments/{w.deployment.pk}/probes-off/"),
        lambda w: ("send_canary", w.deployment.pk) in w.queued and not fresh(w.deployment).probes_enabled,
    ),
    Action(
        "re-plan from an alert",
        roles.OPERATOR,
        lambda c, w: c.post(f"/alerts/{w.alert.pk}/replan/"),
        lambda w: PlanRequest.objects.filter(created_by=w.user).exists(),
    ),
    Action(
        "acknowledge an alert",
        roles.OPERATOR,
        lambda c, w: c.post(f"/alerts/{w.alert.pk}/acknowledge/"),
        lambda w: fresh(w.alert).status == AlertStatus.ACKNOWLEDGED,
    ),
    Action(
        "add an own webhook",
        roles.OPERATOR,
        lambda c, w: c.post("/alerts/settings/", {"action": "add", "url": "https://hooks.example/new"}),
        lambda w: Channel.objects.filter(owner=w.user, value="https://hooks.example/new").exists(),
    ),
    Action(
        "turn an own webhook off",
        roles.OPERATOR,
        lambda c, w: c.post("/alerts/settings/", {"action": "disable", "channel": w.hook.pk}),
        lambda w: not fresh(w.hook).enabled,
    ),
    Action(
        "delete an own webhook",
        roles.OPERATOR,
        lambda c, w: c.post("/alerts/settings/", {"action": "delete", "channel": w.hook.pk}),
        lambda w: fresh(w.hook) is None,
    ),
    Action(
        "turn own mail off",
        roles.VIEWER,
        lambda c, w: c.post("/alerts/settings/", {"action": "disable", "channel": w.email.pk}),
        lambda w: not fresh(w.email).enabled,
    ),
    Action("turn own mail back on", roles.VIEWER, turn_mail_back_on, lambda w: fresh(w.email).enabled),
    Action(
        "issue an agent token",
        roles.ADMIN,
        admin_action("dashboard/node", "issue_token", lambda w: w.node.pk),
        lambda w: w.node.tokens.count() == 2,
        in_admin=True,
    ),
    Action(
        "revoke an agent token",
        roles.ADMIN,
        admin_action("dashboard/agenttoken", "revoke", lambda w: w.token.pk),
        lambda w: fresh(w.token).revoked is not None,
        in_admin=True,
    ),
    Action(
        "add a user",
        roles.ADMIN,
        lambda c, w: c.post(
            "/admin/auth/user/add/",
            {
                "username": "newbie",
                "usable_password": "true",
                "password1": "a-long-pass-phrase-42",
                "password2": "a-long-pass-phrase-42",
            },
        ),
        lambda w: get_user_model().objects.filter(username="newbie").exists(),
        in_admin=True,
    ),
    Action(
        "add a webhook for another user",
        roles.ADMIN,
        lambda c, w: c.post(
            "/admin/dashboard/channel/add/",
            {
                "kind": ChannelKind.WEBHOOK,
                "owner": w.other.pk,
                "value": "https://hooks.example/otto",
                "enabled": "on",
                "disabled_reason": "",
                "last_notify_0": "",
                "last_notify_1": "",
                "last_error": "",
            },
        ),
        lambda w: Channel.objects.filter(owner=w.other, kind=ChannelKind.WEBHOOK).exists(),
        in_admin=True,
    ),
    Action(
        "turn off another user's mail",
        roles.ADMIN,
        lambda c, w: c.post(
            f"/admin/dashboard/channel/{other_email(w).pk}/change/",
            {
                "kind": ChannelKind.EMAIL,
                "owner": w.other.pk,
                "value": w.other.email,
                "disabled_reason": "",
                "last_notify_0": "",
                "last_notify_1": "",
                "last_error": "",
            },
        ),
        lambda w: not other_email(w).enabled,
        in_admin=True,
    ),
]


def other_email(w: World) -> Channel:
    return Channel.objects.get_or_create(
        owner=w.other, kind=ChannelKind.EMAIL, defaults={"value": w.other.email}
    )[0]


def may(persona: str, action: Action) -> bool:
    """A viewer's actions (their own mail) are anyone's; the rest need the role or a higher one."""
    if action.lowest_role == roles.VIEWER:
        return True
    return persona in roles.ROLE_NAMES and roles.ROLE_NAMES.index(persona) >= roles.ROLE_NAMES.index(
        action.lowest_role
    )


@pytest.mark.parametrize("world", PERSONAS, indirect=True)
@pytest.mark.parametrize("action", ACTIONS, ids=[a.name for a in ACTIONS])
def test_it_lets_each_role_do_exactly_what_it_may(client, world: World, action: Action):
    client.force_login(world.user)
    response = action.do(client, world)
    allowed = may(world.persona, action)
    assert action.done(world) == allowed, response.content.decode()[:600]
    if allowed:
        assert response.status_code == 302, response.content.decode()[:600]
    elif action.in_admin and not world.user.is_staff:
        assert response.status_code == 302 and response.url.startswith("/admin/login/")
    else:
        assert response.status_code == 403
        assert action.in_admin or "may not" in response.content.decode()


@pytest.mark.parametrize("persona", PERSONAS)
def test_it_says_who_may_not_do_what_and_which_role_may(client, persona):
    user = make_user(persona)
    client.force_login(user)
    response = client.post(f"/deployments/{'x' * 8}/stop/")
    refusal = response.content.decode()
    if persona in (roles.OPERATOR, roles.ADMIN):
        assert response.status_code == 404  # allowed to try; there is no such deployment
        return
    assert response.status_code == 403 and 'id="refusal"' in refusal
    role = persona if persona == roles.VIEWER else "no role"
    assert (
        f"{user.username} ({role}) may not stop or restart a deployment: that needs the operator role"
        in refusal
    )


def test_it_logs_a_refusal_as_one_line_without_a_traceback(client, caplog):
    client.force_login(make_user(roles.VIEWER))
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.post(f"/deployments/{'x' * 8}/stop/").status_code == 403
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.getMessage().startswith("Forbidden") and record.exc_info is None


BUTTONS = [  # (page, what marks the button, the role that first sees it)
    (lambda w: f"/deployments/{w.deployment.pk}/", 'id="stop"', roles.OPERATOR),
    (lambda w: f"/deployments/{w.deployment.pk}/", 'id="restart"', roles.OPERATOR),
    (lambda w: f"/deploy/plans/{w.plan.pk}/", "Deploy this plan", roles.OPERATOR),
    (lambda w: f"/deploy/plans/{w.plan.pk}/fragment/", "Deploy this plan", roles.OPERATOR),
    (lambda w: "/deploy/", '<button type="submit">Plan</button>', roles.OPERATOR),
    (lambda w: "/deployments/", 'href="/deploy/"', roles.OPERATOR),
    (lambda w: f"/alerts/{w.alert.pk}/", 'id="acknowledge"', roles.OPERATOR),
    (lambda w: f"/alerts/{w.alert.pk}/", 'id="replan"', roles.OPERATOR),
    (lambda w: "/alerts/settings/", 'value="add"', roles.OPERATOR),
    (lambda w: "/alerts/settings/", 'value="delete"', roles.OPERATOR),
    (lambda w: "/alerts/settings/", 'value="disable"', roles.VIEWER),  # own mail: anyone
    (lambda w: "/", 'href="/admin/"', roles.ADMIN),
]


@pytest.mark.parametrize("world", roles.ROLE_NAMES, indirect=True)
def test_it_shows_each_role_only_the_buttons_it_may_use(client, world: World):
    client.force_login(world.user)
    for page, marker, lowest in BUTTONS:
        html = client.get(page(world)).content.decode()
        shown = roles.ROLE_NAMES.index(world.persona) >= roles.ROLE_NAMES.index(lowest)
        assert (marker in html) == shown, (world.persona, page(world), marker)


def test_it_keeps_the_groups_to_exactly_the_defined_permissions_after_a_migrate():
    operators = Group.objects.get(name=roles.OPERATOR)
    operators.permissions.clear()
    Group.objects.get(name=roles.VIEWER).permissions.set(operators.permissions.model.objects.all()[:3])
    call_command("migrate", verbosity=0)
    for role, perms in roles.ROLE_PERMISSIONS.items():
        held = Group.objects.get(name=role).permissions.values_list("content_type__app_label", "codename")
        assert sorted(f"{app}.{codename}" for app, codename in held) == sorted(perms), role


# ---- commands ----------------------------------------------------------------------------------------------
def run(*args: str, stdin: str = "") -> str:
    out = StringIO()
    with patch("sys.stdin", StringIO(stdin)):
        call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("role", roles.ROLE_NAMES)
def test_it_creates_a_user_in_a_role_and_prints_the_generated_password_once(role, monkeypatch):
    monkeypatch.delenv("LAYERCAKE_PASSWORD", raising=False)
    out = run("create_user", "pat", "--role", role, "--email", "pat@example.com")
    password = out.split("password (shown once): ")[1].strip()
    user = get_user_model().objects.get(username="pat")
    assert user.check_password(password) and out.count(password) == 1 and user.email == "pat@example.com"
    assert roles.role_of(user) == role and user.is_staff == (role == roles.ADMIN) and not user.is_superuser
    assert user.has_perm(roles.DEPLOY.perm) == (role != roles.VIEWER)
    assert user.has_perm(roles.ISSUE_TOKENS) == (role == roles.ADMIN)


def test_it_takes_the_password_from_the_environment_or_standard_input(monkeypatch):
    monkeypatch.setenv("LAYERCAKE_PASSWORD", "from-the-env-123")
    assert "password" not in run("create_user", "env", "--role", "viewer")
    assert run("create_user", "piped", "--role", "operator", "--password-stdin", stdin="from-stdin-456\n")
    users = get_user_model().objects
    assert users.get(username="env").check_password("from-the-env-123")
    assert users.get(username="piped").check_password("from-stdin-456")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create_user", "dup", "--role", "viewer"), "user 'dup' exists already"),
        (
            ("create_user", "bad name!", "--role", "viewer"),
            "cannot create 'bad name!': Enter a valid username",
        ),
        (
            ("create_user", "mail", "--role", "viewer", "--email", "not-an-address"),
            "Enter a valid email address",
        ),
        (("create_user", "nopw", "--role", "viewer", "--password-stdin"), "standard input had no password"),
        (("set_role", "ghost", "--role", "admin"), "no user 'ghost'"),
    ],
)
def test_it_refuses_bad_user_commands_with_the_reason(args, message):
    person("dup", roles.VIEWER)
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_it_moves_a_user_between_roles_and_a_demoted_superuser_loses_everything():
    boss = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw")
    assert run("set_role", "boss", "--role", "operator") == "boss is now operator\n"
    boss = get_user_model().objects.get(pk=boss.pk)
    assert roles.role_of(boss) == roles.OPERATOR and not boss.is_superuser and not boss.is_staff
    assert boss.has_perm(roles.DEPLOY.perm) and not boss.has_perm(roles.ISSUE_TOKENS)
    run("set_role", "boss", "--role", "viewer")
    boss = get_user_model().objects.get(pk=boss.pk)
    assert list(boss.groups.values_list("name", flat=True)) == [roles.VIEWER] and not boss.has_perm(
        roles.DEPLOY.perm
    )


def test_it_makes_the_run_commands_admin_login_an_admin_also_when_it_existed_before_roles(tmp_path):
    username, _ = ensure_admin(tmp_path / "admin-login.txt")
    admin = get_user_model().objects.get(username=username)
    assert roles.role_of(admin) == roles.ADMIN and admin.is_staff
    admin.groups.clear()  # as an admin made by an older runstack
    ensure_admin(tmp_path / "admin-login.txt")
    assert roles.role_of(admin) == roles.ADMIN


def test_it_subscribes_every_role_with_an_address_to_alert_mail_but_not_users_without_one():
    for role in roles.ROLE_NAMES:
        person(role, role)
    get_user_model().objects.create_user("nobody", "nobody@example.com", "pw")  # no role, not staff
    Channel.ensure_operator_emails()
    assert sorted(Channel.objects.values_list("owner__username", flat=True)) == sorted(roles.ROLE_NAMES)

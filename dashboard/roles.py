"""Roles: what viewers, operators and admins may change, defined once and checked in one place.

Viewers see everything and change nothing; operators plan, deploy, stop, restart, re-plan and acknowledge;
admins also issue agent tokens, manage users and other people's alert channels (in the Django admin).
Every view (and any future API endpoint or websocket action) that changes something calls `check` or wears
`requires`; templates read `can` (the `role_context` processor) only to hide what the server would refuse.
The permissions and the three groups are written to the database after every migrate (`sync_roles`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse

VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"
ROLE_NAMES = (VIEWER, OPERATOR, ADMIN)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Ability:
    """One thing a role may do: a custom permission of the dashboard app."""

    key: str  # what templates test: {% if can.deploy %}
    codename: str
    model: str  # the dashboard model the permission is attached to
    doing: str  # "deploy a plan": completes "may not ..." and "Can ..."

    @property
    def perm(self) -> str:
        return f"dashboard.{self.codename}"


PLAN = Ability("plan", "plan_model", "planrequest", "plan or re-plan a model placement")
DEPLOY = Ability("deploy", "deploy_model", "deployment", "deploy a plan")
CONTROL = Ability("control", "control_deployment", "deployment", "stop or restart a deployment")
ACKNOWLEDGE = Ability("acknowledge", "acknowledge_alert", "alert", "acknowledge an alert")
WEBHOOKS = Ability("webhooks", "manage_own_webhooks", "channel", "add or change their own alert webhooks")
ABILITIES = (PLAN, DEPLOY, CONTROL, ACKNOWLEDGE, WEBHOOKS)

# Admins work in the Django admin, which checks Django's own model permissions.
ADMIN_MODEL_PERMISSIONS = (
    "dashboard.add_agenttoken",
    "dashboard.change_agenttoken",
    "dashboard.view_agenttoken",
    "dashboard.view_apitoken",
    "dashboard.change_apitoken",  # revoke anyone's personal API token
    "dashboard.change_node",
    "dashboard.view_node",
    "dashboard.add_channel",
    "dashboard.change_channel",
    "dashboard.delete_channel",
    "dashboard.view_channel",
    "dashboard.view_notification",
    "auth.add_user",
    "auth.change_user",
    "auth.delete_user",
    "auth.view_user",
    "auth.view_group",
    "axes.view_accessattempt",
    "axes.delete_accessattempt",  # see and lift login lockouts
)
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    VIEWER: (),
    OPERATOR: tuple(a.perm for a in ABILITIES),
    ADMIN: (*(a.perm for a in ABILITIES), *ADMIN_MODEL_PERMISSIONS),
}
ISSUE_TOKENS = "dashboard.add_agenttoken"
# Not a custom permission (Django's own add_agenttoken, held by admins only): the REST API checks it like one.
AGENT_TOKENS = Ability("agent_tokens", "add_agenttoken", "agenttoken", "list, issue or revoke agent tokens")


def role_of(user: AbstractBaseUser | AnonymousUser) -> str:
    """The user's highest role, or "no role"."""
    if not user.is_authenticated:
        return "not logged in"
    held = set(user.groups.filter(name__in=ROLE_NAMES).values_list("name", flat=True))
    return next((name for name in reversed(ROLE_NAMES) if name in held), "no role")


def lowest_role_with(perm: str) -> str:
    return next(name for name in ROLE_NAMES if perm in ROLE_PERMISSIONS[name])


def check(user: AbstractBaseUser | AnonymousUser, ability: Ability) -> None:
    """Raise PermissionDenied (HTTP 403) saying who may not do what, and which role may."""
    if not user.has_perm(ability.perm):
        raise PermissionDenied(
            f"{user.get_username() or 'anonymous'} ({role_of(user)}) may not {ability.doing}: "
            f"that needs the {lowest_role_with(ability.perm)} role; ask an admin."
        )


def requires(ability: Ability) -> Callable:
    """View decorator: a request that may change something (not GET/HEAD/OPTIONS) needs the ability."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in SAFE_METHODS:
                check(request.user, ability)
            return view(request, *args, **kwargs)

        return checked

    return decorate


def abilities(user: AbstractBaseUser | AnonymousUser) -> dict[str, bool]:
    return {a.key: user.is_authenticated and user.has_perm(a.perm) for a in ABILITIES}


def role_context(request: HttpRequest) -> dict[str, Any]:
    """Template context processor: `can.plan`, `can.deploy`, ... for hiding buttons the user may not use."""
    user = getattr(request, "user", None)
    return {"can": abilities(user)} if user is not None else {}


def assign_role(user: AbstractBaseUser, role: str) -> None:
    """Put the user in exactly one role group. Only admins get into the Django admin (staff status); a
    superuser given a lesser role stops being one, or the role would mean nothing."""
    if role not in ROLE_NAMES:
        raise ValueError(f"unknown role {role!r}: choose one of {', '.join(ROLE_NAMES)}")
    user.is_staff = role == ADMIN
    user.is_superuser = user.is_superuser and role == ADMIN
    user.save(update_fields=["is_staff", "is_superuser"])
    user.groups.remove(*Group.objects.filter(name__in=ROLE_NAMES).exclude(name=role))
    user.groups.add(Group.objects.get(name=role))


def sync_roles(**kwargs: Any) -> None:
    """post_migrate: create the custom permissions and the three groups with exactly their permissions."""
    using = kwargs.get("using", "default")
    with transaction.atomic(using=using):
        for ability in ABILITIES:
            content_type, _ = ContentType.objects.db_manager(using).get_or_create(
                app_label="dashboard", model=ability.model
            )
            Permission.objects.db_manager(using).update_or_create(
                content_type=content_type,
                codename=ability.codename,
                defaults={"name": f"Can {ability.doing}"},
            )
        for role, perms in ROLE_PERMISSIONS.items():
            group, _ = Group.objects.db_manager(using).get_or_create(name=role)
            group.permissions.set(permission_rows(perms, using))


def permission_rows(perms: tuple[str, ...], using: str) -> list[Permission]:
    rows = []
    for name in perms:
        app_label, codename = name.split(".")
        row = (
            Permission.objects.db_manager(using)
            .filter(content_type__app_label=app_label, codename=codename)
            .first()
        )
        if row is None:
            raise ImproperlyConfigured(
                f"role permission {name} does not exist (is the app installed and migrated?)"
            )
        rows.append(row)
    return rows

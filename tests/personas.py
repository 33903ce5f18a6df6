"""Named test personas: nodes built the way a real agent's hello builds them (from the simulated GPU sources),
and people in each role, made the way `manage.py create_user` makes them."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser

from agents import protocol
from agents.sim.gpus import SimSource
from dashboard import roles
from dashboard.ingest import apply_hello
from dashboard.models import Node


def hello_for(name: str, spec: str) -> protocol.Hello:
    source = SimSource(spec)
    return protocol.Hello(
        type="hello",
        v=1,
        agent_version="test",
        hostname=name,
        boot_id="boot-" + name,
        interval_s=1.0,
        gpu_source="sim",
        simulated=True,
        gpus=source.inventory(),
        topology=source.topology(),
    )


def sim_node(name: str, spec: str) -> Node:
    """A node as it is after its agent said hello: GPUs, links and topology stored."""
    node = Node.objects.create(name=name)
    apply_hello(node, hello_for(name, spec))
    node.refresh_from_db()
    return node


def seed_server() -> Node:
    """The field report's server: 4x A30 24 GB, every GPU pair SYS, no P2P."""
    return sim_node("a30-seed", "sim:a30x4")


def person(username: str, role: str, password: str = "", email: str = "") -> AbstractBaseUser:
    """A login in one role (viewer, operator or admin); `password` defaults to USERNAME-pw-123."""
    user = get_user_model().objects.create_user(
        username, email or f"{username}@example.com", password or f"{username}-pw-123"
    )
    roles.assign_role(user, role)
    return user


def viewer() -> AbstractBaseUser:
    """Vic watches the cluster and may change nothing."""
    return person("vic", roles.VIEWER)


def operator() -> AbstractBaseUser:
    """Olga plans, deploys, stops, restarts, re-plans and acknowledges."""
    return person("olga", roles.OPERATOR)


def admin() -> AbstractBaseUser:
    """Ada also issues agent tokens and manages users and everyone's alert channels."""
    return person("ada", roles.ADMIN)

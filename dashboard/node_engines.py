"""The inference engines the agents reported (issue #14): the vLLM release a plan assumes when its request names
none, taken from the nodes the plan may use."""

from __future__ import annotations

from django.db.models import QuerySet

from dashboard.models import Node
from placement import PlacementError
from placement.request import parse_version

VLLM = "vllm"
MAX_NAMED = 3  # nodes named in a source text before "and N more"


def reported_version(node: Node, backend: str = VLLM) -> str | None:
    """The version of `backend` the node's agent reported, None when it reported none (or an unknown one)."""
    return next((e.get("version") for e in node.engines if e.get("backend") == backend), None)


def default_backend_version(pinned: Node | None, nodes: list[Node] | None) -> tuple[str | None, str]:
    """The vLLM release to plan with when the request leaves it empty, and where it came from (or why there is
    none): the pinned node's, else the one version every reporting node among `nodes` (None: the whole fleet)
    agrees on."""
    if pinned is not None:
        return _usable(reported_version(pinned), f"reported by {pinned.name}'s agent", [pinned.name])
    candidates = nodes if nodes is not None else list(_plannable())
    found: dict[str, list[str]] = {}
    for node in candidates:
        version = reported_version(node)
        if version:
            found.setdefault(version, []).append(node.name)
    if not found:
        return None, "no node's agent reported a vLLM version"
    if len(found) > 1:
        spread = "; ".join(f"{v} on {_names(found[v])}" for v in sorted(found))
        return None, f"the nodes' agents report different vLLM versions ({spread}): pick one for the plan"
    [(version, names)] = found.items()
    source = (
        f"reported by {names[0]}'s agent" if len(names) == 1 else f"reported by the agents of {_names(names)}"
    )
    if len(names) < len(candidates):
        source += f"; {len(candidates) - len(names)} other node(s) reported none"
    return _usable(version, source, names)


def _usable(version: str | None, source: str, names: list[str]) -> tuple[str | None, str]:
    if not version:
        return None, f"{_names(names)}'s agent reported no vLLM version"
    try:
        parse_version(version)
    except PlacementError:
        return None, f"{_names(names)} reported vLLM {version!r}, which is not a release number"
    return version, source


def _names(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:MAX_NAMED])
    return shown if len(names) <= MAX_NAMED else f"{shown} and {len(names) - MAX_NAMED} more"


def _plannable() -> QuerySet[Node]:
    return Node.objects.filter(topology__isnull=False).only("name", "engines")

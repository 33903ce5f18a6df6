"""Models the agents found in their --model-dir folders (issue #14, 1.7): stored from each hello, offered by
name in the deploy form, planned from the config.json keys the agent reported, and listed for the REST API
through `reported_models`."""

from __future__ import annotations

import json
from typing import Any

from agents.protocol import Hello
from dashboard.models import Node, NodeModel
from placement import PlacementError
from placement.spec import ModelSpec, catalog_names, find_catalog_key, spec_from_hf_config


def sync_node_models(node: Node, hello: Hello) -> None:
    """Replace the node's reported models with the hello's (called inside the hello's transaction)."""
    node.local_models.all().delete()
    NodeModel.objects.bulk_create(
        NodeModel(
            node=node,
            **model.model_dump(exclude={"config"}),
            config=_config(model.config),
        )
        for model in hello.models
    )


def _config(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def reported_models(node: str | None = None) -> list[dict[str, Any]]:
    """Every model the agents reported (of one node, if named), with whether the planner can plan it: a
    checkpoint whose config the agent sent, or a file whose name matches the built-in catalog."""
    rows = NodeModel.objects.select_related("node").order_by("name", "node__name", "path")
    if node is not None:
        rows = rows.filter(node__name=node)
    return [_as_dict(row) for row in rows]


def _as_dict(row: NodeModel) -> dict[str, Any]:
    return {
        "name": row.name,
        "node": row.node.name,
        "path": row.path,
        "format": row.format,
        "architecture": row.architecture,
        "quantization": row.quantization,
        "size_bytes": row.size_bytes,
        "size_label": row.size_label,
        "plannable": bool(row.config) or find_catalog_key(row.path) is not None,
    }


def offered_models(node: str | None = None) -> list[dict[str, Any]]:
    """What the deploy form's model field offers, in its order: each reported model (value: its path on the
    node), then every catalog name (value: the name). With `node`, only the models that node reported."""
    reported = [{**m, "value": m["path"], "source": "reported"} for m in reported_models(node)]
    if node is not None:
        return reported
    return reported + [_catalog_entry(name) for name in catalog_names()]


def _catalog_entry(name: str) -> dict[str, Any]:
    empty = ("node", "path", "format", "architecture", "quantization", "size_bytes", "size_label")
    return {"name": name, "value": name, "source": "catalog", **dict.fromkeys(empty), "plannable": True}


def model_options() -> list[tuple[str, str]]:
    """(value, label) for the deploy form's model field, from `offered_models`."""
    return [(m["value"], _label(m)) for m in offered_models()]


def _label(model: dict[str, Any]) -> str:
    if model["source"] == "catalog":
        return "built-in catalog"
    return f"{model['name']} on {model['node']} ({', '.join(_facts(model))})"


def _facts(model: dict[str, Any]) -> list[str]:
    size = f"{model['size_bytes'] / 2**30:.1f} GiB" if model["size_bytes"] else ""
    facts = [model["format"], model["architecture"], model["quantization"], model["size_label"], size]
    return [fact for fact in facts if fact]


def reported_spec(ref: str) -> ModelSpec | None:
    """The spec of a checkpoint an agent reported at path `ref` (with its config keys), else None."""
    row = NodeModel.objects.select_related("node").filter(path=ref, config__isnull=False).first()
    if row is None:
        return None
    source = f"config.json reported by {row.node.name}'s agent ({row.path})"
    try:
        return spec_from_hf_config(row.config, row.name, row.path, source)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, PlacementError):
            raise
        raise PlacementError(f"{source}: missing or odd field {exc}") from None


def holder_names(ref: str) -> list[str]:
    """The nodes whose agents reported a model at path `ref`, sorted; empty when `ref` is not such a path (a
    catalog name or HF id, which any node can fetch)."""
    rows = NodeModel.objects.filter(path=ref).values_list("node__name", flat=True)
    return sorted(set(rows))

"""The read side of the pages: what they show, computed from stored rows without changing them."""

from __future__ import annotations

from typing import Any

from dashboard import deploy, fleet
from dashboard.models import Node, PlanRequest


def plans_context(row: PlanRequest) -> dict:
    plans = (row.result or {}).get("plans", [])
    nodes = {n.name: n for n in Node.objects.filter(name__in={name for p in plans for name, _ in
                                                               deploy.plan_placements(p)})}
    items = [{"number": i, "plan": _shown_plan(p), "where": deploy.placement_text(p), "grids": _grids(p, nodes),
              "needs_override": deploy.plan_needs_override(p)} for i, p in enumerate(plans)]
    return {"row": row, "plans": items, "rejected": (row.result or {}).get("rejected", [])}


def _shown_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan as the page draws it: a copy whose memory breakdown also says what is neither weights nor KV
    cache (the stored plan stays as the planner wrote it)."""
    if "breakdown" not in plan:
        return plan
    breakdown = [{**b, "other_gib": max(0.0, b["total_gib"] - b["weights_gib"] - b.get("kv_cache_gib", 0.0))}
                 for b in plan["breakdown"]]
    return {**plan, "breakdown": breakdown}


def _grids(plan: dict, nodes: dict[str, Node]) -> list[dict]:
    grids = [(name, fleet.topology_grid(nodes[name], set(gpus)))
             for name, gpus in deploy.plan_placements(plan) if name in nodes]
    return [{"node": name, **grid} for name, grid in grids if grid is not None]

"""The read side of the pages: what they show, computed from stored rows without changing them."""

from __future__ import annotations

from dashboard import fleet
from dashboard.models import Node, PlanRequest
from placement.plan_model import Plan


def plans_context(row: PlanRequest) -> dict:
    """Each plan (typed; the page draws its memory bars with `Plan.memory_bars`) with where it runs and the
    topology grid of each of its nodes."""
    plans = row.plans()
    nodes = {n.name: n for n in Node.objects.filter(name__in={name for p in plans for name in p.nodes})}
    items = [
        {
            "number": i,
            "plan": p,
            "where": p.where_text(),
            "grids": _grids(p, nodes),
            "needs_override": p.needs_override,
        }
        for i, p in enumerate(plans)
    ]
    return {"row": row, "plans": items, "rejected": (row.result or {}).get("rejected", [])}


def _grids(plan: Plan, nodes: dict[str, Node]) -> list[dict]:
    grids = [
        (name, fleet.topology_grid(nodes[name], set(gpus)))
        for name, gpus in plan.placements()
        if name in nodes
    ]
    return [{"node": name, **grid} for name, grid in grids if grid is not None]

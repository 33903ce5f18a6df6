from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard import fleet
from dashboard.models import Node


@login_required
def fleet_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/fleet.html", {"nodes": fleet.fleet_overview()})


@login_required
def node_page(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node, name=name)
    context = {
        "node": node,
        "gpus": list(node.gpus.all()),
        "grid": fleet.topology_grid(node),
        "history": fleet.gpu_history(node, minutes=15),
        "legend": fleet.link_legend(),
    }
    return render(request, "dashboard/node.html", context)

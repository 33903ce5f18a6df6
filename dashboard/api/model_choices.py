"""/api/v1/models/: the models the deploy form offers by name (dashboard.node_models.offered_models)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router
from ninja.pagination import paginate

from dashboard.api.errors import ApiError
from dashboard.api.schemas import ERRORS, ModelOut
from dashboard.models import Node
from dashboard.node_models import offered_models

router = Router(tags=["models"])


@router.get("/", response={200: list[ModelOut], **ERRORS}, summary="Models the deploy form offers")
@paginate
def list_models(
    request: HttpRequest,
    node: str | None = Query(None, description="only the models this node's agent reported (its name)"),
) -> list[dict[str, Any]]:
    if node is not None and not Node.objects.filter(name=node).exists():
        raise ApiError(404, "not_found", f"no node named {node!r}", "node")
    return offered_models(node)

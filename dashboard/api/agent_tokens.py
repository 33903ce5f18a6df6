"""/api/v1/agent-tokens/: admins issue (shown once), list (never the secret) and revoke node credentials."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Status
from ninja.pagination import paginate

from dashboard import roles
from dashboard.api.auth import permit
from dashboard.api.errors import ApiError
from dashboard.api.schemas import ERRORS, AgentTokenIn, AgentTokenIssued, AgentTokenOut
from dashboard.models import AgentToken

router = Router(tags=["agent tokens"])


@router.get("/", response={200: list[AgentTokenOut], **ERRORS}, summary="List agent tokens (admins)")
@paginate
def list_tokens(request: HttpRequest, node: str | None = None) -> QuerySet[AgentToken]:
    roles.check(request.user, roles.AGENT_TOKENS)
    rows = AgentToken.objects.select_related("node").order_by("-created")
    return rows.filter(node__name=node) if node else rows


@router.post("/", response={201: AgentTokenIssued, **ERRORS}, summary="Issue an agent token (admins)")
def issue_token(request: HttpRequest, payload: AgentTokenIn) -> Status:
    permit(request, roles.AGENT_TOKENS)
    try:
        row, plaintext = AgentToken.issue_for(payload.node, payload.revoke_others)
    except ValueError as exc:
        raise ApiError(422, "invalid", str(exc), "node") from None
    row.token = plaintext  # on this answer only
    return Status(201, row)


@router.post("/{token_id}/revoke/", response={200: AgentTokenOut, **ERRORS}, summary="Revoke (admins)")
def revoke_token(request: HttpRequest, token_id: int) -> AgentToken:
    permit(request, roles.AGENT_TOKENS)
    row = get_object_or_404(AgentToken.objects.select_related("node"), pk=token_id)
    if row.revoked is None:
        row.revoke()
    return row

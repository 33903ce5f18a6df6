"""/api/v1/plans/ and /api/v1/check/: plan a model as the deploy form does, judge an operator's own command."""

from __future__ import annotations

import json
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Status

from dashboard import deploy, read, roles, tasks
from dashboard.api.auth import permit
from dashboard.api.errors import ApiError
from dashboard.api.schemas import ERRORS, CheckIn, CheckOut, PlanAccepted, PlanIn, PlanRequestOut
from dashboard.forms import DeployForm
from dashboard.models import PlanRequest
from placement import PlacementError

router = Router(tags=["plans"])


@router.post("/plans/", response={202: PlanAccepted, **ERRORS}, summary="Plan a model (queued)")
def create_plan(request: HttpRequest, payload: PlanIn) -> tuple[int, dict[str, Any]]:
    permit(request, roles.PLAN)
    form = deploy_form(payload)
    if not form.is_valid():
        field, messages = next(iter(form.errors.items()))
        raise ApiError(422, "invalid", " ".join(messages), None if field == "__all__" else field)
    row = form.save(request.user)
    tasks.plan_request.delay(row.pk)
    return Status(202, {"id": row.pk, "status": row.status, "url": f"/api/v1/plans/{row.pk}/"})


def deploy_form(payload: PlanIn) -> DeployForm:
    """The deploy page's form with the request's fields: the same checks and the same messages."""
    data = payload.dict(exclude={"config"})
    data = {name: "" if value is None else str(value) for name, value in data.items()}
    files = {}
    if payload.config is not None:
        files["config"] = SimpleUploadedFile("config.json", json.dumps(payload.config).encode())
    return DeployForm(data, files)


@router.get("/plans/{plan_id}/", response={200: PlanRequestOut, **ERRORS}, summary="A plan request's outcome")
def plan_detail(request: HttpRequest, plan_id: int) -> dict[str, Any]:
    context = read.plans_context(get_object_or_404(PlanRequest.objects.select_related("node"), pk=plan_id))
    row = context["row"]
    return {
        "id": row.pk,
        "status": row.status,
        "error": row.error,
        "created": row.created,
        "status_since": row.status_since,
        "model": row.model_ref,
        "node": row.node.name if row.node else None,
        **{
            name: getattr(row, name)
            for name in ("max_model_len", "concurrency", "backend", "gpus", "tp", "backend_version")
        },
        "plans": [
            {
                "number": item["number"],
                "where": item["where"],
                "needs_override": item["needs_override"],
                "plan": item["plan"].to_json(),
            }
            for item in context["plans"]
        ],
        "rejected": context["rejected"],
    }


@router.post(
    "/check/", response={200: CheckOut, **ERRORS}, summary="Judge a launch command (placement check)"
)
def check(request: HttpRequest, payload: CheckIn) -> dict[str, Any]:
    permit(request, roles.PLAN)
    if not payload.command:
        raise ApiError(
            422,
            "invalid",
            "give the launch command, e.g. vllm serve MODEL --tensor-parallel-size 2",
            "command",
        )
    try:
        return deploy.check_launch(payload.command, payload.node, payload.visible, payload.concurrency)
    except PlacementError as exc:
        raise ApiError(422, "cannot_check", str(exc)) from None

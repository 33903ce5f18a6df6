"""/api/v1/deployments/: list, one deployment, deploy a plan, stop, restart, delete."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Status
from ninja.pagination import paginate

from dashboard import deploy, roles, tasks
from dashboard.api.auth import permit
from dashboard.api.errors import ApiError
from dashboard.api.schemas import ERRORS, DeploymentDetailOut, DeploymentIn, DeploymentOut
from dashboard.choices import DeploymentState
from dashboard.models import Deployment, PlanRequest

router = Router(tags=["deployments"])
STATES = [value for value, _, _ in DeploymentState.CHOICES]


@router.get("/", response={200: list[DeploymentOut], **ERRORS}, summary="List deployments, newest first")
@paginate
def list_deployments(
    request: HttpRequest,
    state: str | None = Query(None, description=", ".join(STATES)),
    node: str | None = Query(None, description="the head node's name"),
) -> QuerySet[Deployment]:
    if state is not None and state not in STATES:
        raise ApiError(422, "invalid", f"state must be one of {', '.join(STATES)}", "state")
    rows = Deployment.objects.select_related("node", "created_by").prefetch_related("members__node")
    rows = rows.filter(state=state) if state else rows
    return rows.filter(node__name=node) if node else rows


@router.get("/{deployment_id}/", response={200: DeploymentDetailOut, **ERRORS}, summary="One deployment")
def deployment_detail(request: HttpRequest, deployment_id: str) -> Deployment:
    return get_object_or_404(Deployment.objects.select_related("node"), pk=deployment_id)


@router.post("/", response={202: DeploymentDetailOut, **ERRORS}, summary="Deploy a plan (launch queued)")
def create_deployment(request: HttpRequest, payload: DeploymentIn) -> Status:
    permit(request, roles.DEPLOY)
    row = get_object_or_404(PlanRequest, pk=payload.plan_request)
    try:
        deployment = deploy.create_deployment(row, payload.number, request.user, payload.override_busy)
    except deploy.DeployError as exc:
        raise ApiError(409, "cannot_deploy", str(exc)) from None
    tasks.launch_deployment.delay(deployment.pk)
    return Status(202, deployment)


@router.post("/{deployment_id}/stop/", response={202: DeploymentOut, **ERRORS}, summary="Stop (queued)")
def stop(request: HttpRequest, deployment_id: str) -> Status:
    return Status(202, control(request, deployment_id, tasks.stop_deployment))


@router.post("/{deployment_id}/restart/", response={202: DeploymentOut, **ERRORS}, summary="Restart (queued)")
def restart(request: HttpRequest, deployment_id: str) -> Status:
    return Status(202, control(request, deployment_id, tasks.restart_deployment))


def control(request: HttpRequest, deployment_id: str, task: Any) -> Deployment:
    """What the page's Stop and Restart buttons do: queue the task for the deployment."""
    permit(request, roles.CONTROL)
    deployment = get_object_or_404(Deployment, pk=deployment_id)
    task.delay(deployment.pk)
    return deployment


@router.delete("/{deployment_id}/", response={204: None, **ERRORS}, summary="Delete a stopped or failed one")
def delete_deployment(request: HttpRequest, deployment_id: str) -> Status:
    permit(request, roles.CONTROL)
    deployment = get_object_or_404(Deployment, pk=deployment_id)
    try:
        deploy.delete_deployment(deployment)
    except deploy.DeployError as exc:
        raise ApiError(409, "still_running", str(exc)) from None
    return Status(204, None)

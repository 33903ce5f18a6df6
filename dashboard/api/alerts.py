"""/api/v1/alerts/: list with filters, one alert with its evidence and history, acknowledge."""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router
from ninja.pagination import paginate

from dashboard import alerts, roles, tasks
from dashboard.api.auth import permit
from dashboard.api.errors import ApiError
from dashboard.api.schemas import ERRORS, AlertDetailOut, AlertOut
from dashboard.choices import AlertSeverity, AlertStatus
from dashboard.models import Alert

router = Router(tags=["alerts"])
STATUSES = [value for value, _, _ in AlertStatus.CHOICES] + ["unresolved"]
SEVERITIES = [value for value, _, _ in AlertSeverity.CHOICES]


@router.get("/", response={200: list[AlertOut], **ERRORS}, summary="List alerts, newest first")
@paginate
def list_alerts(
    request: HttpRequest,
    status: str | None = Query(None, description=", ".join(STATUSES)),
    kind: str | None = Query(None, description="e.g. stall, startup, crash, node_lost, xid"),
    severity: str | None = Query(None, description=", ".join(SEVERITIES)),
    node: str | None = Query(None, description="the node's name"),
    deployment: str | None = Query(None, description="the deployment's id"),
) -> QuerySet[Alert]:
    for name, value, allowed in (("status", status, STATUSES), ("severity", severity, SEVERITIES)):
        if value is not None and value not in allowed:
            raise ApiError(422, "invalid", f"{name} must be one of {', '.join(allowed)}", name)
    rows = Alert.objects.select_related("deployment", "node", "acknowledged_by")
    rows = rows.unresolved() if status == "unresolved" else rows.filter(status=status) if status else rows
    filters = {"kind": kind, "severity": severity, "node__name": node, "deployment_id": deployment}
    return rows.filter(**{name: value for name, value in filters.items() if value})


@router.get("/{alert_id}/", response={200: AlertDetailOut, **ERRORS}, summary="One alert with its evidence")
def alert_detail(request: HttpRequest, alert_id: int) -> Alert:
    return get_object_or_404(
        Alert.objects.select_related("deployment", "node", "acknowledged_by"), pk=alert_id
    )


@router.post("/{alert_id}/acknowledge/", response={200: AlertDetailOut, **ERRORS}, summary="Acknowledge")
def acknowledge(request: HttpRequest, alert_id: int) -> Alert:
    permit(request, roles.ACKNOWLEDGE)
    alert, batch = get_object_or_404(Alert, pk=alert_id), alerts.Batch()
    if alerts.acknowledge(alert, request.user, batch) is None:
        raise ApiError(409, "not_open", f"This alert is {alert.status_label().lower()} already.")
    tasks.enqueue(batch.jobs())
    return alert

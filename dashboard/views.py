from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard import calibration, deploy, fleet, fleet_view, mailsink, read, roles, tasks
from dashboard.browser_json import json_response
from dashboard.forms import DeployForm
from dashboard.models import Deployment, Node, PlanRequest


@login_required
def fleet_page(request: HttpRequest) -> HttpResponse:
    try:
        chosen = fleet_view.FleetFilter.from_query(request.GET)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    context = {**fleet_view.fleet_page_context(chosen), "deployments": fleet.active_deployments()}
    page, pages = context["page"], context["pages"]
    context["prev_query"] = fleet_view.page_query(request.GET, page - 1) if page > 1 else ""
    context["next_query"] = fleet_view.page_query(request.GET, page + 1) if page < pages else ""
    return render(request, "dashboard/fleet.html", context)


def chart_range(request: HttpRequest) -> tuple[str, int]:
    """The chart range the page asks for (`?range=`, default 15m) and its minutes; ValueError if unknown."""
    name = request.GET.get("range", "15m")
    return name, fleet.chart_minutes(name)


def bad_range(error: ValueError) -> HttpResponse:
    return HttpResponse(str(error), status=400, content_type="text/plain; charset=utf-8")


@login_required
def node_page(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node, name=name)
    try:
        range_name, minutes = chart_range(request)
    except ValueError as exc:
        return bad_range(exc)
    context = {
        "node": node,
        "gpus": list(node.gpus.all()),
        "grid": fleet.topology_grid(node),
        "history": fleet.gpu_history(node, minutes=minutes),
        "legend": fleet.link_legend(),
        "gpu_use": read.node_gpus(node),
        "deployments": read.node_deployments(node),
        "ranges": fleet.CHART_RANGES,
        "range": range_name,
        "minutes": minutes,
    }
    return render(request, "dashboard/node.html", context)


@login_required
def node_history(request: HttpRequest, name: str) -> HttpResponse:
    """The node page's chart points after `after` (unix ms): what a page missed while its socket was down."""
    node = get_object_or_404(Node, name=name)
    try:
        _, minutes = chart_range(request)
    except ValueError as exc:
        return json_response({"error": str(exc)}, status=400)
    try:
        after = datetime.fromtimestamp(float(request.GET.get("after", "0")) / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return json_response({"error": "after must be a time in unix milliseconds"}, status=400)
    return json_response(fleet.gpu_history(node, minutes=minutes, after=after))


@login_required
@roles.requires(roles.PLAN)
def deploy_page(request: HttpRequest) -> HttpResponse:
    form = DeployForm(request.POST or None, request.FILES or None, initial=request.GET or None)
    if request.method == "POST" and form.is_valid():
        row = form.save(request.user)
        tasks.plan_request.delay(row.pk)
        return redirect(row)
    return render(request, "dashboard/deploy.html", {"form": form})


@login_required
def plan_page(request: HttpRequest, pk: int) -> HttpResponse:
    row = get_object_or_404(PlanRequest, pk=pk)
    return render(request, "dashboard/plans.html", read.plans_context(row))


@login_required
def plan_fragment(request: HttpRequest, pk: int) -> HttpResponse:
    row = get_object_or_404(PlanRequest, pk=pk)
    return render(request, "dashboard/_plans.html", read.plans_context(row))


@login_required
@require_POST
@roles.requires(roles.DEPLOY)
def deploy_plan(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    row = get_object_or_404(PlanRequest, pk=pk)
    try:
        deployment = deploy.create_deployment(
            row, number, request.user, request.POST.get("override_busy") == "on"
        )
    except deploy.DeployError as exc:
        messages.error(request, str(exc))
        return redirect(row)
    tasks.launch_deployment.delay(deployment.pk)
    return redirect(deployment)


@login_required
def deployments_page(request: HttpRequest) -> HttpResponse:
    rows = Deployment.objects.select_related("node")[:200]
    return render(request, "dashboard/deployments.html", {"deployments": rows})


@login_required
def deployment_page(request: HttpRequest, pk: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment.objects.select_related("node"), pk=pk)
    try:
        range_name, minutes = chart_range(request)
    except ValueError as exc:
        return bad_range(exc)
    gpus = deployment.launch.get("gpus")
    context = {
        "d": deployment,
        "events": deployment.events.all(),
        "log_lines": fleet.log_tail(deployment),
        "metrics": fleet.metric_history(deployment, minutes=minutes),
        "members": deployment.members.select_related("node"),
        "probes_per_hour": deployment.probes_per_hour(),
        "measurement": calibration.measure(deployment),
        "gpu_names": {g.pk: f"GPU{g.index}" for g in deployment.node.gpus.all()},
        "access": read.server_access(deployment),
        "measurements": deployment.recent_load_tests(),
        "faults": deploy.fault_choices(deployment) if deployment.launch.get("backend") == "simulated" else [],
        "injected": deploy.injected_fault(deployment),
        "gpu_history": fleet.gpu_history(deployment.node, minutes=minutes, indices=gpus),
        "ranges": fleet.CHART_RANGES,
        "range": range_name,
        "minutes": minutes,
    }
    return render(request, "dashboard/deployment.html", context)


@login_required
def calibration_page(request: HttpRequest) -> HttpResponse:
    rows = calibration.calibration_rows()
    context = {"rows": rows, "min_samples": calibration.MIN_SAMPLES}
    return render(request, "dashboard/calibration.html", context)


@login_required
@require_POST
@roles.requires(roles.CONTROL)
def deployment_action(request: HttpRequest, pk: str, action: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment, pk=pk)
    if action in ("probes-on", "probes-off"):
        deployment.set_probes(action == "probes-on")
        tasks.send_canary.delay(deployment.pk)
        messages.info(request, f"canary probes turned {action[7:]} for {deployment.name}")
        return redirect(deployment)
    if action == "discard":
        return discard_deployment(request, deployment)
    if action == "inject":
        return inject_fault(request, deployment)
    task = {"stop": tasks.stop_deployment, "restart": tasks.restart_deployment}.get(action)
    if task is None:
        raise Http404(f"unknown action {action}")
    task.delay(deployment.pk)
    messages.info(request, f"{action} sent to {deployment.node.name}")
    return redirect(deployment)


def discard_deployment(request: HttpRequest, deployment: Deployment) -> HttpResponse:
    try:
        deploy.discard_planned(deployment.pk, f"discarded by {request.user.get_username()}: never launched")
    except deploy.NotPlanned as exc:
        messages.error(request, str(exc))
        return redirect(deployment)
    tasks.announce_deployment_change(deployment.pk)
    messages.info(request, f"{deployment.name} discarded")
    return redirect("fleet")


def inject_fault(request: HttpRequest, deployment: Deployment) -> HttpResponse:
    """Recorded here, so the page shows it at once (a bad fault is refused with the reason, nothing changes);
    the restart task restarts the server with it."""
    fault, by = request.POST.get("fault", ""), request.user.get_username()
    try:
        deploy.with_sim_fault(deployment.pk, fault, by)
    except deploy.DeployError as exc:
        messages.error(request, str(exc))
        return redirect(deployment)
    tasks.restart_deployment.delay(deployment.pk, fault, by)
    messages.info(request, f"{fault} injected: {deployment.node.name} restarts the simulated server with it")
    return redirect(deployment)


@login_required
def demo_mails(request: HttpRequest) -> HttpResponse:
    """The mails the demo's SMTP sink received (alert mail), newest first; only where runstack runs the sink."""
    if not settings.DEMO_MAIL_DIR:
        raise Http404("this page exists only in the demo, where runstack runs a local SMTP sink")
    mails = mailsink.kept_mails(Path(settings.DEMO_MAIL_DIR))
    return render(request, "dashboard/demo_mails.html", {"mails": mails, "directory": settings.DEMO_MAIL_DIR})

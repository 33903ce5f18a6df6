"""Celery tasks: periodic fleet housekeeping run by beat, and the work views and services ask for.

The only module that queues tasks: services return `jobs` for what should happen next, and their callers
hand them to `enqueue` (see dashboard/jobs.py for why).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from asgiref.sync import async_to_sync
from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from agents import protocol
from dashboard import alerts, calibration, deploy, detect, metric_hours, storage
from dashboard.choices import DeploymentState, DesiredState, NodeStatus
from dashboard.jobs import DeliverNotifications, Job, LaunchMembers, StopProcesses
from dashboard.live import agent_group, announce_deployment, announce_nodes, announce_plan
from dashboard.models import CanaryProbe, Deployment, LogChunk, leases

log = logging.getLogger(__name__)


@shared_task(ignore_result=False)
def measure_deployments() -> int:
    """Record predicted against measured for running and recently ended deployments (the fleet calibration)."""
    return calibration.measure_recent()


@contextmanager
def single_run(name: str, seconds: float) -> Iterator[bool]:
    """True for the one run of a periodic task that holds its lease (leases.held) for up to `seconds`; a run
    that finds the previous one still going gets False and skips, so that slow runs never pile up."""
    with leases.held(name, seconds) as mine:
        if not mine:
            log.info("%s: the previous run is still going; this one skips", name)
        yield mine


@shared_task(ignore_result=False)
def maintain_storage() -> dict[str, int] | None:
    """Roll raw samples up into the minute and hour tiers and apply each tier's retention (dashboard/storage.py);
    log chunks and canary probes older than LOG_RETENTION_HOURS go too. Returns the counts (None: skipped, the last still runs)."""
    with single_run("maintain_storage", 3600) as mine:
        if not mine:
            return None
        now = timezone.now()
        hours = metric_hours.roll_up(now)  # before storage prunes the metric rows they are built from
        run = storage.maintain(now)
        pruned_hours = metric_hours.prune(now - timedelta(days=settings.HOUR_RETENTION_DAYS))
        cutoff = now - timedelta(hours=settings.LOG_RETENTION_HOURS)
        logs, _ = LogChunk.objects.filter(t__lt=cutoff).delete()
        probes, _ = CanaryProbe.objects.filter(t__lt=cutoff).delete()
        return {
            **dataclasses.asdict(run),
            "metric_hours": hours,
            "deleted_metric_hours": pruned_hours,
            "deleted_logs": logs,
            "deleted_probes": probes,
        }


@shared_task(ignore_result=False)
def announce_silent_nodes() -> list[str] | None:
    """Tell browsers about nodes whose agents went silent, whether or not a page saw the socket close."""
    with single_run("announce_silent_nodes", settings.DETECT_LEASE_S) as mine:
        if not mine:
            return None
        now = timezone.now()
        silent = [
            {
                "node": node.pk,
                "name": node.name,
                "status": NodeStatus.STALE if node.connected else NodeStatus.OFFLINE,
            }
            for node in detect.nodes_seen()
            if now - node.stale_after() * 4 < node.last_seen < now - node.stale_after()
        ]
        async_to_sync(announce_nodes)(silent)
        return [n["name"] for n in silent]


@shared_task(ignore_result=False, acks_late=True, autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def plan_request(request_id: int) -> str:
    """Plan a deploy-form request against the live fleet and tell the waiting page."""
    row = deploy.run_plan_request(request_id)
    async_to_sync(announce_plan)(row.pk, row.status)
    return row.status


@shared_task(ignore_result=False)
def sweep_stale_plans() -> int:
    """Plan requests left "planning" by a worker that died: queue each once more, then fail it with the reason
    (the broker would give the task back only after its visibility timeout, an hour)."""
    again, failed = deploy.sweep_stale_plans(timezone.now(), settings.PLAN_STALE_AFTER_S)
    for row in again:
        plan_request.delay(row.pk)
    for row in failed:
        async_to_sync(announce_plan)(row.pk, row.status)
    return len(again) + len(failed)


def announce_deployment_change(deployment_id: str) -> None:
    """Tell the open pages about a deployment's new state (made on the server side, e.g. discarded)."""
    async_to_sync(announce_deployment)(Deployment.objects.get(pk=deployment_id).summary())


@shared_task(ignore_result=False)
def expire_planned_deployments() -> int:
    """Deployments left planned (never deployed, or queued while Celery was down) past PLANNED_EXPIRE_AFTER_S."""
    expired = deploy.expire_planned(timezone.now(), settings.PLANNED_EXPIRE_AFTER_S)
    for deployment in expired:
        async_to_sync(announce_deployment)(deployment.summary())
    return len(expired)


@shared_task(ignore_result=False, acks_late=True, autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def launch_deployment(deployment_id: str) -> str:
    """Send the launch command to the node's agent. Safe to run twice: the agent launches once per id."""
    with transaction.atomic():  # the row lock keeps an operator's Stop from landing between check and move
        deployment = (
            Deployment.objects.select_for_update(of=("self",)).select_related("node").get(pk=deployment_id)
        )
        if (
            deployment.state not in (DeploymentState.PLANNED, DeploymentState.LAUNCHING)
            or deployment.desired != DesiredState.RUNNING
        ):
            return deployment.state
        deployment.move_to(DeploymentState.LAUNCHING, f"launch sent to {deployment.node.name}")
    send_to_node(deployment.node_id, protocol.dump(deployment.canary_command()))
    send_to_agent(deployment, protocol.dump(deployment.launch_command()))
    return deployment.state


@shared_task(ignore_result=False, acks_late=True, autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_canary(deployment_id: str) -> bool:
    """Tell the head node's agent the deployment's probe settings (the operator turned probes on or off)."""
    deployment = Deployment.objects.get(pk=deployment_id)
    send_to_node(deployment.node_id, protocol.dump(deployment.canary_command()))
    return deployment.probes_enabled


@shared_task(ignore_result=False, acks_late=True, autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def launch_members(deployment_id: str) -> int:
    """Multi-node: the head reported its rendezvous port; launch the other nodes to join it."""
    deployment = Deployment.objects.select_related("node").get(pk=deployment_id)
    if deployment.desired != DesiredState.RUNNING or deployment.dist_port is None:
        return 0
    commands = deploy.member_commands(deployment)
    for member, frames in commands:
        for frame in frames:
            send_to_node(member.node_id, frame)
    return len(commands)


@shared_task(ignore_result=False)
def resend_lost_launches() -> int:
    """Send the launch again wherever a worker marked it launching and died before sending it (the agent has
    said nothing since). Sending twice is safe: the agent launches once per deployment id and answers a
    repeated launch with "already running"."""
    now = timezone.now()
    heads, members = deploy.lost_launches(now, settings.LAUNCH_RESEND_AFTER_S)
    for deployment in heads:
        deploy.note_resent(deployment, now)
        send_to_node(deployment.node_id, protocol.dump(deployment.canary_command()))
        send_to_agent(deployment, protocol.dump(deployment.launch_command()))
    for member in members:
        deploy.note_resent(member, now)
        send_to_node(member.node_id, json.dumps(member.launch))
    return len(heads) + len(members)


@shared_task(ignore_result=False, acks_late=True)
def stop_deployment(deployment_id: str) -> str:
    deployment = Deployment.objects.select_related("node").get(pk=deployment_id)
    if deployment.state in (DeploymentState.STOPPED, DeploymentState.FAILED):
        deployment.move_to(DeploymentState.STOPPED, "stopped by the operator", desired=DesiredState.STOPPED)
    else:
        deployment.move_to(DeploymentState.STOPPING, "stop sent to the agent", desired=DesiredState.STOPPED)
    stop_processes(deployment_id)
    return deployment.state


@shared_task(ignore_result=False, acks_late=True)
def stop_processes(deployment_id: str) -> int:
    """Stop the deployment's server on every node it runs on, the head first."""
    deployment = Deployment.objects.select_related("node").get(pk=deployment_id)
    frame = deploy.stop_frame(deployment)
    send_to_agent(deployment, frame)
    members = list(deployment.members.all())
    for member in members:
        send_to_node(member.node_id, frame)
    return 1 + len(members)


@shared_task(ignore_result=False, acks_late=True)
def restart_deployment(deployment_id: str, fault: str | None = None, by: str = "") -> str:
    """Restart; with `fault`, a simulated deployment restarts running that fault. A plain restart of a
    deployment running an injected fault clears it (how the demo's stall is resolved)."""
    deployment = Deployment.objects.select_related("node").get(pk=deployment_id)
    if fault is None and deploy.injected_fault(deployment) != "none":
        fault = "none"
    if fault is not None and deploy.injected_fault(deployment) != fault:  # the inject view records it first
        deployment = deploy.with_sim_fault(deployment_id, fault, by)
    # pid cleared: a restart that never reaches the agent is then re-sent as a launch (resend_lost_launches),
    # which an agent whose old server still runs answers with "already running".
    deployment.move_to(
        DeploymentState.LAUNCHING,
        "restart sent to the agent",
        exit_code=None,
        progress=None,
        pid=None,
        desired=DesiredState.RUNNING,
    )
    send_to_agent(deployment, deploy.restart_frame(deployment, new_launch=fault is not None))
    for member in deployment.members.select_related(
        "node"
    ):  # they rejoin the new head once it reports its port
        member.move_to(DeploymentState.STOPPING, "stopped for the restart")
        send_to_node(member.node_id, deploy.stop_frame(deployment))
    return deployment.state


def send_to_agent(deployment: Deployment, frame: str) -> None:
    """Hand a command to the head node's agent (if it is connected; on reconnect it gets its launches again)."""
    send_to_node(deployment.node_id, frame)
    async_to_sync(announce_deployment)(deployment.summary())


def send_to_node(node_id: int, frame: str) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    async_to_sync(layer.group_send)(agent_group(node_id), {"type": "agent.command", "frame": frame})


@shared_task(ignore_result=True)
def evaluate_fleet() -> int | None:
    """Open an alert for every problem found now; resolve the alerts whose problem is gone. Returns how many
    problems (None: skipped, the previous run is still going)."""
    with single_run("evaluate_fleet", settings.DETECT_LEASE_S) as mine:
        if not mine:
            return None
        problems, judged = detect.fleet_problems()
        enqueue(alerts.sync(problems, judged))
        return len(problems)


@shared_task(ignore_result=False)
def deliver_notifications() -> int:
    """Send the due alert notifications; any number of workers may run this at once (rows are claimed)."""
    return alerts.deliver_pending()


def enqueue(jobs: list[Job]) -> None:
    """Queue the tasks a service asked for (called once its transaction committed)."""
    for job in jobs:
        match job:
            case LaunchMembers(deployment_id):
                launch_members.delay(deployment_id)
            case StopProcesses(deployment_id):
                stop_processes.delay(deployment_id)
            case DeliverNotifications():
                queue_delivery()


def queue_delivery() -> None:
    try:
        deliver_notifications.delay()
    except (OperationalError, OSError) as exc:  # the beat sweep delivers the rows once the broker is back
        log.warning("could not queue alert delivery: %s", exc)

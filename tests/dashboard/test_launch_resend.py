"""Launches lost between the database and the agent (issue #4): a worker killed after marking a deployment
launching but before sending the launch leaves it launching for the broker's visibility timeout (an hour).
The beat task `resend_lost_launches` sends the launch again once the agent has said nothing for a grace
period; the agent launches once per deployment id, so a repeat is harmless."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from agents import protocol
from dashboard import deploy, tasks
from dashboard.choices import DeploymentState
from dashboard.live import agent_group
from dashboard.models import Deployment, DeploymentMember, Node
from tests.dashboard.test_deploy import across_both, planned, status
from tests.e2e import test_worker_killed as killed
from tests.personas import seed_server

GRACE_S = 30.0
LONG_AGO, JUST_NOW = 60, 5  # seconds since the row was marked launching


def aged(row: Deployment | DeploymentMember, seconds: float) -> Deployment | DeploymentMember:
    type(row).objects.filter(pk=row.pk).update(state_since=timezone.now() - timedelta(seconds=seconds))
    row.refresh_from_db()
    return row


def lost_now() -> tuple[list[str], list[int]]:
    heads, members = deploy.lost_launches(timezone.now(), GRACE_S)
    return [d.pk for d in heads], [m.pk for m in members]


def resent_events(deployment: Deployment) -> list[str]:
    return [d for d in deployment.events.values_list("detail", flat=True) if deploy.RESENT in d]


# ---- which launches count as lost ------------------------------------------------------------------------
@pytest.mark.django_db
def test_it_picks_only_deployments_launching_past_the_grace_period_without_word_from_the_agent(alice):
    seed_server()
    row = planned("Qwen3-VL-32B-Instruct")
    lost, fresh, answered, serving, planned_only, stopped = (
        deploy.create_deployment(row, 0, alice) for _ in range(6)
    )
    launching_task_saw = Deployment.objects.get(pk=stopped.pk)
    stopped.move_to(DeploymentState.STOPPING, "stop sent to the agent", desired="stopped")
    for deployment in (
        lost,
        fresh,
        answered,
        launching_task_saw,
    ):  # the task still had the row from before the stop
        deployment.move_to(DeploymentState.LAUNCHING, "launch sent to a30-seed")
    answered.apply_status(status(answered.pk, "launching", pid=4242, port=8123))  # the agent's first report
    serving.move_to(DeploymentState.SERVING)
    for deployment in (lost, answered, serving, planned_only, stopped):
        aged(deployment, LONG_AGO)
    aged(fresh, JUST_NOW)
    assert (
        Deployment.objects.get(pk=stopped.pk).state == DeploymentState.LAUNCHING
    )  # but the operator said stop
    assert lost_now() == ([lost.pk], [])


@pytest.mark.django_db
def test_it_picks_only_further_nodes_whose_sent_launch_got_no_answer(alice):
    first = across_both(alice)
    more = [deploy.create_deployment(first.plan_request, 0, alice) for _ in range(4)]
    lost, fresh, answered, unsent, stopped = everything = [first, *more]
    for deployment in everything:
        deployment.apply_status(status(deployment.pk, "loading", pid=100, port=8000))  # every head answered
    for deployment in (lost, fresh, answered, stopped):
        deployment.dist_port = 29517
        deploy.member_commands(deployment)  # what launch_members does before it sends
    member = {d.pk: d.members.select_related("node").get() for d in everything}
    deploy.apply_member_status(answered, member[answered.pk], status(answered.pk, "launching", pid=4242))
    member[unsent.pk].move_to(
        DeploymentState.LAUNCHING
    )  # with no launch made for it, there is nothing to re-send
    stopped.move_to(DeploymentState.STOPPING, "stop sent to the agent", desired="stopped")
    for deployment in (lost, answered, unsent, stopped):
        aged(member[deployment.pk], LONG_AGO)
    aged(member[fresh.pk], JUST_NOW)
    assert lost_now() == ([], [member[lost.pk].pk])


# ---- the beat task ----------------------------------------------------------------------------------------
def listen_to(node: Node) -> str:
    """A channel in the node's agent group, standing in for its connected agent."""
    channel = f"probe-{node.pk}"
    async_to_sync(get_channel_layer().group_add)(agent_group(node.pk), channel)
    return channel


def received(channel: str) -> list[dict]:
    async def drain() -> list[dict]:
        layer, frames = get_channel_layer(), []
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), 0.2)
            except TimeoutError:
                return frames
            frames.append(json.loads(message["frame"]))

    return async_to_sync(drain)()


@pytest.mark.django_db
def test_it_resends_each_lost_launch_to_its_node_and_records_it_once(alice, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.LAUNCH_RESEND_AFTER_S = GRACE_S
    lost_head = across_both(alice)
    lost_member = deploy.create_deployment(lost_head.plan_request, 0, alice)
    lost_head.move_to(DeploymentState.LAUNCHING, "launch sent")
    lost_member.apply_status(status(lost_member.pk, "loading", pid=100, port=8000))
    lost_member.dist_port = 29517
    deploy.member_commands(lost_member)
    member = aged(lost_member.members.select_related("node").get(), LONG_AGO)
    aged(lost_head, LONG_AGO)
    head_channel, member_channel = listen_to(lost_head.node), listen_to(member.node)

    assert [tasks.resend_lost_launches(), tasks.resend_lost_launches()] == [2, 2]  # until the agents answer

    sent = [(f["type"], f["deployment"]) for f in received(head_channel)]
    assert sent == [("canary", lost_head.pk), ("launch", lost_head.pk)] * 2  # the probe settings go first
    assert received(member_channel) == [member.launch, member.launch]
    assert protocol.Launch.model_validate(member.launch).options.node_rank == 1
    lost_head.refresh_from_db()
    assert lost_head.state == DeploymentState.LAUNCHING
    said = r"launch re-sent: no word from the agent for 6\d s"
    assert re.fullmatch(said, lost_head.detail), lost_head.detail
    assert [re.fullmatch(said, d) is not None for d in resent_events(lost_head)] == [
        True
    ]  # once, not per run
    assert [
        re.fullmatch(f"{member.node.name} \\(rank 1\\): {said}", d) is not None
        for d in resent_events(lost_member)
    ] == [True]

    lost_head.apply_status(status(lost_head.pk, "launching", pid=4242, port=8123))
    deploy.apply_member_status(lost_member, member, status(lost_member.pk, "launching", pid=4343))
    assert tasks.resend_lost_launches() == 0
    assert received(head_channel) == received(member_channel) == []


# ---- end to end: a worker killed mid-launch, then the beat task on another worker --------------------------
rig = (
    killed.rig
)  # ASGI server, a real agent on a simulated 4x A30 node, the channel layer on a Redis of its own
deployment = killed.deployment
KILLED_GRACE_S = 2


def drop_unacked(rig: killed.Rig, task_id: str) -> None:
    """The killed worker's message would come back an hour from now, in a later test's worker: drop it."""
    for tag, raw in rig.broker.hgetall("unacked").items():
        if json.loads(raw)[0]["headers"]["id"] == task_id:
            rig.broker.hdel("unacked", tag)
            rig.broker.zrem("unacked_index", tag)


@pytest.mark.slow
def test_it_launches_once_what_a_killed_worker_marked_launching_but_never_sent(rig, deployment):
    task_id = killed.kill_mid_launch(rig, deployment, rig.start_worker("first"), victim="whole worker")
    try:
        time.sleep(KILLED_GRACE_S)
        deployment.refresh_from_db()
        assert (deployment.state, deployment.pid, rig.spawns(deployment)) == ("launching", None, 0)
        assert rig.unacked(task_id), "the broker holds the killed run's message for the visibility timeout"
        rig.start_worker("second", LAUNCH_RESEND_AFTER_S=str(KILLED_GRACE_S))
        assert tasks.resend_lost_launches.delay().get(timeout=60) == 1
        killed.assert_one_server_serving(rig, deployment)
        assert len(resent_events(deployment)) == 1
        assert (
            tasks.resend_lost_launches.delay().get(timeout=60) == 0
        )  # the agent answered: nothing more goes out
    finally:
        drop_unacked(rig, task_id)

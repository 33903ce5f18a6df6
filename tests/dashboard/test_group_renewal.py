"""Sockets that stay open longer than the channel layer's group expiry still get what is sent to their group:
a deploy's launch reaches an agent connected for weeks, a fleet page left open hears of nodes (dashboard/groups.py).
On the real Redis channel layer, its expiry shortened to 2 s."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.layers import get_channel_layer
from channels.testing.websocket import WebsocketCommunicator

from dashboard import groups
from dashboard.consumers import FleetConsumer
from dashboard.live import FLEET_GROUP, agent_group
from dashboard.models import Node
from layercake.settings import channel_layers
from tests.agent_socket import connect, hello, make_node, say

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXPIRY_S = 2


@pytest.fixture(autouse=True)
def short_lived_groups(settings, redis_url):
    layers = channel_layers(redis_url)
    layers["default"]["CONFIG"]["group_expiry"] = EXPIRY_S
    settings.CHANNEL_LAYERS = layers
    settings.INGEST_FLUSH_SECONDS = 0.01


async def outlive_the_expiry() -> None:
    await asyncio.sleep(
        EXPIRY_S * 2 + 1.5
    )  # group_send drops members older than the expiry, in whole seconds


async def test_it_delivers_a_command_to_an_agent_connected_longer_than_the_group_expiry(alice):
    agent = await connect(await make_node())
    assert (await say(agent, hello()))["type"] == "welcome"
    node = await Node.objects.aget(name="a30-seed")
    await outlive_the_expiry()
    frame = json.dumps({"type": "stop", "v": 1, "deployment": "d1"})
    await get_channel_layer().group_send(agent_group(node.pk), {"type": "agent.command", "frame": frame})
    assert json.loads(await agent.receive_from(timeout=5)) == json.loads(frame)
    await agent.disconnect()


async def test_it_keeps_an_open_fleet_page_in_the_fleet_group(alice):
    page = WebsocketCommunicator(FleetConsumer.as_asgi(), "/ws/fleet/")
    page.scope["user"] = alice
    assert (await page.connect())[0]
    await outlive_the_expiry()
    await get_channel_layer().group_send(
        FLEET_GROUP, {"type": "fleet.node", "node": 7, "name": "a30-seed", "status": "stale"}
    )
    assert json.loads(await page.receive_from(timeout=5))["status"] == "stale"
    await page.disconnect()


async def test_it_stops_renewing_a_socket_that_left():
    layer = get_channel_layer()
    held = groups.Memberships()
    await held.join(layer, "agent.1", "a.one")
    await held.join(layer, "agent.2", "a.two")
    await held.leave(layer, "agent.1", "a.one")
    held.forget("agent.2", "a.two")  # the process stopping: no Redis work, no renewal
    assert await held.renew() == 0
    await asyncio.sleep(groups.renew_every(layer) + 0.3)
    assert held.renewer.done()  # nothing held: the renewer ends instead of sleeping on

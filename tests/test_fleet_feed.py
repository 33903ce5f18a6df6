"""The browsers' live feed: a stored batch becomes one fleet.update, JSON-encoded once for every browser."""

from __future__ import annotations

import json

import pytest
from channels.testing.websocket import WebsocketCommunicator

from agents import protocol
from dashboard import ingest
from dashboard.consumers import FleetConsumer
from dashboard.live import FleetFanout, announce_deployment

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]  # consumers close old connections


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


class LoggedIn:
    is_authenticated = True


async def browser() -> WebsocketCommunicator:
    comm = WebsocketCommunicator(FleetConsumer.as_asgi(), "/ws/fleet/")
    comm.scope["user"] = LoggedIn()
    connected, _ = await comm.connect()
    assert connected
    return comm


def stored_batch(node_id: int, t: float) -> list[ingest.Pending]:
    gpu = protocol.GpuSample(index=0, util_gpu=87.46, util_mem=40, mem_used_mib=70000.04, mem_free_mib=11000,
                             temp_c=71.26, power_w=512.5)
    message = protocol.Samples(type="samples", v=1, seq=3, t=t, gpus=[gpu])

    async def on_stored(_: int) -> None:
        return None

    return [ingest.Pending(node_id, 3, ingest.sample_rows(message, {0: 41}), [], on_stored, sampled_at=t)]


async def test_it_sends_every_browser_the_newest_values_of_each_node_to_a_tenth():
    first, second = await browser(), await browser()
    try:
        FleetFanout(period=0.5).record(stored_batch(7, 1_700_000_000.5))
        messages = [json.loads(await comm.receive_from(timeout=5)) for comm in (first, second)]
    finally:
        await first.disconnect()
        await second.disconnect()
    assert messages[0] == messages[1]
    assert set(messages[0]) == {"type", "sent", "nodes", "deployments"} and messages[0]["type"] == "fleet.update"
    assert messages[0]["nodes"] == [{"node": 7, "t": 1_700_000_000.5,
                                     "gpus": {"41": [87.5, 70000.0, 81000.0, 71.3, 512.5, 40.0]}}]
    assert messages[0]["deployments"] == []


async def test_it_sends_a_server_side_deployment_change_in_the_same_shape():
    comm = await browser()
    try:
        await announce_deployment({"id": "d-1", "state": "launching"})
        message = json.loads(await comm.receive_from(timeout=5))
    finally:
        await comm.disconnect()
    assert message["type"] == "fleet.update" and message["nodes"] == []
    assert message["deployments"] == [{"id": "d-1", "state": "launching"}]

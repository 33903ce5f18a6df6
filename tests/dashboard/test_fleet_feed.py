"""The browsers' live feed: a stored batch becomes one tick, each node's values JSON-encoded once, and each
page gets the part it subscribed to (dashboard/subscriptions.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing.websocket import WebsocketCommunicator
from django.test import Client

from agents import protocol
from dashboard import consumers, ingest
from dashboard.consumers import FleetConsumer
from dashboard.live import TICKS_GROUP, FleetFanout, Watching, announce_deployment
from dashboard.models import GpuSample, Node
from layercake.asgi import application

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]  # consumers close old connections


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


async def browser(user, subscribe: dict | None = None) -> WebsocketCommunicator:
    """A logged-in page's socket; with `subscribe`, once the server confirmed it and its hub gets ticks."""
    comm = WebsocketCommunicator(FleetConsumer.as_asgi(), "/ws/fleet/")
    comm.scope["user"] = user
    connected, _ = await comm.connect()
    assert connected
    if subscribe is not None:
        await comm.send_to(text_data=json.dumps({"type": "subscribe", "ref": "s", **subscribe}))
        reply = json.loads(await comm.receive_from(timeout=5))
        assert reply["type"] == "fleet.subscribed", reply
        await hub_listening()
    return comm


async def hub_listening() -> None:
    """Until the hub is in the ticks and has told the fan-outs what its pages show (live.Watching)."""
    layer = get_channel_layer()
    async with asyncio.timeout(5):
        while not layer.groups.get(TICKS_GROUP) or not await Watching(layer).read():
            await asyncio.sleep(0.01)


async def nodes(*names: str) -> list[int]:
    return [(await database_sync_to_async(Node.objects.create)(name=name)).pk for name in names]


def stored_batch(node_id: int, t: float, gpu_id: int = 41) -> list[ingest.Pending]:
    gpu = protocol.GpuReading(
        index=0,
        util_gpu=87.46,
        util_mem=40,
        mem_used_mib=70000.04,
        mem_free_mib=11000,
        temp_c=71.26,
        power_w=512.5,
    )
    message = protocol.Samples(type="samples", v=1, seq=3, t=t, gpus=[gpu])

    async def on_stored(_: int) -> None:
        return None

    rows = ingest.sample_rows(message, {0: gpu_id})
    return [ingest.Pending(node_id, 3, rows, [], on_stored, sampled_at=t)]


async def test_it_sends_every_browser_that_shows_a_node_its_newest_values_to_a_tenth(alice):
    [node] = await nodes("n7")
    first = await browser(alice, {"nodes": [node]})
    second = await browser(alice, {"nodes": "all"})
    try:
        FleetFanout(period=0.5).record(stored_batch(node, 1_700_000_000.5))
        messages = [json.loads(await comm.receive_from(timeout=5)) for comm in (first, second)]
    finally:
        await first.disconnect()
        await second.disconnect()
    assert messages[0] == messages[1]
    assert (
        set(messages[0]) == {"type", "sent", "keys", "nodes", "deployments"}
        and messages[0]["type"] == "fleet.update"
    )
    assert messages[0]["nodes"] == [
        {"node": node, "t": 1_700_000_000.5, "gpus": {"41": [87.5, 70000.0, 81000.0, 71.3, 512.5, 40.0]}}
    ]
    named = dict(zip(messages[0]["keys"], messages[0]["nodes"][0]["gpus"]["41"], strict=True))
    assert named == {
        "util": 87.5,
        "mem_used": 70000.0,
        "mem_total": 81000.0,
        "temp": 71.3,
        "power": 512.5,
        "util_mem": 40.0,
    }
    assert messages[0]["deployments"] == []


async def test_it_sends_a_server_side_deployment_change_in_the_same_shape(alice):
    comm = await browser(alice)
    try:
        await announce_deployment({"id": "d-1", "state": "launching"})
        message = json.loads(await comm.receive_from(timeout=5))
    finally:
        await comm.disconnect()
    assert message["type"] == "fleet.update" and message["nodes"] == []
    assert message["deployments"] == [{"id": "d-1", "state": "launching"}]


def strict_json(text: str):
    """Parse as a browser's JSON.parse does: NaN and Infinity are not JSON."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


async def test_it_sends_browsers_strict_json_when_a_value_is_not_finite(alice):
    [node] = await nodes("n7")
    batch = stored_batch(node, 1_700_000_000.5)
    batch[0].rows[0] = batch[0].rows[0]._replace(power_w=float("inf"), mem_free_mib=float("nan"))
    comm = await browser(alice, {"nodes": [node]})
    try:
        FleetFanout(period=0.5).record(batch)
        message = strict_json(await comm.receive_from(timeout=5))
    finally:
        await comm.disconnect()
    assert message["nodes"][0]["gpus"]["41"] == [87.5, 70000.0, None, 71.3, None, 40.0]


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def browser_from(origin: bytes, cookie: bytes) -> bool:
    """Whether the feed takes a logged-in browser's socket from this page origin (server on localhost:8000)."""
    headers = [(b"host", b"localhost:8000"), (b"origin", origin), (b"cookie", cookie)]
    comm = WebsocketCommunicator(application, "/ws/fleet/", headers=headers)
    connected, _ = await comm.connect()
    await comm.disconnect()
    return connected


async def test_it_takes_browser_sockets_only_from_its_own_origin_port_included(alice):
    cookie = await database_sync_to_async(session_cookie)(alice)
    assert await browser_from(b"http://localhost:8000", cookie)
    assert not await browser_from(b"http://localhost:9999", cookie)
    assert not await browser_from(b"http://localhost", cookie)
    assert not await browser_from(b"http://evil.example:8000", cookie)
    assert not await browser_from(b"null", cookie)


async def test_it_shows_a_value_to_pages_before_it_is_stored_and_acks_it_only_once_stored(alice, settings):
    """Waiting for the flush and the store put 0.1-0.4 s (and SQLite's write lock) on every value's way to a
    page; the ack still waits for the store."""
    settings.INGEST_FLUSH_SECONDS = 3600  # no flush during the test: the value is not in the database
    [node] = await nodes("n9")
    page = await browser(alice, {"nodes": [node]})
    acked: list[int] = []
    [item] = stored_batch(node, 1_700_000_000.5)
    item.on_stored = lambda seq: acked.append(seq) or asyncio.sleep(0)
    try:
        consumers.ingest_buffer().add(item)
        message = json.loads(await page.receive_from(timeout=5))
    finally:
        await page.disconnect()
    assert message["type"] == "fleet.update" and [n["node"] for n in message["nodes"]] == [node]
    assert acked == [] and not await database_sync_to_async(GpuSample.objects.exists)()

"""Admission of hellos in a reconnect wave (dashboard.admission): a bounded number at a time; an agent told
to come back (the message bus away) is told when; a stopping server leaves its nodes connected."""

import asyncio
import json

import pytest

from dashboard import consumers
from dashboard.admission import HelloGate
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    make_node,
    say,
)


@pytest.mark.asyncio
async def test_it_works_on_at_most_the_bound_of_hellos_at_once():
    gate, inside, most = HelloGate(concurrent=3), 0, 0

    async def one_hello():
        nonlocal inside, most
        gate.admit()
        async with gate.turn():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1
        gate.leave()

    await asyncio.gather(*(one_hello() for _ in range(20)))
    assert most == 3 and gate.waiting == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_tells_an_agent_when_to_come_back_while_the_message_bus_is_away(monkeypatch):
    from tests.dashboard.test_agent_consumer import UnreachableLayer

    monkeypatch.setattr("channels.consumer.get_channel_layer", lambda alias="default": UnreachableLayer())
    comm = await connect(await make_node())
    reply = json.loads(await comm.receive_from())
    assert reply["code"] == "busy" and reply["retry_after_s"] == consumers.BUS_RETRY_S
    assert (await comm.receive_output())["code"] == 1013


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_welcomes_in_turn_and_leaves_the_queue_empty():
    gate = consumers.hello_gate()
    comms = [await connect(await make_node(f"n{i}")) for i in range(5)]
    assert gate.waiting == 5
    replies = await asyncio.gather(*(say(c, hello(boot=f"boot-000{i}")) for i, c in enumerate(comms)))
    assert [r["type"] for r in replies] == ["welcome"] * 5, replies
    assert gate.waiting == 0
    for comm in comms:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(("code", "still_connected"), [(consumers.SERVER_STOPPING, True), (1000, False)])
async def test_it_leaves_the_node_connected_when_the_server_stops_not_the_agent(code, still_connected):
    from channels.db import database_sync_to_async

    from dashboard.models import Node

    comm = await connect(await make_node("restarting"))
    assert (await say(comm, hello(boot="boot-0001")))["type"] == "welcome"
    await comm.disconnect(code=code)
    await asyncio.sleep(0.1)
    node = await database_sync_to_async(Node.objects.get)(name="restarting")
    assert node.connected is still_connected


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_announces_a_wave_of_welcomed_nodes_in_few_messages_not_one_each():
    from channels.layers import get_channel_layer

    from dashboard.live import FLEET_GROUP

    layer = get_channel_layer()
    browser = await layer.new_channel()
    await layer.group_add(FLEET_GROUP, browser)
    comms = [await connect(await make_node(f"wave{i}")) for i in range(12)]
    replies = await asyncio.gather(*(say(c, hello(boot=f"boot-{i:04}")) for i, c in enumerate(comms)))
    assert [r["type"] for r in replies] == ["welcome"] * 12, replies
    messages = []
    while len(announced := [n for m in messages for n in m.get("nodes", [m])]) < 12:
        messages.append(await asyncio.wait_for(layer.receive(browser), timeout=5))
    assert {m["type"] for m in messages} == {"fleet.nodes"}, messages
    assert sorted(n["name"] for n in announced) == sorted(f"wave{i}" for i in range(12))
    assert {n["status"] for n in announced} == {"online"} and len(messages) < 12
    for comm in comms:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_welcomes_a_wave_in_batches_larger_than_eight(monkeypatch):
    from dashboard import ingest

    sizes, welcome_nodes = [], ingest.welcome_nodes

    def counted(hellos):
        sizes.append(len(hellos))
        return welcome_nodes(hellos)

    monkeypatch.setattr(ingest, "welcome_nodes", counted)  # before this test's loop makes its batcher
    comms = [await connect(await make_node(f"big{i}")) for i in range(30)]
    replies = await asyncio.gather(*(say(c, hello(boot=f"boot-{i:04}")) for i, c in enumerate(comms)))
    assert [r["type"] for r in replies] == ["welcome"] * 30, replies
    assert sum(sizes) == 30 and max(sizes) > 8, sizes  # 8 at a time: 30 hellos were at least 4 trips
    for comm in comms:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_keeps_welcomed_agents_connected_when_their_announcement_fails(monkeypatch):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from tests.agent_socket import samples

    async def unreachable(nodes):
        raise RedisConnectionError("the message bus is away")

    monkeypatch.setattr(consumers, "announce_nodes", unreachable)
    comms = [await connect(await make_node(f"quiet{i}")) for i in range(3)]
    replies = await asyncio.gather(*(say(c, hello(boot=f"boot-{i:04}")) for i, c in enumerate(comms)))
    assert [r["type"] for r in replies] == ["welcome"] * 3, replies
    for comm in comms:
        assert await say(comm, samples(1)) == {"type": "ack", "v": 1, "seq": 1}
        await comm.disconnect()

"""Admission of hellos in a reconnect wave (dashboard.admission): a bounded number at a time, and agents
that would wait longer than they wait for a welcome are told when to come back."""

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
        assert gate.admit() is None
        async with gate.turn():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1
        gate.leave()

    await asyncio.gather(*(one_hello() for _ in range(20)))
    assert most == 3 and gate.waiting == 0


@pytest.mark.asyncio
async def test_it_learns_its_welcome_rate_from_a_queue():
    gate = HelloGate(concurrent=2)
    for _ in range(12):
        gate.admit()

    async def one_hello():
        async with gate.turn():
            await asyncio.sleep(0.02)
        gate.leave()

    await asyncio.gather(*(one_hello() for _ in range(12)))
    assert gate.seconds_per_hello is not None and 0.005 < gate.seconds_per_hello < 0.05


def test_it_defers_a_connection_that_would_wait_longer_than_the_bound():
    gate = HelloGate(max_wait_s=15.0, seconds_per_hello=0.02)  # 750 x 20 ms = 15 s
    admitted = [gate.admit() for _ in range(751)]
    assert admitted.count(None) == 751  # 750 ahead at 20 ms each: 15 s, still within the bound
    wait = gate.admit()
    assert wait is not None and 15.0 < wait <= 1.5 * 751 * 0.02 and gate.waiting == 751
    gate.leave()
    assert gate.waiting == 750


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_it_tells_an_agent_when_to_come_back_when_the_queue_is_too_long(monkeypatch):
    monkeypatch.setattr(consumers, "hello_gate", lambda: HelloGate(waiting=1000, seconds_per_hello=0.05))
    comm = await connect(await make_node())
    reply = json.loads(await comm.receive_from())
    assert reply["code"] == "busy" and 50.0 <= reply["retry_after_s"] <= 75.0
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

"""What the agent endpoint tells /metrics's live state (in-process, in-memory layer): readings, XIDs, sockets."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async

from dashboard import consumers, telemetry
from dashboard.models import Gpu
from tests import agent_socket as agent
from tests.agent_socket import close_the_consumers_connection, in_memory_layer  # noqa: F401 (autouse fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def live(monkeypatch):
    state = telemetry.LiveState()
    monkeypatch.setattr(consumers, "LIVE", state)
    return state


def with_xids(message: dict, index: int, codes: list[int]) -> dict:
    message["gpus"][index]["xids"] = codes
    message["gpus"][index]["temp_c"] = 61
    return message


async def test_it_keeps_the_newest_reading_and_counts_xids_of_what_was_stored(live):
    comm = await agent.connect(await agent.make_node())
    assert (await agent.say(comm, agent.hello()))["type"] == "welcome"
    assert (live.snapshot().agents_connected, live.snapshot().sockets["agent"]) == (1, 1)
    assert (await agent.say(comm, with_xids(agent.samples(1), 1, [79, 48])))["type"] == "ack"
    assert (await agent.say(comm, agent.samples(2)))["type"] == "ack"
    gpu1 = await database_sync_to_async(lambda: Gpu.objects.get(index=1).pk)()
    snap = live.snapshot()
    assert snap.xid_events == {gpu1: 2} and snap.last_xid == {gpu1: 48}
    assert snap.readings[gpu1].seq == 2 and snap.readings[gpu1].temp_c == 35  # the newer sample, not seq 1's
    assert snap.samples_stored == 4 and snap.buffer_rows == 0
    await comm.disconnect()
    await asyncio.sleep(0.1)
    assert (live.snapshot().agents_connected, live.snapshot().sockets["agent"]) == (0, 0)


async def test_it_keeps_a_newer_reading_when_an_older_sample_is_stored_after_it(live):
    comm = await agent.connect(await agent.make_node())
    await agent.say(comm, agent.hello())
    newer, older = agent.samples(1), agent.samples(2)
    newer["t"], older["t"] = older["t"], newer["t"]
    newer["gpus"][0]["temp_c"] = 50
    assert (await agent.say(comm, newer))["type"] == "ack"
    assert (await agent.say(comm, older))["type"] == "ack"
    gpu0 = await database_sync_to_async(lambda: Gpu.objects.get(index=0).pk)()
    assert live.snapshot().readings[gpu0].temp_c == 50
    await comm.disconnect()


async def test_it_counts_a_refused_socket_only_while_it_is_open(live):
    await agent.make_node()
    comm = await agent.connect("lc_wrong")
    assert json.loads(await comm.receive_from())["code"] == "unauthorized"
    assert live.snapshot().sockets["agent"] == 1 and live.snapshot().agents_connected == 0
    await comm.disconnect()  # the server's disconnect event after its close
    assert live.snapshot().sockets["agent"] == 0

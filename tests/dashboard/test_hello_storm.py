"""A reconnect wave: a known node's hello flushes the ingest buffer only for its own frames in flight."""

import asyncio
import json

import pytest

from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    counts,
    hello,
    in_memory_layer,
    make_node,
    samples,
    say,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_it_flushes_on_hello_only_what_that_nodes_earlier_connection_left(settings):
    settings.INGEST_FLUSH_SECONDS = 30  # nothing is stored unless a hello flushes it
    first = await connect(await make_node("busy"))
    assert (await say(first, hello(boot="boot-busy-1")))["type"] == "welcome"
    await first.send_to(text_data=json.dumps(samples(1)))
    await asyncio.sleep(0.2)
    other = await connect(await make_node("other"))
    assert (await say(other, hello(boot="boot-other")))["type"] == "welcome"
    assert await counts() == (0, 0)  # another node's hello left the buffer alone
    again = await connect(await another_token("busy"))
    welcome = await say(again, hello(boot="boot-busy-1"))
    assert welcome["last_seq"] == 1 and (await counts())[0] == 2  # its own frames were stored first
    for comm in (first, other, again):
        await comm.disconnect()


async def another_token(name: str) -> str:
    from channels.db import database_sync_to_async

    from dashboard.models import AgentToken, Node

    return await database_sync_to_async(lambda: AgentToken.issue(Node.objects.get(name=name))[1])()

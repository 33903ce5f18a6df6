"""Over the agent websocket: a hello with a bogus engine version is refused naming the field and stores nothing;
a good one stores the engines on the node."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from dashboard.models import Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    make_node,
    say,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@database_sync_to_async
def stored_node() -> Node:
    return Node.objects.get()


@pytest.mark.parametrize(
    "version", ["0.7." + "9" * 70, "0.7.3 && reboot", "<b>0.7.3</b>"], ids=["oversized", "shell", "markup"]
)
async def test_it_refuses_a_hello_with_a_bogus_engine_version_and_stores_nothing(version: str) -> None:
    comm = await connect(await make_node())
    reply = await say(comm, {**hello(), "engines": [{"backend": "vllm", "version": version}]})
    assert (reply["type"], reply["code"]) == ("error", "invalid")
    assert reply["message"].startswith("engines.0.version: String should match pattern")
    node = await stored_node()
    assert (node.engines, node.boot_id, node.connected) == ([], "", False)
    await comm.disconnect()


async def test_it_stores_the_engines_a_hello_reports() -> None:
    comm = await connect(await make_node())
    engines = [{"backend": "vllm", "version": "0.7.3", "detail": ""}, {"backend": "sglang", "version": None}]
    welcome = await say(comm, {**hello(), "engines": engines})
    assert welcome["type"] == "welcome"
    node = await stored_node()
    assert node.engines == [engines[0], {"backend": "sglang", "version": None, "detail": ""}]
    await comm.disconnect()

"""The agents' database thread (dashboard/agent_db.py): the agent endpoint never waits for asgiref's sync thread."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from dashboard.agent_db import agent_database
from dashboard.models import GpuSample, Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    make_node,
    samples,
    say,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def node_state() -> tuple[int, int, bool]:
    node = Node.objects.get()
    return GpuSample.objects.count(), node.last_seq, node.connected


async def test_it_welcomes_stores_and_acks_while_asgirefs_sync_thread_is_held():
    """A slow page or a browser's database hop holds asgiref's one sync thread; before, the agent's token
    check, hello and flush queued behind it (a login page behind 8,000 sample writes, the other way round)."""
    token = await make_node()
    release = threading.Event()
    held = asyncio.ensure_future(sync_to_async(release.wait)())  # thread_sensitive: asgiref's thread
    try:
        comm = await connect(token)
        assert (await say(comm, hello()))["type"] == "welcome"
        assert await say(comm, samples(1)) == {"type": "ack", "v": 1, "seq": 1}
        assert await agent_database(node_state)() == (2, 1, True)
        await comm.disconnect()
        assert await agent_database(node_state)() == (2, 1, False)
        assert not held.done()  # the thread was held all along
    finally:
        release.set()
        await held


async def test_it_runs_every_call_on_one_thread_in_order():
    """One thread: the agent path relies on its calls running one at a time, in the order they were made."""
    seen: list[tuple[int, str]] = []

    def note(k: int) -> None:
        seen.append((k, threading.current_thread().name))

    await asyncio.gather(*(agent_database(note)(k) for k in range(20)))
    assert [k for k, _ in seen] == list(range(20))
    assert len({name for _, name in seen}) == 1 and seen[0][1].startswith("agent-db")

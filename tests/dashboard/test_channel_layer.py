"""The channel layer under a burst: more concurrent Redis operations than the pool has connections."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer

from dashboard.channel_layer import POOL_SIZE
from layercake.settings import channel_layers

pytestmark = pytest.mark.asyncio


async def test_it_waits_for_a_free_redis_connection_instead_of_failing(redis_url, settings):
    settings.CHANNEL_LAYERS = channel_layers(redis_url)
    layer = get_channel_layer()
    burst = 3 * POOL_SIZE  # as when hundreds of agents say hello at once after a server restart
    channels = [await layer.new_channel() for _ in range(burst)]
    try:
        await asyncio.gather(*(layer.group_add(f"agent-{i}", name) for i, name in enumerate(channels)))
        await asyncio.gather(
            *(layer.group_send(f"agent-{i}", {"type": "ping", "i": i}) for i in range(burst))
        )
        received = [await layer.receive(name) for name in channels[:3]]
        assert [m["i"] for m in received] == [0, 1, 2]
    finally:
        await layer.flush()
        await layer.close_pools()

"""The Redis channel layer, with a connection pool that waits for a free connection instead of failing.

redis-py 8's asyncio pool allows 100 connections and raises MaxConnectionsError past that. When hundreds
of agents connect at once (a server restart), each hello's group_add and announce_node took a connection;
measured with 300-1,000 simulated agents, thousands of hellos failed that way, each failure closed the
agent's socket and the agent's reconnect made the next wave: the server stayed at 100 % CPU and the
browser feed fell tens of seconds behind. A blocking pool queues those operations instead.
"""

from __future__ import annotations

from channels_redis.core import RedisChannelLayer as BaseRedisChannelLayer
from redis.asyncio import BlockingConnectionPool, ConnectionPool

POOL_SIZE = 100  # redis-py's own default limit
POOL_WAIT_SECONDS = 20.0


class RedisChannelLayer(BaseRedisChannelLayer):
    def create_pool(self, index: int) -> ConnectionPool:
        host = dict(self.hosts[index])
        if "address" not in host:  # sentinel or host/port entries: channels_redis's own pool
            return super().create_pool(index)
        host.setdefault("max_connections", POOL_SIZE)
        host.setdefault("timeout", POOL_WAIT_SECONDS)
        return BlockingConnectionPool.from_url(host.pop("address"), **host)

"""Channel-layer group memberships of long-lived sockets, renewed before the layer forgets them.

Both channel layers end a membership `group_expiry` after its group_add (default 86,400 s), and channels-redis
lets the whole group key expire that long after the last group_add. An agent stays connected for weeks: a day
after its hello its node's group was empty, and a deploy's launch (or stop) sent to the group reached no one;
a wall-screen fleet page stopped hearing of nodes and alerts. Each process renews the memberships its sockets
hold, every quarter of the expiry, in one task; a socket that leaves is forgotten first.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from dashboard.per_loop import PerLoop

DEFAULT_GROUP_EXPIRY_S = 86_400  # channels' and channels-redis's default
RENEW_FRACTION = 0.25  # renewed this far into the expiry: three more tries before a membership lapses

log = logging.getLogger(__name__)


@dataclass
class Memberships:
    """The groups this process's long-lived sockets are in: (group, channel) -> the layer that holds it."""

    held: dict[tuple[str, str], Any] = field(default_factory=dict)
    renewer: asyncio.Task | None = None

    async def join(self, layer: Any, group: str, channel: str) -> None:
        await layer.group_add(group, channel)
        self.held[(group, channel)] = layer
        if self.renewer is None or self.renewer.done():
            self.renewer = asyncio.get_running_loop().create_task(self.renew_forever(renew_every(layer)))

    def forget(self, group: str, channel: str) -> None:
        """Stop renewing (the socket is gone; the layer drops the membership at its expiry)."""
        self.held.pop((group, channel), None)

    async def leave(self, layer: Any, group: str, channel: str) -> None:
        self.forget(group, channel)
        await layer.group_discard(group, channel)

    async def renew_forever(self, every: float) -> None:
        while self.held:
            await asyncio.sleep(every)
            await self.renew()

    async def renew(self) -> int:
        """Add every held membership again (its expiry starts over); the memberships renewed."""
        renewed = 0
        for (group, channel), layer in list(self.held.items()):
            if (group, channel) not in self.held:  # left while an earlier one was renewed
                continue
            try:
                await layer.group_add(group, channel)
                renewed += 1
            except (RedisError, OSError) as exc:  # Redis restarting: the next round tries again
                log.warning("could not renew %s in %s: %s", channel, group, exc)
        return renewed


def renew_every(layer: Any) -> float:
    return getattr(layer, "group_expiry", DEFAULT_GROUP_EXPIRY_S) * RENEW_FRACTION


memberships = PerLoop(Memberships)  # this process's (event loop's)

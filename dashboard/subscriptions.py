"""Per-page subscriptions: each browser page tells the server what it shows, and gets only that.

A node page shows one node; a fleet page shows one page of node cards and the heatmap of every GPU, which
needs only each GPU's colour. So a page sends `{"type": "subscribe", "nodes": [ids], "heatmap": bool}`
(or `"nodes": "all"`, for tools that watch the whole fleet) and gets fleet ticks holding only those nodes,
plus, if it asked, the heatmap's colours.

Ticks cross processes once per process, not once per browser: every server process's fan-out sends its tick
to TICKS_GROUP, whose members are one `LiveHub` per process (not the browsers). The hub slices each tick for
the browsers connected to its own process and hands them their part. Each node's values arrive JSON-encoded
once (live.tick_message), so a page's message is a join of strings, not an encoding per browser.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from redis.exceptions import RedisError

from dashboard.live import POINT_KEYS, TICKS_GROUP
from dashboard.models import Node

MAX_NODES = 200  # a fleet page shows 50 cards; a page asking for more than this asks for "all"
# A page that just subscribed gets the values the hub holds of nodes that reported this recently.
FRESH_S = 5.0
REJOIN_S = 3600.0  # group memberships expire in Redis (a day by default): the hub renews its own
KEYS_JSON = json.dumps(list(POINT_KEYS))
log = logging.getLogger(__name__)


class Refused(Exception):
    """A subscribe message the server will not follow; the message says what is wrong with it."""


@dataclass(frozen=True)
class Subscription:
    nodes: frozenset[str] | None  # node ids as the ticks key them; None: every node
    heatmap: bool = False

    def describe(self) -> dict[str, Any]:
        nodes = "all" if self.nodes is None else sorted(int(n) for n in self.nodes)
        return {"nodes": nodes, "heatmap": self.heatmap}


def parse(data: dict[str, Any]) -> Subscription:
    """The subscription a browser's message asks for; Refused naming what is wrong."""
    unknown = set(data) - {"type", "ref", "nodes", "heatmap"}
    if unknown:
        raise Refused(f"subscribe takes nodes and heatmap, not {', '.join(sorted(unknown))[:80]}")
    heatmap = data.get("heatmap", False)
    if not isinstance(heatmap, bool):
        raise Refused("heatmap must be true or false")
    nodes = data.get("nodes", [])
    if nodes == "all":
        return Subscription(None, heatmap)
    if not isinstance(nodes, list) or not all(type(n) is int and n > 0 for n in nodes):
        raise Refused('nodes must be "all" or a list of node ids (whole numbers from 1)')
    if len(nodes) > MAX_NODES:
        raise Refused(f'nodes lists at most {MAX_NODES} node ids (or "all"), not {len(nodes)}')
    return Subscription(frozenset(str(n) for n in nodes), heatmap)


def authorize(user: Any, subscription: Subscription) -> None:
    """Refused unless the user (read again: deactivated since the socket opened?) may see these nodes.

    Every active user may see every node (dashboard.roles: viewers see everything); ids that name no node
    are refused, so a page's mistake shows instead of silently getting nothing.
    """
    if not get_user_model().objects.filter(pk=user.pk, is_active=True).exists():
        raise Refused("this account may not watch the fleet")
    if subscription.nodes:
        wanted = {int(n) for n in subscription.nodes}
        missing = wanted - set(Node.objects.filter(pk__in=wanted).values_list("pk", flat=True))
        if missing:
            raise Refused(f"no node with id {', '.join(map(str, sorted(missing)))[:200]}")


class Watcher(Protocol):
    """A browser's socket as the hub sees it (consumers.FleetConsumer)."""

    def deliver(self, text: str) -> None: ...


def update_text(parts: Iterable[str], sent: float) -> str:
    """A "fleet.update" (live.fleet_update's shape) from nodes' already encoded values."""
    nodes = ",".join(parts)
    return f'{{"type":"fleet.update","sent":{sent!r},"keys":{KEYS_JSON},"nodes":[{nodes}],"deployments":[]}}'


class LiveHub:
    """One per server process (event loop): receives every tick once and gives each local page its part."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.watchers: dict[Watcher, Subscription] = {}
        self.latest: dict[
            str, tuple[float, str]
        ] = {}  # node id -> (when received, its newest values encoded)
        self.cells: dict[str, int] = {}  # GPU id -> heatmap colour (0-10 by utilization)
        self.task: asyncio.Task | None = None

    def watch(self, watcher: Watcher, subscription: Subscription) -> None:
        """Start (or change) what a page gets; it gets at once the newest values it did not have."""
        before = self.watchers.get(watcher)
        self.watchers[watcher] = subscription
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.run())
        had = set() if before is None else (set(self.latest) if before.nodes is None else before.nodes)
        wanted = self.latest.keys() if subscription.nodes is None else subscription.nodes
        fresh = time.monotonic() - FRESH_S  # an older value would show a silent node as live
        parts = [self.latest[n][1] for n in wanted if n not in had and self.latest.get(n, (0.0,))[0] > fresh]
        if parts:
            watcher.deliver(update_text(parts, time.time()))
        if subscription.heatmap and not (before and before.heatmap) and self.cells:
            watcher.deliver(heat_text(self.cells, time.time()))

    def forget(self, watcher: Watcher) -> None:
        self.watchers.pop(watcher, None)

    async def run(self) -> None:
        channel = await self.layer.new_channel()
        while True:
            try:
                await self.layer.group_add(TICKS_GROUP, channel)
                joined = time.monotonic()
                while time.monotonic() - joined < REJOIN_S:
                    self.dispatch(await self.layer.receive(channel))
            except (RedisError, OSError) as exc:  # Redis restarting: ticks resume when it is back
                log.warning("live hub: %s; joining the ticks again in 1 s", exc)
                await asyncio.sleep(1)

    def dispatch(self, tick: dict[str, Any]) -> None:
        nodes: dict[str, str] = tick["nodes"]
        now = time.monotonic()
        self.latest.update((node, (now, text)) for node, text in nodes.items())
        heat = self.heat_changed(tick["cells"], tick["sent"])
        whole = None
        for watcher, subscription in list(self.watchers.items()):
            if subscription.nodes is None:
                whole = whole or update_text(nodes.values(), tick["sent"])
                watcher.deliver(whole)
            else:
                shown = subscription.nodes if len(subscription.nodes) < len(nodes) else nodes.keys()
                parts = [nodes[n] for n in shown if n in nodes and n in subscription.nodes]
                if parts:
                    watcher.deliver(update_text(parts, tick["sent"]))
            if heat and subscription.heatmap:
                watcher.deliver(heat)

    def heat_changed(self, cells: list[int], sent: float) -> str:
        """The heatmap message of the GPUs whose colour changed ("" if none did); pages that subscribe later
        get every colour first (`watch`), so the changes are all they need."""
        changed = {}
        for i in range(0, len(cells), 2):
            gpu, colour = str(cells[i]), cells[i + 1]
            if self.cells.get(gpu) != colour:
                self.cells[gpu] = changed[gpu] = colour
        return heat_text(changed, sent) if changed else ""


def heat_text(cells: dict[str, int], sent: float) -> str:
    body = ",".join(f'"{gpu}":{colour}' for gpu, colour in cells.items())
    return f'{{"type":"fleet.heatmap","sent":{sent!r},"cells":{{{body}}}}}'


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveHub] = weakref.WeakKeyDictionary()


def live_hub() -> LiveHub:
    """This process's hub (one per event loop), created when its first page subscribes."""
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        _hubs[loop] = LiveHub()
    return _hubs[loop]

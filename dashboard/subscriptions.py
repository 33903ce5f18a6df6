"""Per-page subscriptions: each browser page tells the server what it shows, and gets only that.

A node page shows one node; a fleet page shows one page of node cards and the heatmap of every GPU, which
needs only each GPU's colour. So a page sends `{"type": "subscribe", "nodes": [ids], "heatmap": bool}`
(or `"nodes": "all"`, for tools that watch the whole fleet) and gets fleet ticks holding only those nodes,
plus, if it asked, the heatmap's colours.

Ticks cross processes once per process, not once per browser, and carry what every page needs (which
nodes reported, the heatmap cells that changed): every server process's fan-out stores its nodes' values
once in Redis (live.LatestValues, a field per node) and sends a tick to TICKS_GROUP, whose members are one
`LiveHub` per process (not the browsers), and only while a page on that process watches. The hub fetches the
values of the nodes its pages show and hands each page its part, so its cost follows its pages, not the
fleet (bench/README.md, "Fleet page"). Each node's values arrive JSON-encoded once (live.publish_tick), so a
page's message is a join of strings, not an encoding per browser. The hub keeps the nodes its pages show in
Redis (live.Watching): the fan-outs write those nodes' values every tick, the others' only now and then, and
send no tick while no hub watches. The heatmap cells stay text in the hub (a tick's cells are decoded only
when a page comes that needs all of them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from redis.exceptions import RedisError

from dashboard.live import POINT_KEYS, TICKS_GROUP, LatestValues, Watching, heat_runs
from dashboard.models import Node
from dashboard.per_loop import PerLoop

MAX_NODES = 200  # a fleet page shows 50 cards; a page asking for more than this asks for "all"
# A page that just subscribed gets the values the hub holds of nodes that reported this recently.
FRESH_S = 5.0
REJOIN_S = 3600.0  # group memberships expire in Redis (a day by default): the hub renews its own
# A hub whose last page closed leaves the ticks after this long: a page moving to the next page of the list,
# or reloading, finds it still in them.
LINGER_S = 5.0
HEAT_LOG_MAX = 64  # a fan-out's tick cells kept as text since its last full set; folded into one past this
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
    """One per server process (event loop): in the ticks while a local page watches, out of them otherwise.

    A tick names the nodes that reported and the heatmap cells that changed; the hub fetches the values of
    only the nodes its pages show (live.LatestValues), so its cost follows its pages, not the fleet.
    """

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.values = LatestValues(self.layer)
        self.watching = Watching(self.layer)
        self.id = ""  # as live.Watching names this hub; a new one each time it joins the ticks
        self.joined = False  # in the ticks' group: from then on it tells the fan-outs what its pages show
        # What it last told them (None: nothing yet); a closed page's nodes are left out within TTL_S / 3.
        self.declared: tuple[frozenset[str] | None] | None = None
        self.declaring = asyncio.Lock()  # one declaration at a time, the newest last
        self.watchers: dict[Watcher, Subscription] = {}
        self.sent: dict[str, str] = {}  # node id -> its values as last given to pages (not given twice)
        # Each fan-out's heatmap cells (live.heat_runs JSON) since its last full set, in order.
        self.heat_log: dict[str, list[str]] = {}
        self.task: asyncio.Task | None = None
        self.leaving: asyncio.TimerHandle | None = None

    async def watch(self, watcher: Watcher, subscription: Subscription) -> None:
        """Start (or change) what a page gets; it gets at once the newest values it did not have."""
        before = self.watchers.get(watcher)
        if (
            self.leaving is not None
        ):  # before any await: the linger must not end (and clear the cells) meanwhile
            self.leaving.cancel()
            self.leaving = None
        if self.task is None:
            self.id = uuid.uuid4().hex
            self.task = asyncio.get_running_loop().create_task(self.run())
        await self.catch_up(watcher, before, subscription)
        cells = self.cells() if subscription.heatmap and not (before and before.heatmap) else {}
        if cells:
            watcher.deliver(heat_text(cells, time.time(), []))
        self.watchers[watcher] = subscription
        await self.declare()

    def cells(self) -> dict[int, int]:
        """GPU id -> heatmap cell (live.heat_cell), of every fan-out: its log of ticks decoded, in order."""
        cells: dict[int, int] = {}
        for log_ in self.heat_log.values():
            for runs in log_:
                cells.update(decode_runs(json.loads(runs)))
        return cells

    async def declare(self) -> None:
        """Tell the fan-outs (live.Watching) which nodes this hub's pages show, if that changed. Only once
        the hub is in the ticks' group: a fan-out gives a hub it sees for the first time every heatmap cell."""
        async with self.declaring:
            shown = self.shown_nodes()
            if not self.joined or (shown,) == self.declared:
                return
            try:
                await self.watching.declare(self.id, shown)
                self.declared = (shown,)
            except (RedisError, OSError) as exc:  # declared again within Watching.TTL_S / 3
                log.warning("live hub: could not say what its pages show: %s", exc)

    def shown_nodes(self) -> frozenset[str] | None:
        subscriptions = self.watchers.values()
        if any(s.nodes is None for s in subscriptions):
            return None
        return frozenset().union(*(s.nodes for s in subscriptions))

    async def catch_up(self, watcher: Watcher, before: Subscription | None, after: Subscription) -> None:
        """The newest values of the nodes a page shows from now on, if they are recent."""
        had = set() if before is None else (set(self.sent) if before.nodes is None else before.nodes)
        try:
            found = await self.values.fetch(None if after.nodes is None else sorted(after.nodes - had))
        except (RedisError, OSError) as exc:  # the page gets its values with the next tick
            log.warning("live hub: no values for a new page yet: %s", exc)
            return
        fresh = time.time() - FRESH_S  # an older value would show a silent node as live
        parts = [text for node, (when, text) in found.items() if when > fresh and node not in had]
        if parts:
            watcher.deliver(update_text(parts, time.time()))

    def forget(self, watcher: Watcher) -> None:
        """The page closed; the last one's hub leaves the ticks after LINGER_S (unless a page comes back)."""
        self.watchers.pop(watcher, None)
        if not self.watchers and self.task is not None and self.leaving is None:
            self.leaving = asyncio.get_running_loop().call_later(LINGER_S, self.leave)

    def leave(self) -> None:
        self.leaving = None
        if self.watchers or self.task is None:
            return
        self.task.cancel()  # its `run` leaves the group; a page that comes later starts a new one
        self.task, self.joined, self.declared = None, False, None
        self.sent.clear()
        self.heat_log.clear()  # stale out of the ticks; a new hub gets every cell with its first tick

    async def run(self) -> None:
        hub, channel, declaring = self.id, await self.layer.new_channel(), None
        try:
            while True:
                try:
                    await self.layer.group_add(TICKS_GROUP, channel)
                    joined = time.monotonic()
                    if declaring is None:
                        self.joined = True
                        declaring = asyncio.get_running_loop().create_task(self.keep_declared())
                    while time.monotonic() - joined < REJOIN_S:
                        await self.take(await self.layer.receive(channel))
                except (RedisError, OSError) as exc:  # Redis restarting: ticks resume when it is back
                    log.warning("live hub: %s; joining the ticks again in 1 s", exc)
                    await asyncio.sleep(1)
        finally:
            if declaring is not None:
                declaring.cancel()
            await self.quit(hub, channel)

    async def keep_declared(self) -> None:
        """What this hub's pages show, in live.Watching for as long as it runs (its declaration expires)."""
        while True:
            self.declared = None  # said again, whether it changed or not
            await self.declare()
            await asyncio.sleep(Watching.TTL_S / 3)

    async def quit(self, hub: str, channel: str) -> None:
        try:
            await self.watching.withdraw(hub)
            await self.layer.group_discard(TICKS_GROUP, channel)
        except (RedisError, OSError) as exc:  # its membership expires with the group (channel_layer expiry)
            log.warning("live hub: could not leave the ticks: %s", exc)

    async def take(self, tick: dict[str, Any]) -> None:
        """A tick, unless it cannot be read: one from a process on other code (a rolling upgrade shares Redis)
        is skipped, not the end of this process's live values."""
        try:
            await self.dispatch(tick)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("live hub: skipped a tick it cannot read (%s: %s)", type(exc).__name__, exc)

    async def dispatch(self, tick: dict[str, Any]) -> None:
        reported = [str(node) for node in tick["nodes"]]
        self.keep_cells(tick["source"], tick["cells"], tick["full"])
        heat = f'{{"type":"fleet.heatmap","sent":{tick["sent"]!r},"cells":{tick["cells"]},"nodes":{tick["nodes_json"]}}}'
        fetched = await self.values.fetch(self.shown(reported))
        fresh = {node: text for node, (_, text) in fetched.items() if self.sent.get(node) != text}
        self.sent.update(fresh)
        for watcher, subscription in list(self.watchers.items()):
            shown = fresh.keys() if subscription.nodes is None else subscription.nodes & fresh.keys()
            if shown:
                watcher.deliver(update_text([fresh[n] for n in shown], tick["sent"]))
            if subscription.heatmap:
                watcher.deliver(heat)

    def keep_cells(self, source: str, runs: str, full: bool) -> None:
        """A tick's cells, kept as they came (text) for the pages that subscribe later."""
        kept = self.heat_log.setdefault(source, [])
        if full:
            kept.clear()
        if runs != "[]":
            kept.append(runs)
        if len(kept) > HEAT_LOG_MAX:  # no full set for a while: fold them into one
            folded: dict[int, int] = {}
            for text in kept:
                folded.update(decode_runs(json.loads(text)))
            kept[:] = [json.dumps(heat_runs(folded), separators=(",", ":"))]

    def shown(self, reported: list[str]) -> list[str]:
        """Those of the reported nodes that a local page shows."""
        watched = self.shown_nodes()
        if watched is None:
            return reported
        return [node for node in reported if node in watched]


def decode_runs(flat: list[int]) -> dict[int, int]:
    """GPU id -> cell from live.heat_runs' [first id, count, cell, ..., first id, count, ...]."""
    cells, k = {}, 0
    while k < len(flat):
        first, count = flat[k], flat[k + 1]
        cells.update(zip(range(first, first + count), flat[k + 2 : k + 2 + count], strict=True))
        k += 2 + count
    return cells


def heat_text(cells: dict[int, int], sent: float, nodes: list[int]) -> str:
    """A "fleet.heatmap" (live.tick_message's `heat`): the cells as live.heat_runs (live.heat_cell each) and the
    nodes that reported (live, for the page)."""
    return json.dumps(
        {"type": "fleet.heatmap", "sent": sent, "cells": heat_runs(cells), "nodes": nodes},
        separators=(",", ":"),
    )


live_hub = PerLoop(LiveHub)  # this process's hub (one per event loop), made when its first page subscribes

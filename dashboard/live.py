"""Live fan-out to browsers: one tick per FANOUT_SECONDS with the latest values of every node that changed.

Browsers never get one message per sample: at 1,000 agents x 8 GPUs that would be 8,000 frames a
second per browser. Instead the newest sample of each GPU is kept here and sent as one tick to
TICKS_GROUP, whose members are the server processes' hubs (dashboard.subscriptions), which give each page
only the nodes it shows. Small, rare events (node status, deployments, plans, alerts) go to every browser
through FLEET_GROUP.

Each node's values are JSON-encoded once, here, stored in Redis (LatestValues), and travel as text: a page's
message is a join of the nodes it shows. (Encoding the whole tick per browser, plus msgpack of the nested
structure in and out of Redis, cost 15-25 ms per browser per tick at 1,000 nodes; every hub taking every
node's values cost a lone fleet page's process 1.9 % of a core.) The tick itself carries which nodes
reported and each GPU's heatmap cell that changed, which is all the fleet page needs of the GPUs it does not
show in detail.

What a fan-out writes follows what the hubs show (Watching: each hub keeps the nodes its pages show in Redis):
the values of watched nodes every tick, of the others every REFRESH_S (so that a page that subscribes to
one gets recent values at once), and no tick at all while no hub watches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from typing import Any, NamedTuple, Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from redis.exceptions import RedisError

from dashboard import browser_json
from dashboard.models import AgentToken

FLEET_GROUP = "fleet"  # every browser: node status, deployment changes, plans, alerts
TICKS_GROUP = "fleet-ticks"  # one hub per server process: every tick, sliced per page there
_node_json = browser_json.BrowserJSONEncoder(separators=(",", ":")).encode
log = logging.getLogger(__name__)


class StoredItem(Protocol):
    """What the fan-out reads of an item the ingest buffer stored (ingest.Pending; a protocol, so that this
    module, which ingest's callers use, does not import ingest)."""

    node_id: int
    rows: list[Any]
    sampled_at: float
    deployment_summary: dict | None


def agent_group(node_id: int) -> str:
    """The channel-layer group of a node's connected agent (commands from Celery go here)."""
    return f"agent-{node_id}"


class GpuPoint(NamedTuple):
    """One GPU's readings as the pages show them: the one shape of a live point and of a chart's history.

    Browsers get the values as a list in field order and the names once per message (`keys`): at 1,000
    nodes x 8 GPUs, names on every point would make the tick about half as long again. The pages read a
    point by name through `Live.point(keys, values)` (static/js/live.js).
    """

    util: float  # % of time a kernel ran
    mem_used: float  # MiB
    mem_total: float  # MiB
    temp: float  # degrees C
    power: float  # W
    util_mem: float  # % of time memory was read or written


POINT_KEYS = GpuPoint._fields
TIMED_POINT_KEYS = ("t", *POINT_KEYS)  # a chart's history: unix milliseconds, then the point


def gpu_point(row: Any) -> GpuPoint:
    """The point of a stored sample (a GpuSample or an ingest row).

    To a tenth: the pages show whole numbers, and full float precision made the tick 1.8 times as long.
    """
    used = row.mem_used_mib
    return GpuPoint(  # each round() spelt out: a generator here was most of the fan-out's per-sample cost
        round(row.util_gpu, 1),
        round(used, 1),
        round(used + row.mem_free_mib, 1),
        round(row.temp_c, 1),
        round(row.power_w, 1),
        round(row.util_mem, 1),
    )


def fleet_update(nodes: list[dict[str, Any]], deployments: list[dict[str, Any]]) -> dict[str, str]:
    """A "fleet.update" group message with the browsers' JSON already encoded (once, not per browser);
    each node's `gpus` maps a GPU id to its point's values, named by `keys`."""
    text = browser_json.dumps(
        {
            "type": "fleet.update",
            "sent": time.time(),
            "keys": POINT_KEYS,
            "nodes": nodes,
            "deployments": deployments,
        }
    )
    return {"type": "fleet.update", "text": text}


def heat_colour(util: float | None) -> int:
    """The heatmap's utilization colour: 0 for 0-9.9 %, 1 for 10-19.9 %, ... 10 for 100 %. From 1 up a GPU counts
    as busy (fleet_view.BUSY_UTIL), so the page's summary line counts busy GPUs from the colours."""
    if util is None or not math.isfinite(util):
        return 0
    return min(10, max(0, int(util // 10)))


MEM_STEP_MIB = (
    256  # a heatmap cell carries the memory used in these steps (the summary line's sums, the colour)
)


def heat_cell(point: GpuPoint | list | tuple) -> int:
    """A heatmap cell's value: the utilization colour (0-10) in the low 4 bits, the memory used in
    MEM_STEP_MIB steps above them (static/js/fleet.js reads both: colour by either, sum memory used)."""
    used = point[1] if math.isfinite(point[1]) else 0.0
    return heat_colour(point[0]) + 16 * max(0, round(used / MEM_STEP_MIB))


class Colours:
    """The heatmap cell this process last sent for each GPU: ticks carry only the cells that changed,
    and every FULL_COLOURS_S all of them (a hub that started since gets the rest)."""

    FULL_COLOURS_S = 10.0

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}
        self.full_at = 0.0
        self.was_full = False  # the last `changed` gave every cell

    def changed(self, nodes: list[dict[str, Any]], full: bool = False) -> list[int]:
        """[gpu id, cell, ...] of these nodes' GPUs whose cell changed (all of them when `full`, and now and then)."""
        full = full or time.monotonic() - self.full_at >= self.FULL_COLOURS_S
        self.was_full = full
        if full:
            self.full_at = time.monotonic()
        cells, sent = [], self.sent
        for node in nodes:
            for gpu, point in node["gpus"].items():
                cell, key = heat_cell(point), int(gpu)
                if full or sent.get(key) != cell:
                    sent[key] = cell
                    cells += (key, cell)
        if full:  # all of every GPU this process knows of, not only those in this tick
            cells = [value for item in sent.items() for value in item]
        return cells


class RedisHash:
    """One Redis hash shared by every server process (KEY, under the channel layer's prefix); with the
    in-memory channel layer (one process, the tests), a dict on the layer (LOCAL)."""

    KEY = ""
    LOCAL = ""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.local: dict[str, str] | None = (
            None if hasattr(layer, "connection") else layer.__dict__.setdefault(self.LOCAL, {})
        )

    def redis(self) -> Any:
        return self.layer.connection(0)

    @property
    def key(self) -> str:
        return self.layer.prefix + self.KEY


class LatestValues(RedisHash):
    """Every node's newest values, encoded once, where every server process's hub can fetch the few it shows.

    With Redis, one hash (a field per node, "<unix time> <JSON>"); the hubs fetch the nodes their pages
    show, so a hub's cost follows its pages, not the fleet. With the in-memory channel layer (one process,
    the tests), a dict on the layer.
    """

    KEY = "live:nodes"
    TTL_S = 3600  # the hash of a fleet that stopped reporting goes away

    LOCAL = "_live_latest"

    async def store(self, encoded: dict[str, str], when: float) -> None:
        fields = {node: f"{when!r} {text}" for node, text in encoded.items()}
        if self.local is not None:
            self.local.update(fields)
            return
        async with self.redis().pipeline(transaction=False) as pipe:
            await pipe.hset(self.key, mapping=fields).expire(self.key, self.TTL_S).execute()

    async def fetch(self, nodes: list[str] | None) -> dict[str, tuple[float, str]]:
        """node id -> (when published, its values as JSON) of those it has (None: of every node)."""
        if nodes is None:
            stored = dict(self.local) if self.local is not None else await self.redis().hgetall(self.key)
            pairs = [(k.decode() if isinstance(k, bytes) else k, v) for k, v in stored.items()]
        elif not nodes:
            return {}
        else:
            values = [self.local.get(n) for n in nodes] if self.local is not None else None
            pairs = zip(nodes, values or await self.redis().hmget(self.key, nodes), strict=True)
        found = {}
        for node, value in pairs:
            if value is not None:
                when, text = (value.decode() if isinstance(value, bytes) else value).split(" ", 1)
                found[node] = (float(when), text)
        return found


def heat_runs(cells: dict[int, int]) -> list[int]:
    """Cells as the pages get them: runs of consecutive GPU ids, [first id, count, cell, cell, ..., first id,
    count, ...]. A node's GPUs have consecutive ids, so when every cell changes the message is about half
    as long as [id, cell, ...] pairs, and each page's socket compresses half as much."""
    flat: list[int] = []
    count_at, next_id = -1, None
    for gpu in sorted(cells):
        if gpu != next_id:
            flat += (gpu, 0)
            count_at = len(flat) - 1
        flat.append(cells[gpu])
        flat[count_at] += 1
        next_id = gpu + 1
    return flat


class Watching(RedisHash):
    """Which nodes each server process's hub shows, where every fan-out reads them (a hub in Redis, a field per
    hub: "<expires, unix time> <JSON: node ids, or "all">"; a dict on the in-memory layer). A hub declares again
    every TTL_S / 3; the field of a hub whose process died is ignored once it expires."""

    KEY = "live:watching"
    TTL_S = 30.0

    LOCAL = "_live_watching"

    async def declare(self, hub: str, nodes: frozenset[str] | None) -> None:
        shown = "all" if nodes is None else sorted(int(n) for n in nodes)
        value = f"{time.time() + self.TTL_S!r} {json.dumps(shown, separators=(',', ':'))}"
        if self.local is not None:
            self.local[hub] = value
            return
        async with self.redis().pipeline(transaction=False) as pipe:
            await pipe.hset(self.key, hub, value).expire(self.key, int(self.TTL_S) * 2).execute()

    async def withdraw(self, hub: str) -> None:
        if self.local is not None:
            self.local.pop(hub, None)
        else:
            await self.redis().hdel(self.key, hub)

    async def read(self) -> dict[str, frozenset[str] | None]:
        """hub -> the node ids it shows (None: every node), of the hubs whose declaration has not expired."""
        stored = dict(self.local) if self.local is not None else await self.redis().hgetall(self.key)
        hubs, now = {}, time.time()
        for hub, value in stored.items():
            expires, shown = (value.decode() if isinstance(value, bytes) else value).split(" ", 1)
            if float(expires) > now:
                nodes = json.loads(shown)
                hubs[hub.decode() if isinstance(hub, bytes) else hub] = (
                    None if nodes == "all" else frozenset(str(n) for n in nodes)
                )
        return hubs


def watched_by(hubs: dict[str, frozenset[str] | None]) -> frozenset[str] | None:
    """The nodes some hub shows (None: every node)."""
    if any(nodes is None for nodes in hubs.values()):
        return None
    return frozenset().union(*hubs.values())


def tick_message(
    nodes: list[dict[str, Any]], colours: Colours, source: str = "", full: bool = False
) -> dict[str, Any]:
    """A "live.tick" for the hubs: the ids of the nodes that reported (their values are in LatestValues) and
    the heatmap cells that changed, already JSON-encoded for the pages as `heat_runs` (`cells`, whole when
    `full`), so that no hub encodes or even unpacks 8,000 cells a tick; `source` names the fan-out (a hub keeps
    each fan-out's cells for the pages that come later)."""
    reported, cells = [int(node["node"]) for node in nodes], colours.changed(nodes, full)
    runs = heat_runs(dict(zip(cells[::2], cells[1::2], strict=True)))
    return {
        "type": "live.tick",
        "sent": time.time(),
        "nodes": reported,
        "cells": json.dumps(runs, separators=(",", ":")),
        "nodes_json": json.dumps(reported, separators=(",", ":")),
        "source": source,
        "full": colours.was_full,
    }


class Publisher:
    """What one fan-out remembers between ticks: the heatmap cells it sent, when it last wrote each node's
    values to LatestValues, and the hubs it last saw (a hub new since gets every cell)."""

    REFRESH_S = 2.0  # every node's values are in LatestValues at most about this old (subscriptions.FRESH_S)

    def __init__(self) -> None:
        self.colours = Colours()
        self.source = uuid.uuid4().hex
        self.written: dict[str, float] = {}  # node id -> time.monotonic() of its last write
        self.hubs: set[str] = set()

    def due(self, nodes: list[dict[str, Any]], watched: frozenset[str] | None) -> list[dict[str, Any]]:
        """The nodes whose values go to LatestValues now: the watched ones, and the others every REFRESH_S."""
        now, written, due = time.monotonic(), self.written, []
        for node in nodes:
            key = str(node["node"])
            last = written.get(key)
            if watched is None or key in watched or last is None or now - last >= self.REFRESH_S:
                # A node seen for the first time counts as written up to REFRESH_S ago (by its id), so that the
                # whole fleet's refreshes spread over the ticks instead of all falling on the same one.
                written[key] = now - (int(key) % 8) * self.REFRESH_S / 8 if last is None else now
                due.append(node)
        return due


async def publish_tick(nodes: list[dict[str, Any]], publisher: Publisher) -> None:
    """The values of the nodes that are due encoded once into LatestValues, then the tick to every process's hub
    (none while no hub watches: the values still go to LatestValues, so that a hub that comes finds them)."""
    layer = get_channel_layer()
    hubs = await Watching(layer).read()
    due = publisher.due(nodes, watched_by(hubs))
    if due:
        encoded = {str(node["node"]): _node_json(node) for node in due}
        await LatestValues(layer).store(encoded, time.time())
    new_hub = bool(hubs.keys() - publisher.hubs)
    publisher.hubs = set(hubs)
    if hubs:
        await layer.group_send(TICKS_GROUP, tick_message(nodes, publisher.colours, publisher.source, new_hub))


class FleetFanout:
    """One per server process (event loop): the agent consumer attaches it to the ingest buffer."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.latest: dict[int, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.publisher = Publisher()
        self._task: asyncio.Task | None = None
        self._last_sent = 0.0

    def record(self, batch: list[StoredItem]) -> None:
        """Keep the newest sample per GPU of these items, and their deployment summaries. The ingest buffer
        calls it with each item as it arrives (its samples), then `record_summaries` once it is stored."""
        for item in batch:
            if item.deployment_summary is not None:
                self.deployments[item.deployment_summary["id"]] = item.deployment_summary
            if not item.rows:
                continue
            entry = self.latest.setdefault(item.node_id, {"node": item.node_id, "t": 0.0, "gpus": {}})
            for row in item.rows:
                entry["gpus"][str(row.gpu_id)] = gpu_point(row)
            entry["t"] = max(entry["t"], item.sampled_at)
        self._schedule()

    def record_summaries(self, batch: list[StoredItem]) -> None:
        """The deployment summaries of a stored batch (made in its transaction; its samples went on arrival)."""
        for item in batch:
            if item.deployment_summary is not None:
                self.deployments[item.deployment_summary["id"]] = item.deployment_summary
        self._schedule()

    def _schedule(self) -> None:
        if (self.latest or self.deployments) and (self._task is None or self._task.done()):
            # Leading edge: send at once unless the previous tick went out less than a period ago.
            delay = max(0.0, self._last_sent + self.period - time.monotonic())
            self._task = asyncio.get_running_loop().create_task(self._send_after(delay))

    async def _send_after(self, delay: float) -> None:
        if delay > 0:  # no sleep(0): the tick goes out before the acks the same flush schedules
            await asyncio.sleep(delay)
        self._last_sent = time.monotonic()
        nodes, self.latest = list(self.latest.values()), {}
        deployments, self.deployments = list(self.deployments.values()), {}
        if deployments:
            await get_channel_layer().group_send(FLEET_GROUP, fleet_update([], deployments))
        if nodes:
            await publish_tick(nodes, self.publisher)


@receiver(post_save, sender=AgentToken)
def close_sockets_of_revoked_token(sender: type[AgentToken], instance: AgentToken, **kwargs: object) -> None:
    """A revoked token stops working at once, not at the agent's next connection."""
    if instance.revoked is not None:
        _close_sockets_after_commit(instance)


@receiver(post_delete, sender=AgentToken)
def close_sockets_of_deleted_token(sender: type[AgentToken], instance: AgentToken, **kwargs: object) -> None:
    _close_sockets_after_commit(instance)


def _close_sockets_after_commit(token: AgentToken) -> None:
    node_id, token_id = token.node_id, token.pk
    transaction.on_commit(lambda: close_agent_sockets(node_id, token_id))


def close_agent_sockets(node_id: int, token_id: int) -> None:
    """Close the connections of this node's agent that authenticated with this token (it was revoked)."""
    try:
        async_to_sync(get_channel_layer().group_send)(
            agent_group(node_id), {"type": "agent.revoked", "token": token_id}
        )
    except (OSError, RedisError) as exc:  # the socket still closes at the agent's next connection
        log.warning("could not close the sockets of revoked token %s: %s", token_id, exc)


async def announce_node(node_id: int, name: str, status: str) -> None:
    """Tell browsers at once that a node connected or went away (no waiting for the stale timer)."""
    await get_channel_layer().group_send(
        FLEET_GROUP, {"type": "fleet.node", "node": node_id, "name": name, "status": status}
    )


async def announce_nodes(nodes: list[dict[str, Any]]) -> None:
    """Many nodes' status at once ({"node", "name", "status"} each): one message, not one per node."""
    if nodes:
        await get_channel_layer().group_send(FLEET_GROUP, {"type": "fleet.nodes", "nodes": nodes})


async def announce_deployment(summary: dict[str, Any]) -> None:
    """A deployment state change made on the server side (launch sent, stop requested)."""
    await get_channel_layer().group_send(FLEET_GROUP, fleet_update([], [summary]))


async def announce_plan(request_id: int, status: str) -> None:
    """Plans for a deploy-form request are ready (or failed): the waiting page fetches them once."""
    await get_channel_layer().group_send(
        FLEET_GROUP, {"type": "fleet.plan", "request": request_id, "status": status}
    )

"""Per-page subscriptions: a page gets the live values of the nodes it shows and the heatmap if it has one,
nothing else; a bad subscribe message is refused by name and changes nothing."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing.websocket import WebsocketCommunicator

from dashboard import subscriptions
from dashboard.live import TICKS_GROUP, FleetFanout, heat_runs
from tests.dashboard.test_fleet_feed import browser, in_memory_layer, nodes, stored_batch

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
__all__ = ["in_memory_layer"]  # the fixture, used here too


# A heatmap cell (live.heat_cell) of stored_batch's GPU: 87.5 % is in the 80-89 % colour (8), and 70,000 MiB
# used is 273 steps of 256 MiB.
BUSY_87 = 8 + 16 * 273


async def tick(*batches: list) -> None:
    fanout = FleetFanout(period=0.01)
    fanout.record([item for batch in batches for item in batch])


async def received(comm: WebsocketCommunicator, kind: str) -> dict:
    while True:
        message = json.loads(await comm.receive_from(timeout=5))
        if message["type"] == kind:
            return message


async def test_it_gives_a_node_page_only_its_node_and_a_page_that_asked_nothing_no_values(alice):
    mine, other = await nodes("mine", "other")
    page = await browser(alice, {"nodes": [mine]})
    idle = await browser(alice)
    try:
        await tick(stored_batch(mine, 1_700_000_000.0, 41), stored_batch(other, 1_700_000_000.0, 42))
        update = await received(page, "fleet.update")
        assert [n["node"] for n in update["nodes"]] == [mine]
        assert await idle.receive_nothing(timeout=0.5)
        assert await page.receive_nothing(timeout=0.3)
    finally:
        await page.disconnect()
        await idle.disconnect()


async def test_it_sends_what_a_page_shows_after_it_changes_page(alice):
    first, second = await nodes("page-1-node", "page-2-node")
    page = await browser(alice, {"nodes": [first]})
    try:
        await page.send_to(text_data=json.dumps({"type": "subscribe", "ref": "s", "nodes": [second]}))
        assert (await received(page, "fleet.subscribed"))["nodes"] == [second]
        await tick(stored_batch(first, 1_700_000_000.0, 41), stored_batch(second, 1_700_000_000.0, 42))
        update = await received(page, "fleet.update")
        assert [n["node"] for n in update["nodes"]] == [second]
    finally:
        await page.disconnect()


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"nodes": "some"}, 'nodes must be "all" or a list of node ids'),
        ({"nodes": [1.5]}, 'nodes must be "all" or a list of node ids'),
        ({"nodes": [True]}, 'nodes must be "all" or a list of node ids'),
        ({"nodes": [0]}, 'nodes must be "all" or a list of node ids'),
        ({"nodes": list(range(1, 300))}, "nodes lists at most 200 node ids"),
        ({"nodes": [], "heatmap": "yes"}, "heatmap must be true or false"),
        ({"nodes": [], "gpus": [1]}, "subscribe takes nodes and heatmap, not gpus"),
        ({"nodes": [999_999]}, "no node with id 999999"),
    ],
)
async def test_it_refuses_a_bad_subscription_by_name_and_keeps_the_one_it_had(alice, message, error):
    mine, other = await nodes("mine", "other")
    page = await browser(alice, {"nodes": [mine]})
    try:
        await page.send_to(text_data=json.dumps({"type": "subscribe", "ref": "s", **message}))
        refused = await received(page, "fleet.refused")
        assert refused["ref"] == "s" and error in refused["error"]
        await tick(stored_batch(mine, 1_700_000_000.0, 41), stored_batch(other, 1_700_000_000.0, 42))
        assert [n["node"] for n in (await received(page, "fleet.update"))["nodes"]] == [mine]
    finally:
        await page.disconnect()


async def test_it_refuses_a_message_that_is_neither_a_subscribe_nor_an_ask(alice):
    page = await browser(alice)
    try:
        await page.send_to(text_data=json.dumps({"type": "subscrbe", "nodes": "all"}))
        refused = await received(page, "fleet.refused")
        assert refused["error"] == "expected a subscribe or an ask (JSON)"
    finally:
        await page.disconnect()


async def test_it_refuses_an_account_deactivated_since_its_socket_opened(alice):
    [node] = await nodes("n")
    page = await browser(alice)
    try:
        alice.is_active = False
        await database_sync_to_async(alice.save)()
        await page.send_to(text_data=json.dumps({"type": "subscribe", "nodes": [node]}))
        assert "may not watch the fleet" in (await received(page, "fleet.refused"))["error"]
    finally:
        await page.disconnect()


def cells(message: dict) -> dict[int, int]:
    """GPU id -> cell from the runs of consecutive ids a page gets (live.heat_runs)."""
    flat, found, k = message["cells"], {}, 0
    while k < len(flat):
        first, count = flat[k], flat[k + 1]
        found.update((first + j, cell) for j, cell in enumerate(flat[k + 2 : k + 2 + count]))
        k += 2 + count
    return found


def test_it_sends_cells_in_runs_of_consecutive_gpu_ids():
    assert heat_runs({7: 1, 3: 5, 4: 6, 5: 7, 9: 0}) == [3, 3, 5, 6, 7, 7, 1, 1, 9, 1, 0]
    assert heat_runs({}) == []


async def test_it_sends_the_heatmap_colours_that_changed_and_all_of_them_to_a_page_that_asks_later(alice):
    one, two = await nodes("one", "two")
    early = await browser(alice, {"nodes": [], "heatmap": True})
    fanout = FleetFanout(period=0.01)  # one fan-out: it sends every cell first, then the changed ones
    try:
        fanout.record(stored_batch(one, 1_700_000_000.0, 41) + stored_batch(two, 1_700_000_000.0, 42))
        heat = await received(early, "fleet.heatmap")
        assert cells(heat) == {41: BUSY_87, 42: BUSY_87} and sorted(heat["nodes"]) == [one, two]
        assert await early.receive_nothing(timeout=0.3)  # no node values: the page asked for none
        later = await browser(alice, {"nodes": [], "heatmap": True})
        assert cells(await received(later, "fleet.heatmap")) == {41: BUSY_87, 42: BUSY_87}
        batch = stored_batch(two, 1_700_000_001.0, 42)
        batch[0].rows[0] = batch[0].rows[0]._replace(util_gpu=3.0)
        fanout.record(stored_batch(one, 1_700_000_001.0, 41) + batch)  # only GPU 42's colour changes
        for comm in (early, later):
            heat = await received(comm, "fleet.heatmap")
            assert cells(heat) == {42: BUSY_87 - 8} and sorted(heat["nodes"]) == [one, two]  # 3 %: colour 0
        await later.disconnect()
    finally:
        await early.disconnect()


async def test_it_reads_a_subscription_of_every_node():
    assert subscriptions.parse({"type": "subscribe", "nodes": "all"}).describe() == {
        "nodes": "all",
        "heatmap": False,
    }


async def members(group: str) -> set[str]:
    layer = get_channel_layer()
    return set(layer.groups.get(group, {}))


async def until(check, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_it_leaves_the_ticks_when_its_last_page_closes_and_joins_them_again_for_the_next(
    alice, monkeypatch
):
    monkeypatch.setattr(subscriptions, "LINGER_S", 0.2)
    [node] = await nodes("n")
    first = await browser(alice, {"nodes": [node], "heatmap": True})
    second = await browser(alice, {"nodes": [node]})
    await until(lambda: _joined(True))
    await first.disconnect()
    await asyncio.sleep(0.5)
    assert await _joined(True)  # one page still open
    await second.disconnect()
    await until(lambda: _joined(False))  # gone from the group: ticks no longer reach this process
    assert not subscriptions.live_hub().heat_log and not subscriptions.live_hub().sent
    again = await browser(alice, {"nodes": [node]})
    try:
        await until(lambda: _joined(True))
        await tick(stored_batch(node, 1_700_000_002.0, 41))
        assert [n["node"] for n in (await received(again, "fleet.update"))["nodes"]] == [node]
    finally:
        await again.disconnect()


async def test_it_stays_in_the_ticks_for_a_page_that_comes_back_within_the_linger(alice, monkeypatch):
    monkeypatch.setattr(subscriptions, "LINGER_S", 1.0)
    [node] = await nodes("n")
    page = await browser(alice, {"nodes": [node]})
    await until(lambda: _joined(True))
    joined = await members(TICKS_GROUP)
    await page.disconnect()
    page = await browser(alice, {"nodes": [node]})  # the next page of the list, a moment later
    await asyncio.sleep(1.3)
    try:
        assert await members(TICKS_GROUP) == joined  # the same membership: never left
    finally:
        await page.disconnect()


async def _joined(expected: bool) -> bool:
    return bool(await members(TICKS_GROUP)) == expected


class LingerPage:
    def __init__(self) -> None:
        self.got: list[str] = []

    def deliver(self, text: str) -> None:
        self.got.append(text)


async def test_it_gives_the_heatmap_to_a_page_that_subscribes_as_the_linger_ends(monkeypatch):
    monkeypatch.setattr(subscriptions, "LINGER_S", 0.05)
    hub = subscriptions.LiveHub()
    first = LingerPage()
    await hub.watch(first, subscriptions.Subscription(frozenset({"1"}), heatmap=True))
    await asyncio.sleep(0.05)
    hub.keep_cells("fan-out", "[7,1,5]", full=True)  # a colour the hub holds for pages that come later
    hub.forget(first)
    fetch = hub.values.fetch

    async def slow_fetch(nodes):  # Redis answering a little late
        await asyncio.sleep(0.1)
        return await fetch(nodes)

    monkeypatch.setattr(hub.values, "fetch", slow_fetch)
    second = LingerPage()
    await hub.watch(second, subscriptions.Subscription(frozenset({"1"}), heatmap=True))
    await asyncio.sleep(0.2)
    layer = get_channel_layer()
    assert hub.task is not None and not hub.task.done()
    assert len(layer.groups.get(TICKS_GROUP, {})) == 1, layer.groups.get(TICKS_GROUP)
    assert any('"fleet.heatmap"' in text for text in second.got), "no heatmap for the new page"
    hub.forget(second)
    hub.leave()
    await asyncio.sleep(0.05)


async def test_it_skips_a_tick_it_cannot_read_and_takes_the_next(alice):
    """A process on other code (a rolling upgrade) may send ticks of another shape to the same group."""
    [node] = await nodes("upgraded")
    page = await browser(alice, {"nodes": [node]})
    try:
        await get_channel_layer().group_send(
            TICKS_GROUP, {"type": "live.tick", "heat": "[]", "nodes": [node]}
        )
        await tick(stored_batch(node, 1_700_000_000.0, 41))
        update = await received(page, "fleet.update")
    finally:
        await page.disconnect()
    assert [n["node"] for n in update["nodes"]] == [node]

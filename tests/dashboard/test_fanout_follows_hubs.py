"""The fan-out's work follows what the hubs show (live.Watching): no tick while no hub watches, watched nodes'
values every tick and the others' now and then, every heatmap cell to a hub that came since, and a page that
subscribes to a node nobody watched still gets its current values at once."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.layers import get_channel_layer

from dashboard import subscriptions
from dashboard.live import TICKS_GROUP, GpuPoint, LatestValues, Publisher, Watching, publish_tick
from tests.dashboard.test_fleet_feed import browser, in_memory_layer, nodes
from tests.dashboard.test_subscriptions import cells, received

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
__all__ = ["in_memory_layer"]  # the fixture, used here too


def fleet_tick(node_ids: list[int], util: float = 50.0) -> list[dict]:
    """Every node with two GPUs (ids 10 * node and the next) at `util`."""
    point = GpuPoint(util, 4096.0, 24576.0, 50.0, 200.0, 5.0)
    return [
        {"node": n, "t": 1_700_000_000.0, "gpus": {str(10 * n): point, str(10 * n + 1): point}}
        for n in node_ids
    ]


async def stored() -> dict[str, str]:
    return {node: text for node, (_, text) in (await LatestValues(get_channel_layer()).fetch(None)).items()}


async def test_it_sends_no_tick_while_no_hub_watches_and_still_keeps_the_values_for_one_that_comes():
    layer = get_channel_layer()
    listener = await layer.new_channel()
    await layer.group_add(TICKS_GROUP, listener)  # in the group, but no hub said it shows anything
    await publish_tick(fleet_tick([1, 2]), Publisher())
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(listener), 0.3)
    assert sorted(await stored()) == ["1", "2"]
    await Watching(layer).declare("hub", frozenset())
    await publish_tick(fleet_tick([1, 2]), Publisher())
    assert (await asyncio.wait_for(layer.receive(listener), 1))["nodes"] == [1, 2]


async def test_it_writes_the_watched_nodes_every_tick_and_the_others_every_refresh(monkeypatch):
    layer, publisher = get_channel_layer(), Publisher()
    await Watching(layer).declare("hub", frozenset({"3"}))
    await publish_tick(fleet_tick([1, 2, 3], util=10.0), publisher)  # first seen: every node written
    await publish_tick(fleet_tick([1, 2, 3], util=20.0), publisher)
    values = await stored()
    assert "[20.0," in values["3"]  # watched: this tick's values
    assert "[10.0," in values["1"] and "[10.0," in values["2"]  # not watched: not yet again
    monkeypatch.setattr(Publisher, "REFRESH_S", 0.0)
    await publish_tick(fleet_tick([1, 2, 3], util=30.0), publisher)
    assert all("[30.0," in text for text in (await stored()).values())


async def test_it_writes_every_node_every_tick_for_a_hub_that_shows_all():
    layer, publisher = get_channel_layer(), Publisher()
    await Watching(layer).declare("tool", None)
    await publish_tick(fleet_tick([1, 2]), publisher)
    await publish_tick(fleet_tick([1, 2], util=70.0), publisher)
    assert all("[70.0," in text for text in (await stored()).values())


async def test_it_ignores_a_hub_whose_declaration_expired(monkeypatch):
    layer = get_channel_layer()
    monkeypatch.setattr(Watching, "TTL_S", -1.0)  # declared already expired: its process died
    await Watching(layer).declare("gone", frozenset({"1"}))
    assert await Watching(layer).read() == {}


class Page:
    def __init__(self) -> None:
        self.got: list[dict] = []

    def deliver(self, text: str) -> None:
        self.got.append(json.loads(text))


async def until_heatmap(page: Page) -> dict:
    async with asyncio.timeout(5):
        while not any(m["type"] == "fleet.heatmap" for m in page.got):
            await asyncio.sleep(0.01)
    return next(m for m in page.got if m["type"] == "fleet.heatmap")


async def test_it_gives_a_hub_that_comes_later_every_cell_with_its_first_tick(alice):
    [one, two] = await nodes("one", "two")
    first = await browser(alice, {"nodes": [], "heatmap": True})
    publisher = Publisher()
    try:
        await publish_tick(fleet_tick([one, two]), publisher)
        assert len(cells(await received(first, "fleet.heatmap"))) == 4
        await publish_tick(fleet_tick([one, two]), publisher)  # nothing changed: no cells
        assert cells(await received(first, "fleet.heatmap")) == {}
        other = subscriptions.LiveHub()  # another server process's hub, come since
        page = Page()
        await other.watch(page, subscriptions.Subscription(frozenset(), heatmap=True))
        async with asyncio.timeout(5):
            while len(await Watching(get_channel_layer()).read()) < 2:
                await asyncio.sleep(0.01)
        await publish_tick(fleet_tick([one, two]), publisher)
        assert len(cells(await until_heatmap(page))) == 4  # every cell, though none changed
        other.forget(page)
        other.leave()
    finally:
        await first.disconnect()


async def test_it_gives_a_page_the_current_values_at_once_of_a_node_nobody_watched(alice):
    [one, two] = await nodes("one", "two")
    page = await browser(alice, {"nodes": [one]})
    try:
        await publish_tick(fleet_tick([one, two], util=61.0), Publisher())
        await received(page, "fleet.update")
        await page.send_to(text_data=json.dumps({"type": "subscribe", "ref": "s", "nodes": [one, two]}))
        await received(page, "fleet.subscribed")
        update = await received(page, "fleet.update")  # no tick since: from LatestValues
        assert [n["node"] for n in update["nodes"]] == [two]
        assert update["nodes"][0]["gpus"][str(10 * two)][0] == 61.0
    finally:
        await page.disconnect()

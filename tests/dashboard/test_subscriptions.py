"""Per-page subscriptions: a page gets the live values of the nodes it shows and the heatmap if it has one,
nothing else; a bad subscribe message is refused by name and changes nothing."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing.websocket import WebsocketCommunicator

from dashboard import subscriptions
from dashboard.live import FleetFanout
from tests.dashboard.test_fleet_feed import browser, in_memory_layer, nodes, stored_batch

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
__all__ = ["in_memory_layer"]  # the fixture, used here too


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


async def test_it_sends_the_heatmap_colours_that_changed_and_all_of_them_to_a_page_that_asks_later(alice):
    one, two = await nodes("one", "two")
    early = await browser(alice, {"nodes": [], "heatmap": True})
    try:
        await tick(stored_batch(one, 1_700_000_000.0, 41), stored_batch(two, 1_700_000_000.0, 42))
        heat = await received(early, "fleet.heatmap")
        assert heat["cells"] == {"41": 9, "42": 9}  # 87.5 % rounds to the 90 % colour
        assert await early.receive_nothing(timeout=0.3)  # no node values: the page asked for none
        later = await browser(alice, {"nodes": [], "heatmap": True})
        assert (await received(later, "fleet.heatmap"))["cells"] == {"41": 9, "42": 9}
        batch = stored_batch(two, 1_700_000_001.0, 42)
        batch[0].rows[0] = batch[0].rows[0]._replace(util_gpu=3.0)
        await tick(stored_batch(one, 1_700_000_001.0, 41), batch)  # only GPU 42's colour changes
        for comm in (early, later):
            assert (await received(comm, "fleet.heatmap"))["cells"] == {"42": 0}
        await later.disconnect()
    finally:
        await early.disconnect()


async def test_it_reads_a_subscription_of_every_node():
    assert subscriptions.parse({"type": "subscribe", "nodes": "all"}).describe() == {
        "nodes": "all",
        "heatmap": False,
    }

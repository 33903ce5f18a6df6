"""Per-page subscriptions in headless Chromium: each page gets the live values of what it shows.

52 nodes of 2 GPUs; ticks for every node go through the real Redis channel layer to the real server, as the
ingest fan-out publishes them (`live.publish_tick`), three times a second. The user opens a node page, pages
and filters the fleet list, and points at the heatmap.
"""

from __future__ import annotations

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from dashboard.live import Colours, GpuPoint, publish_tick
from tests import storm
from tests.conftest import point_celery_at
from tests.e2e.test_browser import login

pytestmark = [pytest.mark.slow, pytest.mark.browser]


class Ticks:
    """Every node's GPUs at `util[gpu id]` (default 42 %), sent until stopped."""

    def __init__(self, fleet: dict[int, list[int]]) -> None:
        self.fleet, self.util = fleet, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        send, colours = async_to_sync(publish_tick), Colours()
        while not self.stop.wait(0.3):
            nodes = [
                {"node": node, "t": time.time(), "gpus": {str(g): self.point(g) for g in gpus}}
                for node, gpus in self.fleet.items()
            ]
            send(nodes, colours)

    def point(self, gpu: int) -> GpuPoint:
        return GpuPoint(self.util.get(gpu, 42.0), 1000.0 + gpu, 24576.0, 50.0, 200.0, 5.0)


@pytest.fixture
def ticking(live_stack, server_env, settings):
    point_celery_at(server_env["REDIS_URL"], settings)  # this process's channel layer: the server's Redis
    nodes = storm.fleet(52, timezone.now(), prefix="sub", gpus=2)
    ticks = Ticks({n.pk: list(n.gpus.order_by("index").values_list("pk", flat=True)) for n in nodes})
    ticks.thread.start()
    yield nodes, ticks
    ticks.stop.set()
    ticks.thread.join(5)


def seen_after_a_while(page) -> set[int]:
    """The nodes whose values reach the page from now on (after what it got before)."""
    page.wait_for_function("window.layercakeSubscribed !== undefined", timeout=15000)
    page.evaluate("window.layercakeNodesSeen.clear()")
    page.wait_for_function("window.layercakeNodesSeen.size > 0", timeout=15000)
    page.wait_for_timeout(1500)
    return set(page.evaluate("[...window.layercakeNodesSeen]"))


def test_it_gives_a_node_page_only_its_node(live_stack, alice, browser, ticking):
    nodes, _ = ticking
    page = browser.new_page()
    login(page, live_stack.url)
    page.goto(f"{live_stack.url}/nodes/{nodes[7].name}/")
    page.wait_for_function("window.layercakePoints >= 2", timeout=15000)  # its charts are live
    assert seen_after_a_while(page) == {nodes[7].pk}
    assert page.evaluate("window.layercakeSubscribed.nodes") == [nodes[7].pk]


def test_it_sends_the_fleet_page_the_nodes_of_the_page_and_the_filter_shown(
    live_stack, alice, browser, ticking
):
    nodes, ticks = ticking
    ticks.util[nodes[1].gpus.get(index=0).pk] = 77.0
    page = browser.new_page()
    login(page, live_stack.url)
    assert seen_after_a_while(page) == {n.pk for n in nodes[:50]}  # page 1 of the list: 50 cards
    row = page.locator(f"section[data-node='{nodes[1].pk}'] tr.gpu").first
    assert row.locator("td.util").inner_text() == "77 %"  # the live value, not the page's stored one
    page.click("a[rel=next]")
    page.wait_for_url("**page=2**")
    assert seen_after_a_while(page) == {nodes[50].pk, nodes[51].pk}
    page.fill("input[name=q]", nodes[20].name)
    page.click("form.filters button")
    page.wait_for_url(f"**q={nodes[20].name}**")
    assert seen_after_a_while(page) == {nodes[20].pk}
    assert page.locator("section.node").count() == 1


def test_it_keeps_the_heatmap_live_and_shows_a_hovered_nodes_values(live_stack, alice, browser, ticking):
    nodes, ticks = ticking
    page = browser.new_page()
    login(page, live_stack.url)
    page.goto(f"{live_stack.url}/?q={nodes[51].name}")  # one card; the heatmap still shows every GPU
    gpu = nodes[3].gpus.get(index=1).pk
    cell = f"document.querySelector(\"#heatmap i[data-g='{gpu}']\")"
    page.wait_for_function("window.layercakeSubscribed !== undefined", timeout=15000)
    ticks.util[gpu] = 96.0
    page.wait_for_function(f"{cell}.className === 'u10'")
    ticks.util[gpu] = 12.0
    page.wait_for_function(f"{cell}.className === 'u1'")
    assert seen_after_a_while(page) == {nodes[51].pk}  # the heatmap needs colours, not every node's values
    page.locator(f"#heatmap i[data-g='{gpu}']").hover()
    values = f"GPU1: 12 %, {1000 + gpu} / 24576 MiB"  # after the node's name and its state at page load
    title = f"{cell}.title"
    page.wait_for_function(
        f"{title}.startsWith({nodes[3].name!r}) && {title}.endsWith({values!r})", timeout=10000
    )
    assert page.evaluate("window.layercakeSubscribed.nodes") == sorted([nodes[51].pk, nodes[3].pk])

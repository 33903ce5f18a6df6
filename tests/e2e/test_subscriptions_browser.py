"""Per-page subscriptions in headless Chromium: each page gets the live values of what it shows.

52 nodes of 2 GPUs; ticks for every node go through the real Redis channel layer to the real server, as the
ingest fan-out publishes them (`live.publish_tick`), three times a second. The user opens a node page, pages
and filters the fleet list, and points at the heatmap.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from dashboard import alerts
from dashboard.choices import DeploymentState
from dashboard.live import GpuPoint, Publisher, announce_deployment, publish_tick
from dashboard.models import Alert, Deployment
from tests import storm
from tests.conftest import point_celery_at
from tests.e2e.test_browser import login

pytestmark = [pytest.mark.slow, pytest.mark.browser]


class Ticks:
    """Every node's GPUs at `util[gpu id]` (default 42 %) and 1000 + its id MiB used, sent until stopped."""

    def __init__(self, fleet: dict[int, list[int]]) -> None:
        self.fleet, self.util = fleet, {}
        self.silent: set[int] = set()  # nodes left out of the ticks (their agents went quiet)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        send, publisher = async_to_sync(publish_tick), Publisher()
        while not self.stop.wait(0.3):
            nodes = [
                {"node": node, "t": time.time(), "gpus": {str(g): self.point(g) for g in gpus}}
                for node, gpus in self.fleet.items()
                if node not in self.silent
            ]
            send(nodes, publisher)

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


NEAR_SCREEN = """[...document.querySelectorAll("section.node")].filter((el) => {
    const r = el.getBoundingClientRect();  // static/js/live.js watches a screen above and below too
    return r.bottom > -innerHeight && r.top < 2 * innerHeight;
}).map((el) => Number(el.dataset.node))"""


def test_it_sends_the_fleet_page_the_nodes_of_its_cards_on_screen_of_the_page_and_the_filter_shown(
    live_stack, alice, browser, ticking
):
    nodes, ticks = ticking
    ticks.util[nodes[1].gpus.get(index=0).pk] = 77.0
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    login(page, live_stack.url)
    seen = seen_after_a_while(page)
    assert seen == set(page.evaluate(NEAR_SCREEN)) and nodes[1].pk in seen and len(seen) < 50, seen
    row = page.locator(f"section[data-node='{nodes[1].pk}'] tr.gpu").first
    assert row.locator("td.util").inner_text() == "77 %"  # the live value, not the page's stored one
    page.locator(f"section[data-node='{nodes[49].pk}']").scroll_into_view_if_needed()
    page.wait_for_function(
        f"window.layercakeSubscribed.nodes.includes({nodes[49].pk})"
        f" && !window.layercakeSubscribed.nodes.includes({nodes[0].pk})",
        timeout=10000,
    )
    seen = seen_after_a_while(page)
    assert seen == set(page.evaluate(NEAR_SCREEN)) and nodes[49].pk in seen and nodes[0].pk not in seen
    page.click("a[rel=next]")
    page.wait_for_url("**page=2**")
    assert seen_after_a_while(page) == {nodes[50].pk, nodes[51].pk}
    page.fill("input[name=q]", nodes[20].name)
    page.click("form.filters button")
    page.wait_for_url(f"**q={nodes[20].name}**")
    assert seen_after_a_while(page) == {nodes[20].pk}
    assert page.locator("section.node").count() == 1


def card_status(page, node) -> str:
    return page.locator(f"section[data-node='{node.pk}']").get_attribute("data-status")


def test_it_keeps_the_status_of_cards_off_screen_live_from_the_heatmap(live_stack, alice, browser, ticking):
    nodes, ticks = ticking
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    login(page, live_stack.url)
    page.wait_for_function("window.layercakeSubscribed !== undefined", timeout=15000)
    assert nodes[49].pk not in page.evaluate("window.layercakeSubscribed.nodes")  # off screen: no values
    page.wait_for_timeout(4500)  # past 3 of its 1 s intervals: a card without news would be stale
    assert card_status(page, nodes[49]) == "online"
    ticks.silent.add(nodes[49].pk)
    page.wait_for_function(
        f"document.querySelector(\"section[data-node='{nodes[49].pk}']\").dataset.status === 'stale'",
        timeout=10000,
    )
    assert card_status(page, nodes[48]) == "online"


def cell_colour(gpu: int) -> str:
    """The palette index of the colour the heatmap canvas shows at a GPU's cell (-1: not a cell colour)."""
    return f"""(() => {{
        const [n, i] = gpuAt.get({gpu}), ratio = window.devicePixelRatio || 1;
        const x = (n.x + PAD + i * (CELL_W + CELL_GAP) + CELL_W / 2) * ratio, y = (n.y + BOX_H / 2) * ratio;
        const [r, g, b] = canvas.getContext("2d").getImageData(x, y, 1, 1).data;
        return PALETTE.indexOf("#" + [r, g, b].map((v) => v.toString(16).padStart(2, "0")).join(""));
    }})()"""


def point_at(page, gpu: int) -> tuple[float, float]:
    """Where on the screen a GPU's cell is (the pointer goes there as a user's would)."""
    canvas = page.locator("#heatmap-canvas")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    x, y = page.evaluate(
        f"(() => {{ const [n, i] = gpuAt.get({gpu}); "
        "return [n.x + PAD + i * (CELL_W + CELL_GAP) + CELL_W / 2, n.y + BOX_H / 2]; })()"
    )
    return box["x"] + x, box["y"] + y


def tip_shows(page, start: str, end: str) -> None:
    tip = "document.getElementById('heatmap-tip')"
    page.wait_for_function(
        f"!{tip}.hidden && {tip}.textContent.startsWith({start!r}) && {tip}.textContent.endsWith({end!r})",
        timeout=10000,
    )


def test_it_keeps_the_heatmap_live_and_shows_a_hovered_gpus_values(live_stack, alice, browser, ticking):
    nodes, ticks = ticking
    page = browser.new_page()
    login(page, live_stack.url)
    page.goto(f"{live_stack.url}/?q={nodes[51].name}")  # one card; the heatmap still shows every GPU
    gpu = nodes[3].gpus.get(index=1).pk
    page.wait_for_function("window.layercakeSubscribed !== undefined", timeout=15000)
    ticks.util[gpu] = 96.0
    page.wait_for_function(f"{cell_colour(gpu)} === 9", timeout=10000)  # 90-99 %
    ticks.util[gpu] = 12.0
    page.wait_for_function(f"{cell_colour(gpu)} === 1", timeout=10000)
    assert seen_after_a_while(page) == {nodes[51].pk}  # the heatmap needs colours, not every node's values
    page.mouse.move(*point_at(page, gpu))
    tip_shows(page, f"{nodes[3].name} (online) GPU1", f"GPU1: 12 %, {1000 + gpu} / 24576 MiB")
    assert page.evaluate("window.layercakeSubscribed.nodes") == sorted([nodes[51].pk, nodes[3].pk])
    page.mouse.move(0, 0)
    page.wait_for_function("document.getElementById('heatmap-tip').hidden")


def test_it_opens_a_gpus_node_from_the_heatmap_by_click_and_by_keyboard(live_stack, alice, browser, ticking):
    nodes, _ = ticking
    page = browser.new_page()
    login(page, live_stack.url)
    page.focus("#heatmap-canvas")
    page.keyboard.press("ArrowRight")  # the first GPU, then the next
    page.keyboard.press("ArrowRight")
    tip_shows(page, f"{nodes[0].name} (online) GPU1", "MiB")
    page.keyboard.press("ArrowDown")  # the next node's first GPU
    tip_shows(page, f"{nodes[1].name} (online) GPU0", "MiB")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/nodes/{nodes[1].name}/")
    page.go_back()
    page.mouse.click(*point_at(page, nodes[3].gpus.get(index=1).pk))
    page.wait_for_url(f"**/nodes/{nodes[3].name}/")


def off_the_loop(send, *args) -> None:
    """Call a sync function that sends on the channel layer (Playwright's sync API runs a loop in this thread)."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(send, *args).result()


def summary_line(page) -> str:
    return " ".join(page.locator("#fleet-summary").inner_text().split())


def test_it_keeps_the_summary_line_live(live_stack, alice, browser, ticking):
    nodes, ticks = ticking
    page = browser.new_page()
    login(page, live_stack.url)
    # No sample is stored (the page loaded with 104 GPUs silent): every figure below comes from the ticks.
    page.wait_for_function("document.getElementById('gpus-busy').textContent === '104'", timeout=15000)
    gpus = [g for n in nodes for g in n.gpus.order_by("index").values_list("pk", flat=True)]
    ticks.util[gpus[0]] = ticks.util[gpus[1]] = 3.0
    ticks.silent.add(nodes[5].pk)
    page.wait_for_function("document.getElementById('gpus-idle').textContent === '2'", timeout=15000)
    steps = {g: round((1000 + g) / 256) * 256 for g in gpus if g not in gpus[10:12]}  # node 5's are silent
    used, free = round(sum(steps.values()) / 1024), round(sum(24576 - s for s in steps.values()) / 1024)
    page.wait_for_function(
        "document.getElementById('gpus-silent').textContent === ', 2 silent'", timeout=15000
    )
    line = summary_line(page)
    assert "52 nodes: 51 online 1 stale" in line and "GPUs 100 busy, 2 idle, 2 silent" in line, line
    assert f"memory {used} GiB used, {free} GiB free" in line and "deployments none" in line, line
    deployment = Deployment.objects.create(
        id="d1", name="d1", node=nodes[1], plan={}, launch={}, state=DeploymentState.SERVING
    )
    off_the_loop(async_to_sync(announce_deployment), deployment.summary())
    alert = Alert.objects.create(key="k", kind="xid", title="t", cause="c", remedy="r", node=nodes[3])
    off_the_loop(alerts.announce, alert.summary())
    page.wait_for_function(
        "document.getElementById('sum-alerts').textContent === '1 open alert'", timeout=10000
    )
    page.wait_for_function(
        "document.getElementById('sum-deployments').textContent === '1 serving'", timeout=10000
    )
    ticks.silent.clear()  # node 5 reports again
    page.wait_for_function("document.getElementById('gpus-silent').textContent === ''", timeout=15000)
    assert "52 nodes: 52 online" in summary_line(page)

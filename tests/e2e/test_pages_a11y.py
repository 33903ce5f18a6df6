"""Every page an operator opens, in headless Chromium against the real ASGI server: an axe-core audit
(vendored in tests/vendor, test-only) finds no serious or critical violation; the alert pages and the
banner fit a phone (390 px); a node with 13 NICs keeps its topology grid inside its box, headers in view."""

import json
from pathlib import Path

import pytest

from agents import protocol
from dashboard import alerts, deploy
from dashboard.ingest import apply_hello
from dashboard.models import Deployment, Node, PlanRequest
from tests.e2e.test_browser import login
from tests.fixtures import fixture_files, read_fixture
from tests.personas import hello_for, seed_server

pytestmark = [pytest.mark.slow, pytest.mark.browser]
AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe.min.js"
BLOCKING = ("serious", "critical")
PHONE = {"width": 390, "height": 844}


def thirteen_nic_node() -> Node:
    """penny's 8x H100 with 13 NICs (a public nvidia-smi topo -m paste), as an agent would report it."""
    [path] = fixture_files("topo", "036_*")
    parsed = __import__("agents.topo", fromlist=["parse_topology"]).parse_topology(read_fixture(path)[1])
    topology = protocol.Topology.model_validate({k: parsed[k] for k in ("gpus", "nics", "links")})
    node = Node.objects.create(name="penny-h100")
    apply_hello(node, hello_for("penny-h100", "sim:h100x8").model_copy(update={"topology": topology}))
    return node


@pytest.fixture
def pages(live_stack, alice) -> dict[str, str]:
    """One of every page, with something on it: a planned model, a serving deployment, an open alert."""
    seed_server()
    thirteen_nic_node()
    row = deploy.run_plan_request(
        PlanRequest.objects.create(model_ref="Qwen3-VL-32B-Instruct", max_model_len=10000).pk
    )
    deployment = deploy.create_deployment(row, 0, alice)
    Deployment.objects.filter(pk=deployment.pk).update(
        state="serving", port=51507, pid=4242, tokens_per_s=21.5
    )
    deployment.refresh_from_db()
    alert = alerts.raise_alert(
        key=f"stall:{deployment.pk}",
        kind="stall",
        title=f"{deployment.name} on a30-seed: no tokens for 75 s with 2 request(s) in flight",
        cause="TP=2 all-reduces across SYS without P2P. " * 3,
        remedy="Restart with NCCL_P2P_DISABLE=1, or re-plan as a pipeline-parallel layout.",
        deployment=deployment,
        evidence={
            "log": [
                "INFO 12-01 10:00:00 loggers.py:123] Engine 000: Avg generation throughput: 0.0 tokens/s, "
                * 4
            ]
        },
    )
    return {
        "fleet": "/",
        "node": "/nodes/a30-seed/",
        "deploy": "/deploy/",
        "plans": row.get_absolute_url(),
        "deployment": deployment.get_absolute_url(),
        "alerts": "/alerts/",
        "alert": alert.get_absolute_url(),
        "settings": "/alerts/settings/",
    }


def violations(page) -> list[dict]:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("async () => (await axe.run(document)).violations")
    return [
        {
            "rule": v["id"],
            "impact": v["impact"],
            "nodes": [n["target"] for n in v["nodes"]][:5],
            "help": v["help"],
        }
        for v in found
        if v["impact"] in BLOCKING
    ]


def test_it_passes_the_axe_audit_on_every_page(live_stack, pages, browser):
    anonymous = browser.new_page()
    anonymous.goto(live_stack.url + "/accounts/login/")
    found = {"login": violations(anonymous)}
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    login(page, live_stack.url)
    for name, url in pages.items():
        page.goto(live_stack.url + url)
        page.wait_for_load_state("networkidle")
        found[name] = violations(page)
    assert not any(found.values()), json.dumps({k: v for k, v in found.items() if v}, indent=1)


def test_it_fits_the_alert_pages_and_the_banner_on_a_phone(live_stack, pages, browser, log_dir):
    page = browser.new_page(viewport=PHONE)
    login(page, live_stack.url)
    for name in ("alert", "alerts", "fleet"):
        page.goto(live_stack.url + pages[name])
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"{name} page is {width} px wide at {PHONE['width']} px"
        banner = page.locator(".alert-banner").bounding_box()
        assert banner["width"] <= PHONE["width"] and page.locator(".alert-banner a").first.is_visible()
    page.goto(live_stack.url + pages["alert"])
    page.screenshot(path=str(log_dir / "alert-phone.png"), full_page=True)


def test_it_scrolls_a_wide_topology_inside_its_box_with_the_headers_kept_in_view(live_stack, alice, browser):
    thirteen_nic_node()
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    login(page, live_stack.url)
    page.goto(live_stack.url + "/nodes/penny-h100/")
    assert page.locator("#topology thead th").count() == 1 + 8 + 13 + 2
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440
    box = page.locator(".topo-scroll")
    assert box.evaluate("el => el.scrollWidth > el.clientWidth")
    corner = page.locator("#topology tbody th").first.bounding_box()
    box.evaluate("el => { el.scrollLeft = 400; el.scrollTop = 200; }")
    assert page.locator("#topology tbody th").first.bounding_box()["x"] == pytest.approx(corner["x"], abs=1)
    header = page.locator("#topology thead th").nth(3)
    assert header.bounding_box()["y"] == pytest.approx(
        page.locator("#topology thead th").first.bounding_box()["y"], abs=1
    )
    assert header.bounding_box()["y"] >= box.bounding_box()["y"] - 1


def test_it_wraps_a_long_log_line_inside_the_deployment_page(live_stack, pages, browser):
    from dashboard.models import LogChunk

    deployment = Deployment.objects.get()
    LogChunk.objects.create(
        node=deployment.node, source=deployment.pk, seq=1, t=deployment.created, lines=["x" * 3000]
    )
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    login(page, live_stack.url)
    page.goto(live_stack.url + pages["deployment"])
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440

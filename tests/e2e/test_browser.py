"""An operator in headless Chromium: log in, open a node, see the topology grid and a live chart."""

import json
import os
import re
import signal

import pytest

from dashboard.models import Deployment
from tests.e2e.test_e2e_deploy import complete
from tests.harness import node_with_token, start_agent, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def login(page, base_url: str) -> None:
    page.goto(base_url + "/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "alice-pw-123")
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def test_it_shows_the_topology_grid_and_a_chart_receiving_points(live_stack, alice, browser, log_dir):
    node, token = node_with_token("a30-seed")
    agent = start_agent(live_stack.url, token, "sim:a30x4", log_dir)
    try:
        wait_until(lambda: node.gpus.count() == 4, what="agent hello")
        page = browser.new_page()
        login(page, live_stack.url)
        assert page.locator("section.node h2 a", has_text="a30-seed").is_visible()
        page.wait_for_timeout(2000)  # live ticks rewrite the GPU rows, reading each point's values by name
        assert all(re.fullmatch(r"\d+ %", t) for t in page.locator("tr.gpu td.util").all_inner_texts())
        assert all(re.fullmatch(r"\d+ / \d+ MiB", t) for t in page.locator("tr.gpu .mem").all_inner_texts())
        page.click("text=a30-seed")
        page.wait_for_selector("table#topology")
        cells = page.locator("table#topology tbody tr").nth(0).locator("td.cell").all_inner_texts()
        assert cells[:4] == ["X", "SYS\nNS/NS", "SYS\nNS/NS", "SYS\nNS/NS"]  # link, then P2P read/write
        page.wait_for_function("window.layercakePoints >= 2", timeout=15000)
        points = page.evaluate(
            "Chart.getChart('chart-' + document.querySelector('figure.chart').dataset.gpu)"
            ".data.datasets[0].data.length"
        )
        assert points >= 2
        memory = page.evaluate(
            "Chart.getChart('chart-' + document.querySelector('figure.chart').dataset.gpu)"
            ".data.datasets[1].data.map((d) => d.y)"
        )
        assert all(0 <= y <= 100 for y in memory), memory
        assert page.locator("#live-status").inner_text() == "live"
        page.screenshot(path=str(log_dir / "node-page.png"), full_page=True)
    finally:
        agent.stop()


def test_it_fills_the_chart_gap_after_the_live_socket_reconnects(live_stack, alice, browser, log_dir):
    node, token = node_with_token("a30-seed")
    agent = start_agent(live_stack.url, token, "sim:a30x4", log_dir)
    sockets, outage = [], []

    def through(ws) -> None:  # the page's socket goes through here, so the test can cut it
        sockets.append(ws)
        if outage:  # the server is away: the page's retries (within a second, live.js) are closed at once
            ws.close()
            return
        ws.connect_to_server()

    try:
        wait_until(lambda: node.gpus.count() == 4, what="agent hello")
        page = browser.new_page()
        page.route_web_socket("**/ws/fleet/", through)
        login(page, live_stack.url)
        page.goto(f"{live_stack.url}/nodes/{node.name}/")
        page.wait_for_function("window.layercakePoints >= 2", timeout=15000)
        outage.append(True)
        sockets[-1].close()
        page.wait_for_function("document.getElementById('live-status').textContent !== 'live'", timeout=5000)
        page.wait_for_timeout(2500)  # the agent keeps sending; the page hears nothing of it
        outage.clear()
        page.wait_for_function("window.layercakeBackfilled > 0", timeout=20000)
        gaps = page.evaluate("""() => {
            const xs = Chart.getChart('chart-' + document.querySelector('figure.chart').dataset.gpu)
                .data.datasets[0].data.map((d) => d.x);
            return Math.max(...xs.slice(1).map((x, i) => x - xs[i]));
        }""")
        assert gaps < 2500  # one sample a second: no hole the length of the outage is left
    finally:
        agent.stop()


def test_it_marks_a_node_stale_when_its_agent_goes_silent(live_stack, alice, browser, log_dir):
    node, token = node_with_token("rtx4090-box")
    agent = start_agent(live_stack.url, token, "sim:rtx4090x2", log_dir)
    wait_until(lambda: node.gpus.count() == 2, what="agent hello")
    page = browser.new_page()
    login(page, live_stack.url)
    section = page.locator(f'section.node[data-node="{node.pk}"]')
    page.wait_for_function(
        f'document.querySelector(\'section[data-node="{node.pk}"]\').dataset.status == "online"'
    )
    agent.proc.send_signal(signal.SIGSTOP)  # the agent hangs without closing its socket
    try:
        page.wait_for_function(
            f'document.querySelector(\'section[data-node="{node.pk}"]\').dataset.status == "stale"',
            timeout=5000,
        )
        assert section.locator(".status").inner_text() == "Stale"
    finally:
        agent.proc.send_signal(signal.SIGCONT)
        agent.stop()


def test_it_deploys_the_top_plan_from_the_form_and_watches_it_serve(
    live_stack, alice, browser, log_dir, celery_worker, tmp_path
):
    node, token = node_with_token("a30-seed")
    agent = start_agent(live_stack.url, token, "sim:a30x4,workload=idle", log_dir, run_dir=tmp_path / "run")
    try:
        wait_until(lambda: node.gpus.count() == 4, what="agent hello")
        page = browser.new_page()
        login(page, live_stack.url)
        page.click("text=Deploy model")
        page.fill("input[name=model]", "Qwen3-VL-32B-Instruct")
        page.fill("input[name=max_model_len]", "10000")
        page.select_option("select[name=node]", "a30-seed")
        page.click("button[type=submit]")
        page.wait_for_selector("li.plan", timeout=30000)
        assert "TP 1 × PP 4" in page.locator("li.plan").first.inner_text()
        assert page.locator("table.rejected").is_visible()
        page.locator("li.plan").first.locator("button", has_text="Deploy this plan").click()
        page.wait_for_selector("#state")
        page.wait_for_function("document.getElementById('state').textContent === 'Ready'", timeout=60000)
        deployment = Deployment.objects.get()
        port = deployment.port
        complete(port)  # a client outside the browser, as in real life
        page.wait_for_function("document.getElementById('state').textContent === 'Serving'", timeout=30000)
        page.screenshot(path=str(log_dir / "deployment-page.png"), full_page=True)
    finally:
        agent.stop()
        for state in (tmp_path / "run").glob("*.json"):
            os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)

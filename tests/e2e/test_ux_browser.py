"""An operator in headless Chromium uses a deployment from its page ("Try it", "Measure") and finds what runs
on each GPU of the node, on the real stack (uvicorn, Celery, Redis, an agent running the simulated server)."""

# ruff: noqa: F811 (seed_agent is a fixture, imported from the deploy end-to-end tests)
import re

import pytest

from dashboard.models import DeploymentLoadTest
from tests.e2e.test_browser import login
from tests.e2e.test_e2e_deploy import deploy_plan, plan_through_the_form, seed_agent, server_env, state_of  # noqa: F401
from tests.harness import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture
def serving(operator, seed_agent):
    deployment = deploy_plan(operator, plan_through_the_form(operator, model="Qwen3-VL-32B-Instruct"))
    wait_until(lambda: state_of(deployment) in ("ready", "serving"), timeout=60, what="ready")
    return deployment


def test_it_tries_a_prompt_and_measures_the_deployment_from_its_page(live_stack, serving, browser, log_dir):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    login(page, live_stack.url)
    page.goto(live_stack.url + serving.get_absolute_url())
    assert page.locator("#base-url").inner_text() == f"http://127.0.0.1:{serving.port}/v1"
    page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
    page.fill("#try-max-tokens", "20")
    page.click("#try-send")
    page.wait_for_function(
        "document.getElementById('try-status').textContent.startsWith('done')", timeout=30000
    )
    assert len(page.locator("#try-answer").inner_text().split()) == 20  # the simulated server: a word a token
    assert re.search(
        r"done: 20 tokens, first after \d+ ms, [\d.]+ tok/s", page.locator("#try-status").inner_text()
    )
    page.fill("#measure-streams", "3")
    page.fill("#measure-max-tokens", "24")
    page.click("#measure-run")
    page.wait_for_selector("#measurements tbody tr.measurement", timeout=30000)
    row = DeploymentLoadTest.objects.get(deployment=serving)
    assert (row.status, row.streams, row.completed, row.tokens) == ("done", 3, 3, 72)
    predicted = serving.chosen_plan.decode_tok_s
    assert (
        0.5 * predicted < row.tok_s_per_stream < 1.2 * predicted
    )  # the simulated server runs at the prediction
    cells = page.locator("#measurements tbody tr.measurement").first
    assert cells.locator(".per-stream").inner_text() == f"{row.tok_s_per_stream:.1f}"
    assert cells.locator(".predicted").inner_text() == f"{predicted:.1f}"
    page.screenshot(path=str(log_dir / "deployment-use-it.png"), full_page=True)
    page.reload()  # the measurement is stored: the page shows it after a reload too
    assert (
        page.locator("#measurements tbody tr.measurement .per-stream").first.inner_text()
        == f"{row.tok_s_per_stream:.1f}"
    )


def test_it_finds_the_deployment_holding_a_gpu_on_the_node_page(live_stack, serving, browser, log_dir):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    login(page, live_stack.url)
    page.goto(f"{live_stack.url}/nodes/a30-seed/")
    held = serving.launch["gpus"]
    for index in held:
        row = page.locator(f"#gpu-use tr[data-index='{index}']")
        assert row.locator(".holder a").inner_text() == serving.name
    wait_until(lambda: serving.__class__.objects.get(pk=serving.pk).pid, what="pid")
    page.reload()
    row = page.locator(f"#gpu-use tr[data-index='{held[0]}']")
    assert f"pid {state_pid(serving)} python3" in row.locator(".processes .mine").inner_text()
    assert "this deployment" in row.locator(".split-text").inner_text()
    assert page.locator("#node-deployments tr.deployment a").first.inner_text() == serving.name
    page.locator(f"#gpu-use tr[data-index='{held[0]}'] .holder a").click()
    page.wait_for_url(live_stack.url + serving.get_absolute_url())
    page.goto(f"{live_stack.url}/nodes/a30-seed/")
    page.screenshot(path=str(log_dir / "node-gpus.png"), full_page=True)


def state_pid(deployment) -> int:
    deployment.refresh_from_db()
    return deployment.pid

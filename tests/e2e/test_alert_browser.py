"""The alert banner and detail page in headless Chromium, updated live over /ws/fleet/ without a reload."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from dashboard import alerts, tasks
from tests.e2e.test_browser import login

pytestmark = [pytest.mark.slow, pytest.mark.browser]
TITLE = "qwen on a30-seed: no tokens for 70 s with 3 request(s) in flight"


@pytest.fixture
def shared_layer(settings, server_env, monkeypatch):
    """This test process announces through the live stack's Redis; no mail is sent here."""
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [server_env["REDIS_URL"]]},
        }
    }
    monkeypatch.setattr(tasks, "queue_delivery", lambda: None)


def off_the_loop(fn, *args):
    """Playwright's sync API keeps an event loop in this thread; the alerts API is sync code like a Celery task."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def raise_stall() -> alerts.Alert:
    return alerts.raise_alert(
        key="stall:seed",
        kind="stall",
        title=TITLE,
        cause="TP=2 across SYS without P2P.",
        remedy="Restart with NCCL_P2P_DISABLE=1.",
        evidence={
            "log": ["no tokens"],
            "series": {
                "t": [1.7e9, 1.7e9 + 2, 1.7e9 + 4],
                "generation_tokens_total": [500, 500, 500],
                "requests_running": [3, 3, 3],
            },
        },
    )


def test_it_shows_and_clears_the_banner_live_and_acknowledges_on_the_detail_page(
    live_stack, shared_layer, alice, browser
):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    login(page, live_stack.url)
    page.goto(live_stack.url + "/deployments/")  # a page that loads live.js itself too
    page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
    alert = off_the_loop(raise_stall)
    page.wait_for_selector(f".alert-banner li >> text={TITLE}", timeout=10000)
    page.click(f".alert-banner li >> text={TITLE}")
    page.wait_for_url(live_stack.url + alert.get_absolute_url())
    assert page.evaluate("Chart.getChart('evidence-chart').data.datasets.map((d) => d.data.length)") == [3, 3]
    page.click("#acknowledge")
    assert page.locator("#alert-status").inner_text() == "Acknowledged"
    page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
    off_the_loop(alerts.resolve_alert, alert.key, "generation resumed")
    page.wait_for_function(
        "document.getElementById('alert-status').textContent === 'Resolved'", timeout=10000
    )
    page.wait_for_function("!document.querySelector('.alert-banner')", timeout=10000)
    assert errors == []

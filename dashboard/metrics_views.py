"""`/metrics` for Prometheus: the access check (scrape_access) and the rendering (exporter) are elsewhere."""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from dashboard.exporter import RENDERER
from dashboard.scrape_access import check_scrape
from dashboard.telemetry import LIVE

log = logging.getLogger(__name__)


@require_safe
async def metrics(request: HttpRequest) -> HttpResponse:
    verdict = check_scrape(request.META.get("REMOTE_ADDR", ""), request.headers.get("Authorization", ""))
    if verdict.status != 200:
        log.warning("/metrics refused to %s: %s", request.META.get("REMOTE_ADDR", "?"), verdict.reason)
        response = HttpResponse(f"{verdict.reason}\n", status=verdict.status, content_type="text/plain")
        if verdict.challenge:
            response["WWW-Authenticate"] = verdict.challenge
        return response
    # In a pool thread: off the event loop, and not queued behind the agents' database thread (agent_db).
    text = await sync_to_async(render_scrape, thread_sensitive=False)()
    return HttpResponse(
        text, content_type=CONTENT_TYPE_PLAIN_0_0_4
    )  # what generate_latest writes; Prometheus 2 reads it


def render_scrape() -> bytes:
    """One scrape's text from this process's live state, in the calling thread (never the event loop's):
    the view's pool thread, or the metrics listener's (dashboard/metrics_listener.py)."""
    text, cpu_s = RENDERER.render(LIVE.snapshot())
    LIVE.scraped(cpu_s)
    return text

"""`/metrics` for Prometheus: the access check (scrape_access) and the rendering (exporter) are elsewhere."""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, gzip_accepted

from dashboard.exporter import RENDERER
from dashboard.exposition import RenderUnavailable
from dashboard.scrape_access import Verdict, check_scrape
from dashboard.telemetry import LIVE

log = logging.getLogger(__name__)


@require_safe
async def metrics(request: HttpRequest) -> HttpResponse:
    verdict = check_scrape(request.META.get("REMOTE_ADDR", ""), request.headers.get("Authorization", ""))
    if verdict.status != 200:
        return refused(request, verdict)
    live = LIVE.snapshot()  # on the event loop that records into it
    compress = gzip_accepted(request.headers.get("Accept-Encoding", ""))  # Prometheus asks for gzip
    try:
        # In a thread of its own: the ingest buffer's writes keep asgiref's one sync thread.
        text, cpu_s = await sync_to_async(RENDERER.render, thread_sensitive=False)(live, compress)
    except RenderUnavailable as error:
        log.error("/metrics not rendered: %s", error)
        response = HttpResponse(
            f"{error}; a new one starts on the next scrape\n", status=503, content_type="text/plain"
        )
        response["Retry-After"] = "1"
        return response
    LIVE.scraped(cpu_s)
    return exposition(text, compress)


def refused(request: HttpRequest, verdict: Verdict) -> HttpResponse:
    log.warning("/metrics refused to %s: %s", request.META.get("REMOTE_ADDR", "?"), verdict.reason)
    response = HttpResponse(f"{verdict.reason}\n", status=verdict.status, content_type="text/plain")
    if verdict.challenge:
        response["WWW-Authenticate"] = verdict.challenge
    return response


def exposition(text: bytes, compressed: bool) -> HttpResponse:
    # gzip: ~1 MB instead of ~15 at 1,000 x 8 GPUs, far fewer writes for the event loop that takes the ingest
    response = HttpResponse(
        text, content_type=CONTENT_TYPE_PLAIN_0_0_4
    )  # generate_latest's; Prometheus 2 reads it
    response["Vary"] = "Accept-Encoding"
    if compressed:
        response["Content-Encoding"] = "gzip"
    return response

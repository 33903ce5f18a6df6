"""Static files under ASGI: served by WhiteNoise without putting every request on asgiref's one sync thread."""

from __future__ import annotations

import pytest
from asgiref.sync import SyncToAsync
from django.core.handlers.asgi import ASGIHandler
from django.test import AsyncClient, Client

from dashboard.static_files import StaticFilesMiddleware


def test_it_keeps_the_asgi_middleware_chain_off_the_sync_thread():
    """One sync-only middleware would make Django wrap the whole chain in SyncToAsync(thread_sensitive=True)."""
    assert not isinstance(ASGIHandler()._middleware_chain, SyncToAsync)


@pytest.mark.asyncio
@pytest.mark.parametrize("autorefresh", [False, True])
async def test_it_serves_a_static_file_and_passes_other_requests_on_under_asgi(settings, autorefresh):
    settings.WHITENOISE_AUTOREFRESH = autorefresh
    client = AsyncClient()
    response = await client.get("/static/css/app.css")
    assert response.status_code == 200
    assert b"".join(response.streaming_content).strip()  # a file, read in this thread
    assert (await client.get("/static/css/no-such-file.css")).status_code == 404
    assert (await client.get("/metrics")).status_code in (401, 403)  # reached the view


def test_it_serves_a_static_file_under_wsgi():
    response = Client().get("/static/css/app.css")
    assert response.status_code == 200 and b"".join(response.streaming_content).strip()
    assert not StaticFilesMiddleware(lambda request: None).is_async

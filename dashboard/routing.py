from __future__ import annotations

from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator, WebsocketDenier
from django.conf import settings
from django.urls import path

from dashboard.consumers import AgentConsumer, FleetConsumer

DEFAULT_PORTS = {"http": 80, "https": 443}


class SameOriginValidator:
    """Browser sockets only from the page's own origin: host *and port* as the request's Host header says
    (or an origin listed in CSRF_TRUSTED_ORIGINS). ALLOWED_HOSTS names hosts without ports, so checking
    the origin against it alone let any other service on the same host (http://localhost:9999) in."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not same_origin(dict(scope.get("headers", []))):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def same_origin(headers: dict[bytes, bytes]) -> bool:
    origin = headers.get(b"origin", b"").decode("latin-1")
    host = headers.get(b"host", b"").decode("latin-1")
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    if not host or parts.scheme not in DEFAULT_PORTS:
        return False
    # A Host header without a port means the default port of the scheme the page itself was loaded with.
    page = _host_port(parts.netloc, parts.scheme)
    return page is not None and page == _host_port(host, parts.scheme)


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"//{netloc}")
        return (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS[scheme]
    except ValueError:  # a port that is not a number
        return None


websocket_urlpatterns = [
    # Agents authenticate with their token and send no Origin header; browsers need session and origin.
    path("ws/agent/", AgentConsumer.as_asgi()),
    path(
        "ws/fleet/",
        AllowedHostsOriginValidator(SameOriginValidator(AuthMiddlewareStack(FleetConsumer.as_asgi()))),
    ),
]

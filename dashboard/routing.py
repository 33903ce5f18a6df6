from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from dashboard.consumers import AgentConsumer, FleetConsumer

websocket_urlpatterns = [
    # Agents authenticate with their token and send no Origin header; browsers need session and origin.
    path("ws/agent/", AgentConsumer.as_asgi()),
    path("ws/fleet/", AllowedHostsOriginValidator(AuthMiddlewareStack(FleetConsumer.as_asgi()))),
]

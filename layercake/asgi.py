"""ASGI entry point: HTTP goes to Django, websockets to the agent and browser consumers."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({"http": django_asgi_app, "websocket": URLRouter(websocket_urlpatterns)})

# The ASGI server imports this module once per serving process (each uvicorn worker; not its --reload parent);
# uvicorn runs with --lifespan off (Django's handler takes no lifespan events), and AppConfig.ready would also
# run in manage.py commands and Celery. Tests that import the application listen only if the variable is set.
from dashboard.metrics_listener import start_from_settings  # noqa: E402

METRICS_LISTENER = start_from_settings()  # None unless LAYERCAKE_METRICS_LISTEN is set

from dashboard.ws_compression import use_fast_deflate  # noqa: E402

use_fast_deflate()  # each open fleet page's socket compresses its heatmap: zlib's fastest level

# Measured with 1,000 agents x 8 GPUs: at the default thresholds (700, 10, 10) the frames and rows that wait
# ~0.5 s in the ingest buffer outlive two young collections, the old generation fills, and a full collection
# ran every ~3 s for 0.2-0.36 s, stalling every socket: browser p99 1.1-1.5 s instead of ~0.7 s. Fewer,
# larger young collections promote far fewer of them (no full collection in a 30 s run, same resident
# memory), and what Django and the app loaded at startup is never scanned again.
gc.freeze()
gc.set_threshold(50_000, 20, 10)

"""The REST API, /api/v1/ (django-ninja: the OpenAPI schema is generated from the pydantic schemas).

Every operation calls the same functions as the pages (fleet, read, deploy, alerts, tasks) and checks the
same roles; a personal API token's scope narrows them further (`auth.permit`).
"""

from __future__ import annotations

from ninja import NinjaAPI

from dashboard.api import agent_tokens, alerts, deployments, errors, model_choices, nodes, plans
from dashboard.api.auth import AUTH

api = NinjaAPI(
    title="layercake API",
    version="1",
    description="The GPU fleet, plans, deployments and alerts of layercake. Authenticate with "
    "`Authorization: Bearer <personal API token>` (create one at /account/tokens/) or the browser's session.",
    auth=AUTH,
    urls_namespace="api-v1",
    openapi_url="/schema/",
    docs_url=None,  # the docs page is ours: Swagger UI from static/vendor, never a CDN (dashboard.api_pages)
)
errors.install(api)
api.add_router("/nodes/", nodes.router)
api.add_router("/", plans.router)
api.add_router("/models/", model_choices.router)
api.add_router("/deployments/", deployments.router)
api.add_router("/alerts/", alerts.router)
api.add_router("/agent-tokens/", agent_tokens.router)

"""Template context for every page: the alert banner."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from dashboard.models import Alert

BANNER_LIMIT = 5


def alert_banner(request: HttpRequest) -> dict[str, Any]:
    """Unresolved alerts for the banner on every page (logged-in users only); the JS keeps it current."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {**banner_context(), "demo_mail": bool(settings.DEMO_MAIL_DIR)}


def banner_context() -> dict[str, Any]:
    alerts = Alert.objects.unresolved().select_related("acknowledged_by")
    shown, count = list(alerts[:BANNER_LIMIT]), alerts.count()
    return {"banner_alerts": shown, "banner_alert_count": count, "banner_more": count - len(shown)}

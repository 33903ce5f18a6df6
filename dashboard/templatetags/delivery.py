"""`{{ text|delivery_error:user }}`: a transport's raw error for admins, "delivery failed" for anyone else."""

from __future__ import annotations

from typing import Any

from django import template

from dashboard.transports import GENERIC_FAILURE, shows_raw_errors

register = template.Library()


@register.filter
def delivery_error(text: str, user: Any) -> str:
    if not text:
        return ""
    return text if shows_raw_errors(user) else GENERIC_FAILURE

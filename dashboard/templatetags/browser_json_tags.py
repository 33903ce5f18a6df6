from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import json_script
from django.utils.safestring import SafeString

from dashboard.browser_json import BrowserJSONEncoder

register = template.Library()


@register.filter
def browser_json_script(value: Any, element_id: str) -> SafeString:
    """`json_script`, written with the strict encoder (no NaN or Infinity for `JSON.parse` to choke on)."""
    return json_script(value, element_id, encoder=BrowserJSONEncoder)

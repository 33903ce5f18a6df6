"""The one way JSON is written for browsers: strict JSON that `JSON.parse` always reads.

Python's json writes NaN and Infinity by default, and one such value (a sample stored before the protocol
refused them, a rate divided by zero) made every fleet tick unreadable in every browser. Here a non-finite
number becomes null, so one bad value shows as a gap instead of freezing the page.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import JsonResponse


class BrowserJSONEncoder(DjangoJSONEncoder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_nan"] = False
        super().__init__(*args, **kwargs)

    def encode(self, o: Any) -> str:
        try:
            return super().encode(o)  # the common case: one pass of the C encoder
        except ValueError:
            return super().encode(finite(o))


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float (however deep in lists and dicts) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return BrowserJSONEncoder().encode(value)


def json_response(data: Any, status: int = 200) -> JsonResponse:
    return JsonResponse(data, status=status, encoder=BrowserJSONEncoder)

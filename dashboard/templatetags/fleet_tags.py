"""The fleet page's GPU rows, written in Python: 400 rows through `{% include %}` were most of its render."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

from django import template
from django.template.defaultfilters import floatformat
from django.utils.html import format_html
from django.utils.safestring import SafeString

from dashboard.fleet import GpuRow

register = template.Library()

ROW = (
    '<tr class="gpu" data-gpu="{}">\n  <td>GPU{}</td>\n  <td>{}{}</td>\n  <td class="num util">{}</td>\n'
    '  <td class="bar"><span class="fill" style="width: {}%"></span>\n    <span class="mem">{}</span></td>\n'
    '  <td class="num temp">{}</td>\n  <td class="num power">{}</td>\n</tr>\n'
)


@register.simple_tag
def gpu_cells(row: GpuRow) -> SafeString:
    """One GPU's row of a node card: its model, the deployment holding it, and its newest point."""
    gpu, point, holder = row.gpu, row.point, row.holder
    held = (
        format_html(' <a class="holder" href="{}">{}</a>', holder.get_absolute_url(), holder.name)
        if holder
        else ""
    )
    if point is None:
        cells = ("–", 0, f"– / {gpu.memory_total_mib} MiB", "–", "–")
    else:
        cells = (
            f"{whole(point.util)} %",
            _width(point.mem_used, point.mem_total),
            f"{whole(point.mem_used)} / {whole(point.mem_total)} MiB",
            f"{whole(point.temp)} °C",
            f"{whole(point.power)} W",
        )
    return format_html(ROW, gpu.pk, gpu.index, gpu.name, held, *cells)


def whole(value: float) -> str:
    """`{{ value|floatformat:0 }}` of a reading (half away from zero, no "-0"), without its localization work:
    5,000 of those were a third of the render."""
    if not math.isfinite(value):
        return floatformat(value, 0)
    return str(int(Decimal(repr(value)).quantize(Decimal(1), ROUND_HALF_UP)))


def _width(used: float, total: float) -> str:
    """`{% widthratio used total 100 %}`: the bar's percent."""
    try:
        return str(round(used / total * 100))
    except ZeroDivisionError:
        return "0"
    except (ValueError, OverflowError):
        return ""

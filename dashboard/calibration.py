"""Predicted against measured for every deployment, and the fleet calibration the planner learns from it.

* `measure(deployment)`: the server's own startup lines (weights, KV cache; agents.startup) and its decode rate
  from the metrics the agent scraped (median tokens/s per stream and in total over the intervals it was
  decoding), stored beside the plan's predictions in one DeploymentMeasurement row.
* `fleet_factors()`: per GPU model x backend x TP link class, the measured/predicted decode ratios folded into
  one factor by placement.calibration.fleet_factor (shrunk toward the published calibration, nothing below
  MIN_SAMPLES deployments, clamped); the planning service passes them to the planner.
* `calibration_rows()` / `markdown_report()`: the calibration in use, its sample counts and its accuracy
  (published against fleet-calibrated, the latter leave-one-out so a sample never grades its own factor).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from agents.startup import read_startup
from dashboard.choices import DeploymentState
from dashboard.models import Deployment, DeploymentMeasurement, LogChunk
from placement.calibration import MIN_SAMPLES, PRIOR_SAMPLES, FleetKey, fleet_factor, within

STARTUP_CHUNKS = 200  # the first log messages of a deployment hold its startup lines
DECODE_INTERVALS = 2000  # the newest metric intervals the decode figures use (~30 min at 1 s)
RECENT = timedelta(minutes=10)  # a deployment that ended this recently is measured once more


def startup_lines(deployment: Deployment) -> Iterator[str]:
    chunks = LogChunk.objects.filter(node=deployment.node, source=deployment.pk).order_by("t", "seq")
    for chunk in chunks[:STARTUP_CHUNKS]:
        yield from chunk.lines


def decode_figures(deployment: Deployment) -> tuple[float | None, float | None, float | None, int]:
    """(median streams, median tok/s per stream, median tok/s in total, intervals) over the newest metric
    intervals in which the server was generating with at least one request running."""
    rows = (
        deployment.metrics.filter(requests_running__gte=1, generation_tokens_per_s__gt=0)
        .order_by("-t")
        .values_list("generation_tokens_per_s", "requests_running")[:DECODE_INTERVALS]
    )
    pairs = [(gen, running) for gen, running in rows if gen is not None and running]
    if not pairs:
        return None, None, None, 0
    return (
        statistics.median(r for _, r in pairs),
        statistics.median(g / r for g, r in pairs),
        statistics.median(g for g, _ in pairs),
        len(pairs),
    )


def predicted_fields(deployment: Deployment) -> dict[str, Any]:
    """What the chosen plan predicted, and the calibration key and factor it was planned with."""
    plan = deployment.plan
    performance = plan.get("performance") or {}
    key = performance.get("calibration") or {}
    return {
        "gpu_model": str(key.get("gpu", ""))[:100],
        "backend": str(key.get("backend", plan.get("backend", "")))[:20],
        "link_class": str(key.get("link", ""))[:20],
        "fleet_factor": float(key.get("fleet_factor", 1.0)),
        "planned_streams": performance.get("streams"),
        "predicted_weights_gib": plan.get("weights_gib_per_gpu"),
        "predicted_kv_tokens": plan.get("kv_cache_tokens"),
        "predicted_stream_tok_s": plan.get("decode_tok_s"),
        "predicted_single_tok_s": performance.get("single_stream_tok_s"),
    }


def measure(deployment: Deployment) -> DeploymentMeasurement:
    """Record (again) what the deployment's server said at startup and how fast it decoded."""
    row = DeploymentMeasurement(deployment=deployment, **predicted_fields(deployment))
    facts = read_startup(startup_lines(deployment))
    row.weights_gib, row.kv_tokens = facts.weights_gib, facts.kv_tokens
    row.kv_cache_gib, row.max_concurrency = facts.kv_cache_gib, facts.max_concurrency
    figures = decode_figures(deployment)
    if not figures[3]:  # no metric rows (any more: METRIC_RETENTION_DAYS): what was measured from them stands
        figures = measured_decode(deployment) or figures
    row.streams, row.stream_tok_s, row.total_tok_s, row.decode_intervals = figures
    row.save()
    return row


def measured_decode(deployment: Deployment) -> tuple[float | None, float | None, float | None, int] | None:
    """The decode figures recorded for the deployment earlier, if any were measured."""
    earlier = DeploymentMeasurement.objects.filter(deployment=deployment, decode_intervals__gt=0)
    return earlier.values_list("streams", "stream_tok_s", "total_tok_s", "decode_intervals").first()


def measure_recent() -> int:
    """Measure every deployment that is running or ended recently (the beat task); how many were measured."""
    since = timezone.now() - RECENT
    rows = Deployment.objects.select_related("node").filter(
        state__in=DeploymentState.ACTIVE
    ) | Deployment.objects.select_related("node").filter(state_since__gte=since)
    count = 0
    for deployment in rows.distinct():
        measure(deployment)
        count += 1
    return count


def predicted_vs_measured(deployment: Deployment) -> dict[str, Any]:
    """For the API: the deployment measured now, as JSON (ratio = measured / predicted)."""
    row = measure(deployment)
    return {
        "deployment": deployment.pk,
        "calibration_key": {"gpu": row.gpu_model, "backend": row.backend, "link": row.link_class},
        "fleet_factor": row.fleet_factor,
        "streams": row.streams,
        "total_tok_s": row.total_tok_s,
        "decode_intervals": row.decode_intervals,
        "startup": {"kv_cache_gib": row.kv_cache_gib, "max_concurrency": row.max_concurrency},
        "rows": row.comparison(),
    }


# ---------------------------------------------------------------- the fleet calibration


def base_ratios() -> dict[FleetKey, list[float]]:
    """Measured/published-prediction decode ratios of every measured deployment, per calibration key."""
    grouped: dict[FleetKey, list[float]] = defaultdict(list)
    for row in DeploymentMeasurement.objects.exclude(gpu_model="").filter(decode_intervals__gt=0):
        ratio = row.base_decode_ratio
        if ratio is not None:
            grouped[FleetKey(row.gpu_model, row.backend, row.link_class)].append(ratio)
    return grouped


def fleet_factors() -> tuple[tuple[str, str, str, float], ...]:
    """The factors the planner applies (only keys whose factor moved off 1)."""
    factors = ((key, fleet_factor(ratios)) for key, ratios in sorted(base_ratios().items(), key=_order))
    return tuple((k.gpu, k.backend, k.link, round(f, 4)) for k, f in factors if f != 1.0)


def _order(item: tuple[FleetKey, list[float]]) -> tuple[str, str, str]:
    key = item[0]
    return key.gpu, key.backend, key.link


@dataclass(frozen=True)
class CalibrationRow:
    key: FleetKey
    samples: int
    factor: float
    median_ratio: float
    published_within_1_5: float  # share of deployments the published calibration predicted within 1.5x
    published_within_2: float
    fleet_within_1_5: float  # the same with the fleet factor, each deployment left out of its own factor
    fleet_within_2: float

    @property
    def in_use(self) -> bool:
        return self.samples >= MIN_SAMPLES


def leave_one_out(ratios: list[float]) -> list[float]:
    """Each ratio divided by the factor the other ratios give: the fleet calibration's honest error."""
    return [r / fleet_factor(ratios[:i] + ratios[i + 1 :]) for i, r in enumerate(ratios)]


def calibration_rows() -> list[CalibrationRow]:
    rows = []
    for key, ratios in sorted(base_ratios().items(), key=_order):
        corrected = leave_one_out(ratios)
        rows.append(
            CalibrationRow(
                key,
                len(ratios),
                fleet_factor(ratios),
                statistics.median(ratios),
                within(ratios, 1.5),
                within(ratios, 2.0),
                within(corrected, 1.5),
                within(corrected, 2.0),
            )
        )
    return rows


def markdown_report(rows: list[CalibrationRow], when: str) -> str:
    head = (
        f"Fleet calibration as of {when}: decode measured/predicted per GPU model x backend x TP link class. "
        f"A key needs {MIN_SAMPLES} measured deployments before its factor moves off 1; the published "
        f"calibration counts as {PRIOR_SAMPLES:g} more samples at ratio 1 (shrinkage), and a factor stays in "
        "[0.25, 4]. Accuracy: share of deployments within 1.5x / 2x, published calibration against fleet "
        "calibration (leave-one-out).\n\n"
    )
    if not rows:
        return head + "No deployment has been measured yet.\n"
    table = [
        "| GPU / backend / TP link | deployments | factor in use | median ratio | published 1.5x / 2x "
        "| fleet 1.5x / 2x |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        factor = f"{r.factor:.2f}" if r.in_use else f"1 (needs {MIN_SAMPLES})"
        table.append(
            f"| {r.key.text()} | {r.samples} | {factor} | {r.median_ratio:.2f} | "
            f"{r.published_within_1_5:.0%} / {r.published_within_2:.0%} | "
            f"{r.fleet_within_1_5:.0%} / {r.fleet_within_2:.0%} |"
        )
    return head + "\n".join(table) + "\n"

"""Calibration: published measurements that fix the planner's constants, and the fleet's own measurements
that correct its decode predictions per GPU model x backend x TP link class.

Published: `parse_llama_bench` reads llama-bench result tables, `fit_decode_constants` fits a bandwidth
efficiency and a per-layer cost to decode times. Fleet: `fleet_factor` shrinks the measured/predicted
ratios of one key toward 1 (the published calibration) and refuses to move it at all below a minimum
number of samples, so a handful of odd deployments cannot run the planner away.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from placement.errors import PlacementError
from placement.layout import Layout

# ---------------------------------------------------------------- published: llama-bench tables

BENCH_ROW = re.compile(
    r"^\|\s*(?P<model>[\w.\-]+ [\w.]+) (?P<quant>.+?)\s*\|\s*(?P<size>[\d.]+) GiB\s*\|\s*(?P<params>[\d.]+) B\s*\|"
    r"(?:[^|]*\|)*?\s*(?P<test>(?:tg|pp) ?\d+)\s*\|\s*(?P<tok_s>[\d.]+) ±"
)
# llama-bench's model column prints the file type as llama.cpp names it; the planner's dtype names
BENCH_QUANTS = {
    "Q4_K - Medium": "Q4_K_M",
    "Q4_K - Small": "Q4_K_S",
    "Q5_K - Medium": "Q5_K_M",
    "Q6_K": "Q6_K",
    "Q8_0": "Q8_0",
    "Q4_0": "Q4_0",
    "F16": "F16",
    "BF16": "BF16",
}


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench result line: `llama 8B Q4_K - Medium | 4.58 GiB | 8.03 B | ... | tg 512 | 115.42 ± 0.41`."""

    model: str  # llama-bench's architecture and size, e.g. "llama 8B"
    quant: str  # the planner's dtype name, e.g. "Q4_K_M"
    size_gib: float
    params_b: float
    test: str  # "tg" (generation) or "pp" (prompt processing)
    tokens: int
    tok_s: float


def parse_llama_bench(text: str) -> list[BenchRow]:
    """Every result line of llama-bench's markdown table; lines of any other kind are skipped."""
    rows = []
    for line in text.splitlines():
        match = BENCH_ROW.match(line.strip())
        if not match:
            continue
        quant = BENCH_QUANTS.get(match["quant"])
        if quant is None:
            raise PlacementError(
                f"llama-bench line with an unknown file type '{match['quant']}': {line.strip()}"
            )
        test = match["test"].replace(" ", "")
        rows.append(
            BenchRow(
                match["model"],
                quant,
                float(match["size"]),
                float(match["params"]),
                test[:2],
                int(test[2:]),
                float(match["tok_s"]),
            )
        )
    return rows


@dataclass(frozen=True)
class DecodeSample:
    """One measured decode step split into the parts the fit moves and the parts it does not."""

    full_bandwidth_ms: float  # weights + KV read at 100 % of peak bandwidth
    fixed_ms: float  # step overhead and hand-offs (the planner's stated assumptions)
    layers: int
    observed_ms: float

    def predicted_ms(self, efficiency: float, layer_ms: float) -> float:
        return self.full_bandwidth_ms / efficiency + self.fixed_ms + layer_ms * self.layers


def _loss(samples: list[DecodeSample], efficiency: float, layer_ms: float) -> float:
    return sum(math.log(s.predicted_ms(efficiency, layer_ms) / s.observed_ms) ** 2 for s in samples)


def _best_efficiency(samples: list[DecodeSample], layer_ms: float) -> tuple[float, float]:
    grid = [0.30 + i * 0.005 for i in range(200)]
    return min((_loss(samples, e, layer_ms), e) for e in grid)


def fit_decode_constants(groups: Mapping[str, list[DecodeSample]]) -> tuple[dict[str, float], float]:
    """One bandwidth efficiency per group and one per-layer cost shared by all groups, minimizing the
    squared log error of the decode time (grid search: 0.005 in efficiency, 0.0025 ms per layer)."""
    if not any(groups.values()):
        raise PlacementError("no decode samples to fit")
    best: tuple[float, float, dict[str, float]] | None = None
    for step in range(121):
        layer_ms = step * 0.0025
        fits = {name: _best_efficiency(samples, layer_ms) for name, samples in groups.items() if samples}
        total = sum(loss for loss, _ in fits.values())
        if best is None or total < best[0]:
            best = (total, layer_ms, {name: eff for name, (_, eff) in fits.items()})
    assert best is not None
    return best[2], best[1]


# ---------------------------------------------------------------- fleet: measured against predicted

MIN_SAMPLES = 3  # below this many measured deployments a key keeps the published calibration
PRIOR_SAMPLES = 4.0  # the published calibration counts as this many samples at ratio 1
FACTOR_LIMITS = (0.25, 4.0)  # a learned factor never leaves this range


@dataclass(frozen=True)
class FleetKey:
    """What a measured ratio is kept per: GPU table row, backend, link class inside the TP group."""

    gpu: str
    backend: str
    link: str  # "none" without TP, else the link kind (nvlink, p2p, staged, cross_socket ...)

    def text(self) -> str:
        return f"{self.gpu} / {self.backend} / TP over {self.link}"


def fleet_key(layout: Layout, backend: str) -> FleetKey:
    """The key a plan's decode prediction is calibrated under: its first GPU's table row, the backend, and
    the worst link inside its TP groups ("none" without TP)."""
    links = [link for link in layout.tp_links if link is not None]
    if layout.tp == 1:
        link = "none"
    else:
        link = max(links, key=lambda k: k.quality).kind if len(links) == layout.pp else "unknown"
    return FleetKey(layout.gpus[0].model, backend, link)


def factor_for(key: FleetKey, factors: Iterable[tuple[str, str, str, float]]) -> float:
    return next(
        (f for gpu, backend, link, f in factors if (gpu, backend, link) == (key.gpu, key.backend, key.link)),
        1.0,
    )


def fleet_factor(ratios: Iterable[float]) -> float:
    """Measured/predicted decode ratios of one key -> the factor the planner multiplies its prediction by.

    The geometric mean, shrunk toward 1 as if PRIOR_SAMPLES more samples sat at ratio 1, clamped to
    FACTOR_LIMITS; 1 below MIN_SAMPLES. Non-positive or non-finite ratios are ignored."""
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    if len(logs) < MIN_SAMPLES:
        return 1.0
    factor = math.exp(sum(logs) / (len(logs) + PRIOR_SAMPLES))
    low, high = FACTOR_LIMITS
    return min(high, max(low, factor))


def within(ratios: Iterable[float], bound: float) -> float:
    """Share of ratios within a factor `bound` either way (0 when there are none)."""
    values = [r for r in ratios if r > 0]
    if not values:
        return 0.0
    return sum(1 for r in values if 1 / bound <= r <= bound) / len(values)

"""The fleet calibration's arithmetic: shrinkage toward the published calibration, a minimum sample count,
clamping, and how a plan applies a factor to its own key only."""

from __future__ import annotations

import math

import pytest

from placement import PlacementError, Request, load_cluster, load_model, plan
from placement.calibration import FACTOR_LIMITS, MIN_SAMPLES, PRIOR_SAMPLES, fleet_factor, within


def test_it_keeps_the_published_calibration_below_the_minimum_sample_count() -> None:
    assert fleet_factor([0.5] * (MIN_SAMPLES - 1)) == 1.0


def test_it_shrinks_toward_one_and_approaches_the_measured_ratio_with_more_samples() -> None:
    few, many = fleet_factor([0.5] * MIN_SAMPLES), fleet_factor([0.5] * 200)
    assert few == pytest.approx(0.5 ** (MIN_SAMPLES / (MIN_SAMPLES + PRIOR_SAMPLES)))
    assert 0.5 < many < few < 1.0 and many == pytest.approx(0.5, rel=0.02)


def test_it_cannot_run_away_on_wild_ratios() -> None:
    assert fleet_factor([1e-6] * 1000) == FACTOR_LIMITS[0]
    assert fleet_factor([1e6] * 1000) == FACTOR_LIMITS[1]
    assert fleet_factor([0.0, -1.0, math.nan, math.inf, 2.0]) == 1.0  # one usable sample


def test_it_counts_the_share_within_a_bound() -> None:
    assert within([1.0, 1.4, 0.6, 2.5], 1.5) == 0.5 and within([], 2) == 0.0


def one_4090() -> object:
    gpus = [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_total_mib": 24564}]
    return load_cluster({"nodes": [{"name": "box", "gpus": gpus}]})


def test_it_applies_a_factor_to_its_own_key_only() -> None:
    model, cluster = load_model("Llama-3.1-8B-Instruct"), one_4090()
    base = plan(model, cluster, Request(backend="vllm", max_model_len=4096)).plans[0].perf
    mine = (("RTX 4090", "vllm", "none", 0.8),)
    other = (("RTX 4090", "sglang", "none", 0.8), ("RTX 3090", "vllm", "none", 0.8))
    scaled = (
        plan(model, cluster, Request(backend="vllm", max_model_len=4096, decode_factors=mine)).plans[0].perf
    )
    untouched = (
        plan(model, cluster, Request(backend="vllm", max_model_len=4096, decode_factors=other)).plans[0].perf
    )
    assert scaled.single_stream_tok_s == pytest.approx(base.single_stream_tok_s * 0.8)
    assert scaled.to_json()["calibration"] == {
        "gpu": "RTX 4090",
        "backend": "vllm",
        "link": "none",
        "fleet_factor": 0.8,
    }
    assert untouched.single_stream_tok_s == base.single_stream_tok_s


def test_it_refuses_a_factor_outside_the_limits() -> None:
    bad = Request(backend="vllm", decode_factors=(("RTX 4090", "vllm", "none", 9.0),))
    with pytest.raises(PlacementError, match=r"fleet decode factor must lie in \[0.25, 4\], got \[9.0\]"):
        plan(load_model("Llama-3.1-8B-Instruct"), one_4090(), bad)

"""The vLLM memory constants against the public logs they come from (issue #14, item 1.6): non-torch memory
grows once there is more than one rank, and vLLM budgets from the total CUDA reports, not NVML's."""

from __future__ import annotations

import pytest

from agents.startup import read_startup
from placement import PlacementError, Request, load_cluster, load_model, plan
from placement.memory import (
    CUDA_RESERVED_GIB,
    NON_TORCH_GIB,
    TP_NON_TORCH_GIB,
    VLLM_NON_TORCH,
    non_torch_band,
)
from tests.fixtures import fixture_files, read_fixture

H100_NVML_MIB = 81559  # nvidia-smi's total for an H100 80GB HBM3 (vllm#55169)


def profile_runs() -> list[str]:
    _, body = read_fixture(fixture_files("placement", "vllm_memory_profile_pr10511.txt")[0])
    return [run for run in body.split("$ vllm serve") if run.strip()]


def test_it_derives_the_cuda_total_from_nvml_as_vllm_reports_it() -> None:
    tp1 = read_startup(profile_runs()[0].splitlines())
    assert tp1.cuda_total_gib == 79.22
    assert H100_NVML_MIB / 1024 - tp1.cuda_total_gib == pytest.approx(CUDA_RESERVED_GIB, abs=0.01)


def test_it_adds_the_non_torch_memory_a_second_rank_brings() -> None:
    tp1, tp2 = (read_startup(run.splitlines()) for run in profile_runs())
    assert tp1.weights_gib == 14.96 and tp2.weights_gib == 7.48
    assert (tp2.non_torch_gib or 0) - (tp1.non_torch_gib or 0) == pytest.approx(TP_NON_TORCH_GIB)


def test_it_budgets_a_tp2_rank_from_the_cuda_total_with_the_tp_non_torch_memory() -> None:
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": H100_NVML_MIB} for i in range(2)
    ]
    cluster = load_cluster({"nodes": [{"name": "n", "gpus": gpus}]})
    result = plan(
        load_model("Llama-3.1-8B-Instruct"), cluster, Request(backend="vllm", tp=2, max_model_len=8192)
    )
    breakdown = result.plans[0].memory.gpus[0]
    assert breakdown.parts["non_torch"] == pytest.approx(NON_TORCH_GIB + TP_NON_TORCH_GIB)
    assert breakdown.budget_gib == pytest.approx((H100_NVML_MIB / 1024 - CUDA_RESERVED_GIB) * 0.9)


def non_torch_lines(name: str) -> list[float]:
    """Every rank's non_torch_memory figure in a fixture's verbatim profiling lines."""
    _, body = read_fixture(fixture_files("placement", name)[0])
    return [read_startup([line]).non_torch_gib for line in body.splitlines() if "non_torch_memory" in line]


def test_it_takes_each_vllm_releases_non_torch_memory_from_its_public_logs() -> None:
    """Issue #14 item 1.6, per version: 0.6.5's profiler counts 1.79 GiB at TP1 and 3.58 GiB at TP2 (PR #10511),
    0.7's counts 0.16 GiB at TP1 (PR #12126) and 0.20 GiB per rank at TP16 (PR #14447, V0 of 0.8.3rc2)."""
    dec_2024, jan_2025 = VLLM_NON_TORCH
    tp1, tp2 = (read_startup(run.splitlines()).non_torch_gib for run in profile_runs())
    assert (dec_2024.tp1_gib, dec_2024.tp_many_gib) == (tp1, tp2) == (1.79, 3.58)
    assert non_torch_lines("vllm_memory_profile_pr12126.txt") == [jan_2025.tp1_gib]
    assert set(non_torch_lines("vllm_memory_profile_pr14447.txt")) == {jan_2025.tp_many_gib}
    assert [
        non_torch_band(v) for v in ("0.6.4", "0.6.5", "v0.6.6.post1", "0.7.3", "0.8.3rc2.dev224", None)
    ] == [
        None,
        dec_2024,
        dec_2024,
        jan_2025,
        None,
        None,
    ]


@pytest.mark.parametrize(
    ("version", "tp", "non_torch"),
    [
        (None, 2, NON_TORCH_GIB + TP_NON_TORCH_GIB),
        ("0.11.0", 2, NON_TORCH_GIB + TP_NON_TORCH_GIB),  # V1: no public figure, the pessimistic default
        ("0.6.6", 2, 3.58),
        ("0.7.3", 2, 0.20),
        ("0.7.3", 1, 0.16),
    ],
)
def test_it_budgets_the_non_torch_memory_of_the_requested_vllm_release(version, tp, non_torch) -> None:
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": H100_NVML_MIB} for i in range(2)
    ]
    cluster = load_cluster({"nodes": [{"name": "n", "gpus": gpus}]})
    request = Request(backend="vllm", tp=tp, max_model_len=8192, backend_version=version)
    best = plan(load_model("Llama-3.1-8B-Instruct"), cluster, request).plans[0]
    gpu = best.memory.gpus[0]
    assert gpu.parts["non_torch"] == pytest.approx(non_torch)
    assert sum(v for k, v in gpu.parts.items() if k != "cuda_graphs") == pytest.approx(
        gpu.budget_gib, abs=0.01
    )


def test_it_names_a_malformed_backend_version() -> None:
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": H100_NVML_MIB}
    cluster = load_cluster({"nodes": [{"name": "n", "gpus": [gpu]}]})
    with pytest.raises(PlacementError, match="backend version must look like 0.8.3, got 'latest'"):
        plan(load_model("Llama-3.1-8B-Instruct"), cluster, Request(backend_version="latest"))

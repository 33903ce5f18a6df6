"""The vLLM memory constants against the public logs they come from (issue #14, item 1.6): non-torch memory
grows once there is more than one rank, and vLLM budgets from the total CUDA reports, not NVML's."""

from __future__ import annotations

import pytest

from agents.startup import read_startup
from placement import Request, load_cluster, load_model, plan
from placement.memory import CUDA_RESERVED_GIB, NON_TORCH_GIB, TP_NON_TORCH_GIB
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

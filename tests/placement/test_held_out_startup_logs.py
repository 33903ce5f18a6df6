"""Held-out vLLM startup logs of catalog models (issue #14, items 1.6 and 1.7): the planner's weights and KV tokens
against what the server printed, read with the agents' own startup parser. Never fitted on; the bounds are the
accuracy docs/placement.md reports, so a drift past them fails here. Run with -s for the table."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agents.startup import read_startup
from placement import Request, load_cluster, load_model, plan
from tests.fixtures import fixture_files, read_fixture


@dataclass(frozen=True)
class StartupRow:
    fixture: str
    model: str
    gpu: str
    nvml_mib: int
    request: Request


ROWS = [
    StartupRow(
        "vllm_startup_r1_distill_qwen_1p5b_4090d.txt",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        "NVIDIA GeForce RTX 4090",  # a 4090D: same 24 GB (NVML 24,564 MiB); memory does not depend on its speed
        24564,
        Request(backend="vllm", gpu_memory_utilization=0.9, max_model_len=131072, backend_version="0.8.3"),
    ),
]


def predicted_memory(row: StartupRow) -> tuple[float, int]:
    node = {"name": "n", "gpus": [{"index": 0, "name": row.gpu, "memory_total_mib": row.nvml_mib}]}
    result = plan(load_model(row.model), load_cluster({"nodes": [node]}), row.request)
    assert result.plans, [p.message for c in result.rejected for p in c.problems]
    gpu = result.plans[0].memory.gpus[0]
    return gpu.parts["weights"], gpu.kv_tokens


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.fixture)
def test_it_predicts_the_weights_and_kv_tokens_of_held_out_startup_logs(row: StartupRow) -> None:
    header, body = read_fixture(fixture_files("placement", row.fixture)[0])
    assert header["use"].startswith("holdout")
    logged = read_startup(body.splitlines())
    assert logged.weights_gib is not None and logged.kv_tokens is not None
    weights, kv_tokens = predicted_memory(row)
    print(
        f"\n{row.model}: weights {weights:.3f} GiB (log {logged.weights_gib}), "
        f"KV {kv_tokens:,} tokens (log {logged.kv_tokens:,}, {kv_tokens / logged.kv_tokens - 1:+.1%})"
    )
    assert weights == pytest.approx(logged.weights_gib, rel=0.02)
    # vLLM 0.8.3's V1 profiler left 6.5 GiB of the 21.2 GiB budget outside weights and KV on this run (other
    # processes on the GPU count there too); the planner assumes 0.75 GiB, so it over-predicts by half.
    assert 0.5 < kv_tokens / logged.kv_tokens < 2.0

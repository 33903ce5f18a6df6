"""Issue #14 items 1.3-1.5, each on public data: TP across nodes whose network is unknown, Gemma-2's
alternating attention and tied embeddings, and fp32 checkpoints that vLLM/SGLang load in 16-bit."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from placement import Request, load_cluster, load_model, plan
from placement.result import links_text
from placement.spec import spec_from_hf_config
from tests.fixtures import FIXTURES, read_fixture

A100_TOPO = FIXTURES / "topo" / "004_distserve3-8xa100sxm-nv12-4nic.txt"
GEMMA2 = FIXTURES / "configs" / "gemma-2-9b-it.txt"
FLOAT32_COMMIT = FIXTURES / "configs" / "nb-llama-3.1-70B-float32-commit.txt"


def a100_node(name: str, gpus: int, topology: str | None = None, **extra: object) -> dict:
    gpu_name = read_fixture(A100_TOPO)[0]["gpus"].split(" x ")[1]  # "NVIDIA A100-SXM4-80GB"
    node = {
        "name": name,
        "gpus": [{"index": i, "name": gpu_name, "memory_total_mib": 81920} for i in range(gpus)],
        **extra,
    }
    return {**node, "topology": topology} if topology else node


def hf_config(path: Path) -> dict:
    return json.loads(read_fixture(path)[1])


# ---------------------------------------------------------------- 1.3 TP across nodes, unknown network


def test_it_rejects_tp_across_two_single_gpu_nodes_that_give_no_network() -> None:
    cluster = load_cluster({"nodes": [a100_node("a", 1), a100_node("b", 1)]})
    result = plan(load_model("Llama-3.1-8B-Instruct"), cluster, Request(backend="vllm", tp=2))
    assert result.plans == []
    [rejected] = result.rejected
    assert [(p.code, "no network_gbps" in p.message) for p in rejected.problems] == [("network", True)]
    assert "no TP" not in links_text(rejected)
    assert "unknown network between nodes" in links_text(rejected)


def test_it_rejects_tp16_over_two_public_8xa100_nodes_without_network_and_still_plans_inside_one() -> None:
    topology = read_fixture(A100_TOPO)[1]
    nodes = [a100_node(name, 8, topology) for name in ("x", "y")]
    model = load_model("Llama-3.1-70B-Instruct")
    spanning = plan(model, load_cluster({"nodes": nodes}), Request(backend="vllm", tp=16))
    assert spanning.plans == []
    assert all(any(p.code == "network" for p in c.problems) for c in spanning.rejected)
    inside = plan(model, load_cluster({"nodes": nodes}), Request(backend="vllm", tp=8))
    assert inside.best is not None and not inside.best.layout.multi_node
    assert "NV12" in links_text(inside.best)


def test_it_still_plans_tp_inside_nodes_and_pp_across_a_described_network() -> None:
    nodes = [a100_node(name, 1, network_gbps=200, rdma=True) for name in ("a", "b")]
    result = plan(
        load_model("Llama-3.1-70B-Instruct"), load_cluster({"nodes": nodes}), Request(backend="vllm")
    )
    assert result.best is not None and result.best.layout.pp == 2 and result.best.layout.tp == 1
    assert "pipeline hand-offs over NET 200 Gb/s RDMA" in links_text(result.best)


# ---------------------------------------------------------------- 1.4 Gemma-2 from its public config.json


def test_it_reads_gemma2_as_alternating_local_and_global_layers_with_tied_embeddings() -> None:
    spec = spec_from_hf_config(hf_config(GEMMA2), "gemma-2-9b-it", "gemma-2-9b-it", str(GEMMA2))
    assert (spec.full_attention_layers, spec.sliding_layers, spec.sliding_window) == (21, 21, 4096)
    assert spec.tie_word_embeddings and spec.lm_head_params == 0
    assert spec.total_params / 1e9 == pytest.approx(9.24, abs=0.01)  # the model card's 9.24B


def test_it_plans_gemma2_with_kv_for_the_global_layers() -> None:
    spec = spec_from_hf_config(hf_config(GEMMA2), "gemma-2-9b-it", "google/gemma-2-9b-it", str(GEMMA2))
    cluster = load_cluster({"nodes": [a100_node("a", 1)]})
    result = plan(spec, cluster, Request(backend="vllm", max_model_len=8192))
    assert result.best is not None, [p.message for c in result.rejected for p in c.problems]
    assert result.best.memory.kv_tokens > 8192
    per_token = 2 * 21 * 8 * 256 * 2  # K+V, 21 global layers, 8 KV heads of 256, 16-bit
    assert result.best.memory.kv_tokens < result.best.memory.gpus[0].parts["kv_cache"] * 2**30 / per_token


def test_it_follows_an_explicit_layer_types_or_tie_over_the_architecture_default() -> None:
    config = {**hf_config(GEMMA2), "tie_word_embeddings": False, "layer_types": ["full_attention"] * 42}
    spec = spec_from_hf_config(config, "g", "g", "edited copy")
    assert (spec.full_attention_layers, spec.tie_word_embeddings) == (42, False)


# ---------------------------------------------------------------- 1.5 float32 checkpoints


def float32_llama() -> object:
    """Llama-3.1-70B with the torch_dtype the public fine-tune shipped (the commit's removed line)."""
    removed = re.search(r'^- "torch_dtype": "(\w+)"', read_fixture(FLOAT32_COMMIT)[1], re.MULTILINE)
    assert removed is not None and removed.group(1) == "float32"
    base = load_model("Llama-3.1-70B-Instruct")
    return replace(base, native_format={"float32": "fp32"}[removed.group(1)])


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_it_plans_a_float32_checkpoint_in_16_bit_for_dtype_auto_servers(backend: str) -> None:
    nodes = [a100_node("a", 8, read_fixture(A100_TOPO)[1])]
    cluster = load_cluster({"nodes": nodes})
    fp32 = plan(float32_llama(), cluster, Request(backend=backend))
    bf16 = plan(load_model("Llama-3.1-70B-Instruct"), cluster, Request(backend=backend))
    assert fp32.best is not None and fp32.best.settings.fmt.bits == 16
    assert fp32.best.memory.weights_gib_max == pytest.approx(bf16.best.memory.weights_gib_max)


def test_it_keeps_float32_for_llama_cpp_and_when_asked() -> None:
    cluster = load_cluster({"nodes": [a100_node("a", 8, read_fixture(A100_TOPO)[1])]})
    gguf = plan(float32_llama(), cluster, Request(backend="llama.cpp"))
    assert {c.settings.fmt.name for c in [*gguf.plans, *gguf.rejected]} == {"F32"}
    asked = plan(float32_llama(), cluster, Request(backend="vllm", dtype="float32"))
    assert all(c.settings.fmt.bits == 32 for c in [*asked.plans, *asked.rejected])

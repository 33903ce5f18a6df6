"""Memory per GPU against measured vLLM logs, plus replication, divisibility and layer-split edge cases."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from placement import PlacementError, Request, check_command, load_cluster, load_model, plan
from placement.evaluate import Candidate
from placement.layout import even_layers
from placement.memory import kv_bytes_per_token
from placement.memory_gguf import kv_bytes_per_layer
from placement.request import resolve
from tests.fixtures import fixture_files

DATA = Path(__file__).parents[1] / "data" / "placement"
# Models of the observation rows that are not in the catalog, with a config.json written from the
# model's published config (Qwen/Qwen3-8B: 36 layers, 4096 hidden, 32/8 heads, head_dim 128).
LOCAL_CONFIGS = {"Qwen/Qwen3-8B": DATA / "qwen3-8b"}
# Rows whose vLLM run did not use chunked prefill (V0 logs): the profiling pass ran max_model_len tokens.
V0_ROWS = {("meta-llama/Llama-3.1-8B-Instruct", "20000"), ("meta-llama/Llama-3.1-8B-Instruct", "29000")}
# Rows that cannot be checked, and why: no config for the model anywhere in the repo or the catalog.
UNUSABLE = {
    "Qwen3.6-27B AutoRound INT4 (hybrid: 16 of 64 layers full attention)": "hybrid DeltaNet model without a published config here; gpu_memory_utilization not in the excerpt",
    "Qwen3.6-27B (club-3090 multi4 recipe, AutoRound INT4 per section)": "same model, no config; MTP drafter weights and gpu_memory_utilization unknown",
}


def memory_rows() -> list[dict[str, str]]:
    path = fixture_files("placement", "memory_observations.csv")[0]
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def one_node(gpu: str, count: int, gib: float, label: str | None = None) -> Any:
    node: dict[str, Any] = {
        "name": "n",
        "gpus": [{"index": i, "name": gpu, "memory_total_mib": gib * 1024} for i in range(count)],
    }
    if label:
        links = [
            {"a": f"GPU{a}", "b": f"GPU{b}", "link": label} for a in range(count) for b in range(a + 1, count)
        ]
        node["topology"] = {"kind": "matrix", "gpus": [], "nics": [], "links": links}
    return load_cluster({"nodes": [node]})


# What NVML (and so the agent) reports as the total, for the GPUs of the rows: the logs print the smaller total CUDA
# reports (RTX 3090: 23.58 GiB), which the planner derives from this one (memory.CUDA_RESERVED_GIB).
NVML_TOTAL_MIB = {"RTX 3090": 24576, "H100": 81559}


def nvml_total_gib(row: dict[str, str]) -> float:
    return next(mib for gpu, mib in NVML_TOTAL_MIB.items() if row["gpu"].startswith(gpu)) / 1024


def evaluate_row(row: dict[str, str]) -> Candidate:
    ref = str(LOCAL_CONFIGS.get(row["model"], row["model"]))
    tp = int(row["tp"])
    v0 = (row["model"], row["max_model_len"]) in V0_ROWS
    request = Request(
        backend="vllm",
        tp=tp,
        pp=int(row["pp"]),
        max_model_len=int(row["max_model_len"]),
        gpu_memory_utilization=float(row["gpu_memory_utilization"] or 0.9),
        max_num_batched_tokens=int(row["max_model_len"]) if v0 else None,
    )
    gpu = "NVIDIA " + row["gpu"].split(" (")[0]
    result = plan(load_model(ref), one_node(gpu, tp, nvml_total_gib(row)), request)
    return (result.plans + result.rejected)[0]


def test_it_reports_which_memory_rows_it_cannot_check() -> None:
    skipped = {row["model"] for row in memory_rows() if row["model"] in UNUSABLE}
    assert skipped == set(UNUSABLE)
    assert len(memory_rows()) - len(skipped) == 4


@pytest.mark.parametrize(
    "row",
    [r for r in memory_rows() if r["model"] not in UNUSABLE],
    ids=lambda r: f"{r['model']}-tp{r['tp']}-{r['max_model_len']}",
)
def test_it_predicts_vllm_weights_and_kv_tokens_of_measured_runs(row: dict[str, str]) -> None:
    candidate = evaluate_row(row)
    memory = candidate.memory
    assert memory is not None
    if row["weights_gib_per_gpu"]:
        assert memory.weights_gib_max == pytest.approx(float(row["weights_gib_per_gpu"]), rel=0.05)
    if row["kv_cache_tokens"]:
        assert memory.kv_tokens == pytest.approx(int(row["kv_cache_tokens"]), rel=0.25)
    print(
        f"\n{row['model']} tp={row['tp']} len={row['max_model_len']}: weights {memory.weights_gib_max:.3f} GiB "
        f"(log {row['weights_gib_per_gpu'] or '-'}), KV {memory.kv_tokens} tokens (log {row['kv_cache_tokens']}, "
        f"{memory.kv_tokens / int(row['kv_cache_tokens']) - 1:+.1%})"
    )


def test_it_predicts_the_startup_failure_the_log_shows() -> None:
    row = next(r for r in memory_rows() if r["max_model_len"] == "29000")
    candidate = evaluate_row(row)
    assert [p.code for p in candidate.problems] == ["context"]
    assert "29,000" in candidate.problems[0].message


def test_it_stops_shrinking_kv_per_gpu_once_tp_exceeds_the_kv_heads() -> None:
    model = load_model("Qwen3-30B-A3B")  # 4 KV heads
    cluster = one_node("NVIDIA H100 80GB HBM3", 8, 80, "NV18")
    per_gpu = {}
    for tp in (2, 4, 8):
        result = plan(model, cluster, Request(backend="vllm", tp=tp, pp=1, max_model_len=8192))
        c = result.plans[0]
        per_gpu[tp] = kv_bytes_per_token(model, c.layout, 0, 2.0)
    assert per_gpu[2] == 2 * per_gpu[4]
    assert per_gpu[8] == per_gpu[4]  # 4 heads over 8 ranks: one replicated head per rank


def test_it_replicates_kv_projection_weights_past_the_kv_heads() -> None:
    model = load_model("Qwen3-30B-A3B")
    cluster = one_node("NVIDIA H100 80GB HBM3", 8, 80, "NV18")
    c4, c8 = (plan(model, cluster, Request(backend="vllm", tp=tp, pp=1)).plans[0] for tp in (4, 8))
    w4, w8 = c4.memory.weights_gib_max, c8.memory.weights_gib_max
    assert w8 > w4 / 2  # k/v projections stop splitting at TP=4
    assert w8 == pytest.approx(w4 / 2, rel=0.02)  # but they are a small part of the weights


@pytest.mark.parametrize(
    ("model", "tp", "needle"),
    [
        ("DeepSeek-R1-Distill-Qwen-32B", 3, "40 attention heads"),
        ("Qwen2.5-7B-Instruct", 7, "4 KV heads"),
        ("Qwen2.5-7B-Instruct", 8, "28 attention heads"),
        ("Qwen3-32B", 6, "vocabulary of 151,936"),
    ],
)
def test_it_rejects_tp_sizes_that_do_not_divide(model: str, tp: int, needle: str) -> None:
    cluster = one_node("NVIDIA H100 80GB HBM3", 8, 80, "NV18")
    result = plan(load_model(model), cluster, Request(backend="vllm", tp=tp, pp=1))
    assert not result.plans
    messages = [p.message for c in result.rejected for p in c.problems if p.code == "divisibility"]
    assert any(needle in m for m in messages), messages


def test_it_accepts_tp_that_divides_forty_heads() -> None:
    cluster = one_node("NVIDIA H100 80GB HBM3", 8, 80, "NV18")
    result = plan(load_model("DeepSeek-R1-Distill-Qwen-32B"), cluster, Request(backend="vllm", tp=8, pp=1))
    assert result.plans and result.plans[0].layout.tp == 8


def _vl_config(tmp_path: Path) -> str:
    config = {
        "architectures": ["TinyVL"],
        "hidden_size": 4096,
        "num_hidden_layers": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 8192,
        "vocab_size": 32768,
        "max_position_embeddings": 32768,
        "vision_config": {"num_heads": 12, "hidden_size": 768, "depth": 4, "intermediate_size": 3072},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_it_replicates_a_vision_tower_whose_heads_tp_does_not_divide(tmp_path: Path) -> None:
    model = load_model(_vl_config(tmp_path))
    cluster = one_node("NVIDIA H100 80GB HBM3", 8, 80, "NV18")
    result = plan(model, cluster, Request(backend="vllm", tp=8, pp=1))
    best = result.to_json(limit=1)["plans"][0]
    assert "--mm-encoder-tp-mode data" in best["command"]
    check = check_command(["vllm", "serve", _vl_config(tmp_path), "--tensor-parallel-size", "8"], cluster)
    assert [p.code for p in check.problems] == ["divisibility"]
    assert (
        "12 heads" in check.problems[0].message and "--mm-encoder-tp-mode data" in check.problems[0].message
    )


def test_it_refuses_more_pipeline_stages_than_layers(tmp_path: Path) -> None:
    config = {
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = plan(
        load_model(str(tmp_path)), one_node("NVIDIA A30", 4, 24), Request(backend="vllm", tp=1, pp=4)
    )
    assert any("PP=4 exceeds the model's 2 layers" in p.message for c in result.rejected for p in c.problems)


def test_it_needs_whole_quantization_groups_per_tp_shard() -> None:
    # Qwen2.5-72B: MLP 29568 wide; TP=8 gives 3696 = 28.9 groups of 128, which AWQ cannot split.
    result = plan(
        load_model("Qwen2.5-72B-Instruct"),
        one_node("NVIDIA H100 80GB HBM3", 8, 80, "NV18"),
        Request(backend="vllm", tp=8, pp=1, dtype="awq"),
    )
    assert any("awq groups of 128" in p.message for c in result.rejected for p in c.problems)


def test_it_splits_vllm_layers_like_get_pp_indices() -> None:
    assert even_layers(64, 3) == [21, 22, 21]  # remainder from the second-to-last stage backwards
    assert even_layers(80, 3) == [27, 27, 26]
    assert even_layers(36, 4) == [9, 9, 9, 9]


def test_it_places_llama_cpp_layers_kv_output_and_projector_per_gpu() -> None:
    model = load_model("Qwen3-VL-32B-Instruct")
    result = plan(
        model,
        one_node("NVIDIA A30", 4, 24, "SYS"),
        Request(backend="llama.cpp", max_model_len=8192, concurrency=2, gpus=(0, 1, 2, 3)),
    )
    c = result.plans[0]
    gpus = c.memory.gpus
    assert sum(c.layout.layers) == 64
    assert "vision" in gpus[0].parts and "vision" not in gpus[-1].parts
    assert "output_layer" in gpus[-1].parts and "output_layer" not in gpus[0].parts
    assert c.memory.kv_tokens == 8192 * 2  # -c is the total over -np slots
    total_kv = sum(g.parts["kv_cache"] for g in gpus)
    assert total_kv == pytest.approx(8192 * 2 * 262144 / 2**30, rel=1e-6)  # 256 KiB per token, f16
    command = result.to_json(limit=1)["plans"][0]["command"]
    assert f"--tensor-split {','.join(map(str, c.layout.layers))}" in command and "-c 16384 -np 2" in command


def test_it_reserves_ollama_kv_for_every_parallel_slot() -> None:
    result = plan(
        load_model("Qwen3-32B"),
        one_node("NVIDIA H100 80GB HBM3", 1, 80),
        Request(backend="ollama", max_model_len=4096, concurrency=10),
    )
    c = result.plans[0]
    assert c.memory.kv_tokens == 40960
    env = result.to_json(limit=1)["plans"][0]["env"]
    assert env["OLLAMA_NUM_PARALLEL"] == "10" and env["OLLAMA_CONTEXT_LENGTH"] == "4096"


def test_it_caps_sliding_window_kv_in_llama_cpp() -> None:
    model = load_model("gpt-oss-20b")  # 12 full-attention layers, 12 with a 128-token window
    settings = resolve(model, Request(backend="llama.cpp", max_model_len=32768), "llama.cpp")
    per_layer = kv_bytes_per_layer(model, settings)
    full_only = 2 * 8 * 64 * 2 * 32768 * 12 / 24
    window = 2 * 8 * 64 * 2 * (128 + 512) * 12 / 24
    assert per_layer == pytest.approx(full_only + window)


def test_it_keeps_every_expert_resident_but_reads_only_active_ones() -> None:
    model = load_model("Mixtral-8x7B-Instruct-v0.1")
    result = plan(
        model, one_node("NVIDIA H100 80GB HBM3", 2, 80, "NV18"), Request(backend="vllm", tp=2, pp=1)
    )
    c = result.plans[0]
    assert c.memory.weights_gib_max * 2 == pytest.approx(46.7e9 * 2 / 2**30, rel=0.02)
    dense_equivalent = 46.7e9 * 2 / 2 / (3350e9 * 0.62) * 1e3
    assert c.perf.step.stages[0].hbm_ms < dense_equivalent / 2  # top-2 of 8 experts per token


def test_it_replicates_the_single_kv_head_of_an_mqa_model(tmp_path: Path) -> None:
    config = {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 1,
        "intermediate_size": 11008,
        "vocab_size": 65024,
        "max_position_embeddings": 8192,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(str(tmp_path))
    cluster = one_node("NVIDIA H100 80GB HBM3", 4, 80, "NV18")
    per_gpu = {
        tp: kv_bytes_per_token(
            model, plan(model, cluster, Request(backend="vllm", tp=tp, pp=1)).plans[0].layout, 0, 2.0
        )
        for tp in (1, 4)
    }
    assert per_gpu[4] == per_gpu[1] == 2 * 32 * 128 * 2  # every rank keeps the one K/V head


def test_it_rejects_a_pipeline_partition_that_does_not_add_up() -> None:
    with pytest.raises(PlacementError, match="must give 2 stages summing to 64 layers"):
        check_command(
            ["VLLM_PP_LAYER_PARTITION=30,30", "vllm", "serve", "Qwen3-32B", "--pipeline-parallel-size", "2"],
            one_node("NVIDIA A30", 4, 24, "SYS"),
        )

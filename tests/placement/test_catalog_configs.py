"""Issue #14 item 1.7: the bundled public config.json files (placement/data/hf_configs.json) are the fixtures'
copies with their sources, their geometry adds up to each model card's parameter count, and every one of them
plans by its Hugging Face id."""

from __future__ import annotations

import ast
import json

import pytest

from placement import PlacementError, Request, load_cluster, load_model, plan
from placement.spec import catalog_names, hf_catalog, spec_from_hf_config
from tests.fixtures import FIXTURES, fixture_files, read_fixture

CONFIGS = [p for p in fixture_files("configs") if "hf_repo" in read_fixture(p)[0]]
H100_PASTE = read_fixture(FIXTURES / "topo" / "036_penny-8xh100-nv18-13nic-ib-eth-unindented.txt")[1]


def h100_node(name: str) -> dict:
    """8x H100 with the public paste's NV18 topology and its 400 Gb/s InfiniBand."""
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559} for i in range(8)]
    return {"name": name, "gpus": gpus, "topology": H100_PASTE, "network_gbps": 400, "rdma": True}


# "Model size" of each model page on huggingface.co (safetensors metadata) / the model card, billions.
PUBLISHED_B = {
    "DeepSeek-R1-Distill-Qwen-1.5B": 1.78,  # untied embeddings on Qwen2.5-Math-1.5B's geometry
    "DeepSeek-R1-Distill-Qwen-7B": 7.62,
    "DeepSeek-V2-Lite": 15.7,
    "DeepSeek-V3": 671.0,  # the main model; the 14B MTP module on top is for speculative decoding only
    "Llama-3.2-1B-Instruct": 1.24,
    "Llama-3.2-3B-Instruct": 3.21,
    "Mistral-7B-Instruct-v0.3": 7.25,
    "Phi-3.5-mini-instruct": 3.82,
    "Phi-4-mini-instruct": 3.84,
    "Qwen1.5-MoE-A2.7B-Chat": 14.3,
    "Qwen2-1.5B-Instruct": 1.54,
    "Qwen2-7B-Instruct": 7.62,
    "Qwen2.5-3B-Instruct": 3.09,
    "Qwen3-0.6B": 0.6,
    "Qwen3-1.7B": 1.7,
    "Qwen3-8B": 8.2,
    "Qwen3-235B-A22B": 235.0,  # model card: 235B in total, 22B activated
    "gemma-2-27b-it": 27.2,
    "gemma-2-2b-it": 2.61,
    "gemma-2-9b-it": 9.24,
    "gemma-3-1b-it": 1.0,
    "phi-4": 14.7,
}


def fixture_config(body: str) -> dict:
    """A config.json body, or mlc-llm's Python-literal copy of one."""
    text = body[body.index("{") : body.rindex("}") + 1]
    return json.loads(text) if body.lstrip().startswith("{") else ast.literal_eval(text)


def test_it_bundles_exactly_the_public_configs_with_their_sources() -> None:
    assert sorted(hf_catalog()) == sorted(p.stem for p in CONFIGS) == sorted(PUBLISHED_B)
    for path in CONFIGS:
        header, body = read_fixture(path)
        entry = hf_catalog()[path.stem]
        assert entry["config"] == fixture_config(body), path.name
        assert (entry["source"], entry["hf_repo"]) == (header["source"], header["hf_repo"])
        assert header["source"].startswith("https://github.com/")


@pytest.mark.parametrize("key", sorted(PUBLISHED_B))
def test_it_counts_the_parameters_each_model_card_publishes(key: str) -> None:
    spec = load_model(key)
    assert spec.total_params / 1e9 == pytest.approx(PUBLISHED_B[key], rel=0.02)


@pytest.mark.parametrize("key", sorted(PUBLISHED_B))
def test_it_plans_every_bundled_model_by_its_hugging_face_id(key: str) -> None:
    repo = hf_catalog()[key]["hf_repo"]
    cluster = load_cluster({"nodes": [h100_node("a"), h100_node("b")]})
    result = plan(load_model(repo), cluster, Request(max_model_len=8192))
    assert result.best is not None, [p.message for c in result.rejected for p in c.problems]
    assert repo in result.to_json(limit=1)["plans"][0]["command"]


def test_it_finds_the_models_the_issue_could_not_plan_by_id_or_tag() -> None:
    for ref in (
        "Qwen/Qwen2-7B-Instruct",
        "Qwen/Qwen3-8B",
        "google/gemma-2-9b-it",
        "qwen3:8b",
        "gemma-2-9b-it",
    ):
        assert load_model(ref).hf_repo in {"Qwen/Qwen2-7B-Instruct", "Qwen/Qwen3-8B", "google/gemma-2-9b-it"}
    with pytest.raises(PlacementError, match="Qwen3-8B"):
        load_model("no-such-model-7b")
    assert {"Qwen3-8B", "gemma-2-9b-it", "Llama-3.1-70B-Instruct"} <= set(catalog_names())


def test_it_takes_the_published_dtype_where_the_copy_was_re_saved() -> None:
    header, body = read_fixture(FIXTURES / "configs" / "Qwen3-8B.txt")
    assert fixture_config(body)["dtype"] == "float32" and header["override"] == "dtype bfloat16"
    assert load_model("Qwen/Qwen3-8B").native_format == "bf16"


def test_it_caches_one_latent_per_token_and_layer_for_deepseek_mla() -> None:
    """DeepSeek-V2 paper, table 1: MLA caches (d_c + d_h^R) values per token and layer, for all heads."""
    v3 = load_model("deepseek-ai/DeepSeek-V3")
    assert (v3.kv_lora_rank, v3.qk_rope_head_dim, v3.dense_layers, v3.native_format) == (512, 64, 3, "fp8")
    assert v3.kv_elements_per_token() == 61 * (512 + 64)
    assert v3.active_params / 1e9 == pytest.approx(37.5, abs=0.2)  # 36.6B activated + 0.9B embedding
    cluster = load_cluster({"nodes": [h100_node("a"), h100_node("b")]})
    best = plan(v3, cluster, Request(max_model_len=8192)).best
    assert best is not None and best.layout.multi_node  # 627 GiB of FP8 weights need both nodes
    per_gpu = best.memory.gpus[0]
    stage_layers = best.layout.layers[0]
    latent_bytes = stage_layers * (512 + 64) * 2  # whole on every TP rank, 16-bit KV
    assert per_gpu.kv_tokens == pytest.approx(per_gpu.parts["kv_cache"] * 2**30 / latent_bytes, rel=0.02)


def test_it_models_qwen3_moe_experts_per_tp_rank() -> None:
    """Qwen3-235B-A22B at TP8: 128 experts of moe_intermediate_size 1536 in all 94 layers (the dense
    intermediate_size 12288 is unused), 4 KV heads so each of 8 ranks keeps one whole head."""
    spec = load_model("Qwen/Qwen3-235B-A22B")
    assert (spec.num_experts, spec.experts_per_tok, spec.expert_intermediate) == (128, 8, 1536)
    assert spec.active_params / 1e9 == pytest.approx(22.0, rel=0.02)  # model card: 22B activated
    assert spec.kv_elements_per_token() == 2 * 94 * 4 * 128
    cluster = load_cluster({"nodes": [h100_node("a")]})
    best = plan(spec, cluster, Request(max_model_len=8192, backend="vllm", tp=8)).best
    assert best is not None and (best.layout.tp, best.layout.pp) == (8, 1)
    hidden, layers, vocab = 4096, 94, 151936
    q_o, k_v = 2 * hidden * 64 * 128, 2 * hidden * 4 * 128
    experts, router, norms = 128 * 3 * hidden * 1536, hidden * 128, 2 * hidden + 2 * 128
    per_rank = layers * (q_o / 8 + k_v / 4 + experts / 8 + router + norms) + 2 * vocab * hidden / 8 + hidden
    gpu = best.memory.gpus[0]
    assert gpu.parts["weights"] == pytest.approx(per_rank * 2 / 2**30, rel=0.005)
    one_head_bytes = layers * 2 * 1 * 128 * 2  # K and V of one head per layer, 16 bit
    assert gpu.kv_tokens == pytest.approx(gpu.parts["kv_cache"] * 2**30 / one_head_bytes, rel=0.001)


def test_it_reads_chatglm_field_names_as_glm_4_9b_chat_uses_them() -> None:
    """glm-4-9b-chat's config.json (model_type chatglm) says num_layers, ffn_hidden_size, kv_channels,
    multi_query_group_num, padded_vocab_size and seq_length. No verbatim copy of it is in the searchable index,
    so this is a test input with those key names and the geometry its GGUF metadata prints (ollama/ollama#5563:
    block_count 40, embedding_length 4096, feed_forward_length 13696, head_count 32, head_count_kv 2, 151,552
    tokens; llama.cpp#8031: context_length 131072); the model card says 9.4B parameters."""
    chatglm = {
        "architectures": ["ChatGLMModel"],
        "model_type": "chatglm",
        "hidden_size": 4096,
        "num_layers": 40,
        "num_attention_heads": 32,
        "multi_query_attention": True,
        "multi_query_group_num": 2,
        "kv_channels": 128,
        "ffn_hidden_size": 13696,
        "padded_vocab_size": 151552,
        "seq_length": 131072,
        "torch_dtype": "bfloat16",
    }
    spec = spec_from_hf_config(chatglm, "glm-4-9b-chat", "THUDM/glm-4-9b-chat", "test input")
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (40, 2, 128)
    assert (spec.intermediate_size, spec.vocab_size, spec.max_position_embeddings) == (13696, 151552, 131072)
    assert spec.kv_elements_per_token() == 2 * 40 * 2 * 128
    assert spec.total_params / 1e9 == pytest.approx(9.4, rel=0.01)
    with pytest.raises(PlacementError, match="num_hidden_layers"):
        spec_from_hf_config({**chatglm, "model_type": "glm4"}, "x", "x", "test input")


def test_it_keeps_every_r1_distill_layer_full_attention_as_vllm_does() -> None:
    """The R1 distills' config.json says sliding_window 4096 with use_sliding_window false: vLLM (and HF Qwen2)
    use full attention in all 28 layers, so the KV grows with the whole context, not the 4096-token window."""
    for repo, kv_heads in (
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 2),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 4),
    ):
        spec = load_model(repo)
        assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (28, kv_heads, 128)
        assert spec.kv_elements_per_token() == 2 * 28 * kv_heads * 128
        assert spec.max_position_embeddings == 131072

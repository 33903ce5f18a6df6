"""Planner inputs: catalog, HF config.json (file or folder), GGUF metadata, cluster JSON, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from placement import PlacementError, Request, load_cluster, load_model, plan
from placement.cli import main
from placement.cluster import match_gpu_model
from placement.spec import catalog
from tests.fixtures import FIXTURES, fixture_files, read_fixture

DATA = Path(__file__).parents[1] / "data" / "placement"
SEED_CLUSTER = DATA / "a30_seed_cluster.json"


def write_gguf(
    path: Path,
    layers: int = 4,
    hidden: int = 64,
    tied: bool = False,
    window: int | None = None,
    arch: str = "llama",
) -> None:
    """A tiny F16 GGUF with real tensor headers (so sizes come from tensors, not from a formula)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-test-model")
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(hidden // 4)
    writer.add_context_length(2048)
    writer.add_vocab_size(100)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if window:
        writer.add_sliding_window(window)
    writer.add_tensor("token_embd.weight", np.zeros((100, hidden), dtype=np.float16))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((hidden, hidden), dtype=np.float16))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((2 * hidden, hidden), dtype=np.float16))
    if not tied:
        writer.add_tensor("output.weight", np.zeros((100, hidden), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_it_matches_every_catalog_entry_to_its_published_parameter_count() -> None:
    for key, entry in catalog().items():
        spec = load_model(key)
        assert spec.layer_scale == pytest.approx(1.0, abs=0.01), key  # geometry agrees with the facts
        assert spec.total_params / 1e9 == pytest.approx(entry["params_b_total"], rel=0.005), key
        assert 2 * spec.kv_elements_per_token() == entry["kv_bytes_per_token_bf16"], key
        if "params_b_active" in entry:
            assert spec.active_params / 1e9 == pytest.approx(entry["params_b_active"], rel=0.01), key


def test_it_resolves_catalog_names_by_hf_id_path_part_and_ollama_tag() -> None:
    assert load_model("Qwen/Qwen3-VL-32B-Instruct").name == "Qwen3-VL-32B-Instruct"
    assert load_model("/model/Qwen3-VL-32B-Instruct").name == "Qwen3-VL-32B-Instruct"
    assert load_model("qwen3-vl-32b-instruct-bf16:latest").name == "Qwen3-VL-32B-Instruct"
    assert load_model("meta-llama/Llama-3.1-70B").name == "Llama-3.1-70B-Instruct"
    assert load_model("Qwen3-32B").serve_ref == "Qwen/Qwen3-32B"


def test_it_reads_a_config_file_and_its_folder_the_same_way() -> None:
    folder = load_model(str(DATA / "qwen3-8b"))
    file = load_model(str(DATA / "qwen3-8b" / "config.json"))
    assert folder.num_layers == file.num_layers == 36
    assert folder.head_dim == 128 and folder.native_format == "bf16"
    assert folder.total_params / 1e9 == pytest.approx(8.19, rel=0.01)


def test_it_reads_nested_text_and_vision_configs_with_explicit_head_dim(tmp_path: Path) -> None:
    entry = catalog()["Qwen3-VL-32B-Instruct"]
    text = {
        k: entry[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        )
    }
    config = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "text_config": text,
        "vision_config": entry["vision_tower"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(str(tmp_path))
    assert spec.head_dim == 128 != spec.hidden_size // spec.num_heads
    assert spec.vision is not None and spec.vision.num_heads == 16
    assert spec.vision.params / 1e9 == pytest.approx(0.60, abs=0.02)  # computed from the tower geometry
    assert spec.total_params / 1e9 == pytest.approx(33.36, rel=0.01)


def test_it_reads_quantization_sliding_windows_and_tied_embeddings_from_configs(tmp_path: Path) -> None:
    base = {
        "hidden_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "intermediate_size": 4096,
        "vocab_size": 1000,
        "max_position_embeddings": 8192,
    }
    cases = [
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "native_format", "awq"),
        ({"quantization_config": {"quant_method": "fp8"}}, "native_format", "fp8"),
        ({"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 128}, "kv_layers", 2),
        ({"sliding_window": 4096}, "kv_layers", 0),
        ({"sliding_window": 4096, "use_sliding_window": False}, "kv_layers", 4),
        ({"tie_word_embeddings": True}, "lm_head_params", 0.0),
    ]
    for i, (extra, attribute, expected) in enumerate(cases):
        path = tmp_path / f"c{i}.json"
        path.write_text(json.dumps({**base, **extra}))
        assert getattr(load_model(str(path)), attribute) == expected, extra


def test_it_takes_gguf_sizes_from_tensor_headers_without_loading_weights(tmp_path: Path) -> None:
    path = tmp_path / "tiny-F16.gguf"
    write_gguf(path, layers=4, hidden=64)
    (tmp_path / "mmproj-tiny-F16.gguf").write_bytes(b"\0" * 4096)
    spec = load_model(str(path))
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == (4, 64, 4, 2)
    assert spec.gguf is not None and spec.gguf.file_type == "F16"
    assert spec.gguf.layer_bytes == (3 * 64 * 64 * 2,) * 4  # q (64x64) + up (128x64), 2 bytes each
    assert spec.gguf.output_bytes == 100 * 64 * 2 and spec.gguf.projector_bytes == 4096
    assert not spec.tie_word_embeddings and spec.native_format == "F16"


def test_it_counts_the_tied_output_copy_and_sliding_layers_of_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "swa.gguf"
    write_gguf(path, layers=4, tied=True, window=128, arch="gemma2")
    spec = load_model(str(path))
    assert spec.tie_word_embeddings and spec.gguf is not None
    assert spec.gguf.output_bytes == spec.gguf.embed_bytes  # llama.cpp puts a copy on the output GPU
    assert (spec.full_attention_layers, spec.sliding_layers, spec.sliding_window) == (2, 2, 128)


def test_it_plans_a_gguf_only_on_llama_cpp_and_ollama(tmp_path: Path) -> None:
    path = tmp_path / "tiny-F16.gguf"
    write_gguf(path)
    result = plan(load_model(str(path)), load_cluster(SEED_CLUSTER), Request(max_model_len=1024))
    assert {c.backend for c in result.plans} == {"llama.cpp", "ollama"}
    with pytest.raises(PlacementError, match="holds F16 weights"):
        plan(load_model(str(path)), load_cluster(SEED_CLUSTER), Request(dtype="Q4_K_M"))


def test_it_matches_nvidia_smi_gpu_names_to_the_gpu_table() -> None:
    names = {
        "NVIDIA A100-SXM4-80GB": "A100 80GB SXM4",
        "NVIDIA A100 80GB PCIe": "A100 80GB PCIe",
        "NVIDIA H100 80GB HBM3": "H100 SXM5",
        "NVIDIA H100 PCIe": "H100 PCIe",
        "Tesla T4": "T4",
        "NVIDIA GeForce RTX 3090": "RTX 3090",
        "NVIDIA L40S": "L40S",
        "NVIDIA L4": "L4",
        "NVIDIA A10": "A10",
    }
    for name, row in names.items():
        model = match_gpu_model(name, 81920 if "80GB" in name else 24576)
        assert model is not None and model.name == row, name
    assert match_gpu_model("NVIDIA RTX A6000", 49140) is None


def test_it_reads_raw_topology_text_through_agents_topo() -> None:
    pytest.importorskip("agents.topo")
    path = next(p for p in fixture_files("topo") if p.name.startswith("001_"))
    _, body = read_fixture(path)
    gpus = [{"index": i, "name": "NVIDIA A30", "memory_total_mib": 24576} for i in range(4)]
    cluster = load_cluster({"nodes": [{"name": "box", "gpus": gpus, "topology": body}]})
    node = cluster.nodes[0]
    assert (
        node.link(0, 1).label == "PXB" and node.link(2, 3).label == "PIX" and node.link(0, 2).label == "SYS"
    )
    assert [g.numa for g in node.gpus] == ["0", "0", "1", "1"]


def test_it_rejects_topology_text_it_cannot_parse() -> None:
    pytest.importorskip("agents.topo")
    gpus = [{"index": 0, "name": "NVIDIA A30", "memory_total_mib": 24576}]
    with pytest.raises(PlacementError, match="node 'box' topology"):
        load_cluster({"nodes": [{"name": "box", "gpus": gpus, "topology": "this is not nvidia-smi output"}]})


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"nodes": []}, "'nodes' must be a non-empty list"),
        ({"nodes": [{"name": "a", "gpus": []}]}, "'gpus' must be a non-empty list"),
        (
            {"nodes": [{"name": "a", "gpus": [{"index": 0, "name": "NVIDIA A30"}]}]},
            "'memory_total_mib' missing",
        ),
        (
            {
                "nodes": [
                    {
                        "name": "a",
                        "gpus": [{"index": 0, "name": "NVIDIA A30", "memory_total_mib": float("inf")}],
                    }
                ]
            },
            "'memory_total_mib' must be a positive finite number",
        ),
        (
            {
                "nodes": [
                    {"name": "a", "gpus": [{"index": 0, "name": "NVIDIA A30", "memory_total_mib": 2**40}]}
                ]
            },
            "more than any GPU has",
        ),
        (
            {
                "nodes": [
                    {"name": "a", "gpus": [{"index": 0, "name": "NVIDIA A30", "memory_total_mib": 100}]}
                ]
                * 2
            },
            "2 nodes are named 'a'",
        ),
        (
            {
                "nodes": [
                    {
                        "name": "a",
                        "gpus": [
                            {
                                "index": 0,
                                "name": "NVIDIA A30",
                                "memory_total_mib": 100,
                                "memory_free_mib": 200,
                            }
                        ],
                    }
                ]
            },
            "exceeds memory_total_mib",
        ),
        (
            {
                "nodes": [
                    {
                        "name": "a",
                        "gpus": [{"index": 0, "name": "NVIDIA A30", "memory_total_mib": 100}],
                        "topology": {"kind": "matrix", "links": [{"a": "GPU0"}]},
                    }
                ]
            },
            "every link needs",
        ),
    ],
)
def test_it_names_what_is_wrong_in_a_cluster(cluster: dict, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        load_cluster(cluster)


def test_it_accepts_an_unknown_gpu_with_overrides() -> None:
    gpu = {
        "index": 0,
        "name": "NVIDIA RTX A6000",
        "memory_total_mib": 49140,
        "mem_bw_gbs": 768,
        "bf16_tflops": 155,
    }
    cluster = load_cluster({"nodes": [{"name": "ws", "gpus": [gpu]}]})
    assert cluster.nodes[0].gpus[0].model == "override"
    assert plan(load_model("Llama-3.1-8B-Instruct"), cluster).plans


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["plan", "--model", "NoSuchModel-9B", "--cluster", str(SEED_CLUSTER)],
            "unknown model 'NoSuchModel-9B'",
        ),
        (["plan", "--model", "Qwen3-32B", "--cluster", "/nonexistent/cluster.json"], "cannot read"),
        (
            ["plan", "--model", "Qwen3-32B", "--cluster", str(SEED_CLUSTER), "--tp", "0"],
            "--tp must be at least 1",
        ),
        (
            [
                "plan",
                "--model",
                "Qwen3-32B",
                "--cluster",
                str(SEED_CLUSTER),
                "--gpus",
                "0,1",
                "--tp",
                "2",
                "--pp",
                "2",
            ],
            "--tp 2 x --pp 2 = 4 GPUs, but --gpus lists 2",
        ),
        (
            ["plan", "--model", "Qwen3-32B", "--cluster", str(SEED_CLUSTER), "--gpus", "7"],
            "no node has all of --gpus 7",
        ),
        (
            ["plan", "--model", "Qwen3-32B", "--cluster", str(SEED_CLUSTER), "--dtype", "int3"],
            "unknown weight dtype",
        ),
        (
            ["plan", "--model", "Qwen3-32B", "--cluster", str(SEED_CLUSTER), "--backend", "tgi"],
            "unknown backend 'tgi'",
        ),
        (
            [
                "plan",
                "--model",
                "Qwen3-32B",
                "--cluster",
                str(SEED_CLUSTER),
                "--gpu-memory-utilization",
                "1.5",
            ],
            "must be in",
        ),
        (["check", "--cluster", str(SEED_CLUSTER), "--", "python", "serve.py"], "unrecognised command"),
        (
            ["check", "--cluster", str(SEED_CLUSTER), "--visible", "9", "--", "vllm", "serve", "Qwen3-32B"],
            "leaves no GPU of this node visible",
        ),
        (["plan", "--model", "Qwen3-32B"], "--cluster"),
    ],
)
def test_it_exits_1_naming_the_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    assert exited.value.code == 1
    assert message in capsys.readouterr().err


def test_it_exits_1_on_malformed_config_and_cluster_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 4096,')
    assert main(["plan", "--model", str(bad), "--cluster", str(SEED_CLUSTER)]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    bad.write_text('{"hidden_size": 4096}')
    assert main(["plan", "--model", str(bad), "--cluster", str(SEED_CLUSTER)]) == 1
    assert "missing 'num_hidden_layers'" in capsys.readouterr().err
    cluster = tmp_path / "cluster.json"
    cluster.write_text("[1, 2")
    assert main(["plan", "--model", "Qwen3-32B", "--cluster", str(cluster)]) == 1
    assert f"cluster file {cluster}: not valid JSON" in capsys.readouterr().err


def test_it_ships_the_catalog_as_a_copy_of_the_shared_facts() -> None:
    shared = json.loads((FIXTURES / "placement" / "model_configs.json").read_text(encoding="utf-8"))
    assert catalog() == shared

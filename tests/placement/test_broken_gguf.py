"""A GGUF file with a broken header or tensor table: the planner (CLI and the dashboard's plan request) says
which file and what is wrong, not numpy's words about array shapes; the agent leaves that file out of its
inventory, saying why in its log, and still reports the other models."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from agents.inventory import scan_model_dirs
from dashboard import deploy
from dashboard.choices import PlanStatus
from dashboard.models import PlanRequest
from placement.cli import main
from tests.personas import seed_server
from tests.placement.test_placement_inputs import SEED_CLUSTER, write_gguf

TENSOR_COUNT_AT, FIRST_KEY_AT = 8, 24  # after the magic and version; after both counts


def with_bytes(path: Path, at: int, data: bytes) -> Path:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    path.write_bytes(bytes(raw))
    return path


def broken_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a broken copy of a good GGUF, the words the error must carry)."""
    for name in ("cut", "key", "type", "tensors"):
        write_gguf(folder / f"{name}.gguf")
    whole = (folder / "cut.gguf").read_bytes()
    (folder / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    key_length = struct.unpack_from("<Q", whole, FIRST_KEY_AT)[0]
    tensors = struct.unpack_from("<Q", whole, TENSOR_COUNT_AT)[0]
    return {
        "cut": (folder / "cut.gguf", "ends at byte"),
        "key": (
            with_bytes(folder / "key.gguf", FIRST_KEY_AT + 8, b"\xff\xfe"),
            "a key at byte 24 is not UTF-8",
        ),
        "type": (
            with_bytes(folder / "type.gguf", FIRST_KEY_AT + 8 + key_length, struct.pack("<I", 77)),
            "unknown GGUF value type 77",
        ),
        # more tensor entries than the file holds: the walk reads tensor data as entries
        "tensors": (
            with_bytes(folder / "tensors.gguf", TENSOR_COUNT_AT, struct.pack("<Q", tensors + 1000)),
            "tensor",
        ),
    }


@pytest.mark.parametrize("name", ["cut", "key", "type", "tensors"])
def test_it_names_the_file_and_what_is_wrong_on_the_cli(tmp_path, capsys, name):
    path, words = broken_files(tmp_path)[name]
    assert main(["plan", "--model", str(path), "--cluster", str(SEED_CLUSTER)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and words in err, err
    assert "reshape" not in err and "axis" not in err and "dtype" not in err


@pytest.mark.django_db
def test_it_ends_a_plan_request_for_a_broken_gguf_with_the_file_and_what_is_wrong(tmp_path, settings):
    settings.MODEL_DIRS = [tmp_path]
    seed_server()
    path, words = broken_files(tmp_path)["cut"]
    row = deploy.run_plan_request(PlanRequest.objects.create(model_ref=str(path)).pk)
    assert row.status == PlanStatus.FAILED and str(path) in row.error and "broken GGUF" in row.error
    assert words in row.error and "planning failed on the server" not in row.error


def test_it_leaves_a_broken_gguf_out_of_the_inventory_saying_why_and_reports_the_rest(tmp_path, caplog):
    write_gguf(tmp_path / "good.gguf")
    path, _ = broken_files(tmp_path)["key"]
    with caplog.at_level(logging.WARNING, logger="agents.inventory"):
        models = scan_model_dirs([tmp_path])
    assert "good.gguf" in {Path(m.path).name for m in models} and str(path) not in {m.path for m in models}
    # the agent reads only the first keys (the planner walks the whole header): a file broken further on is
    # reported, and the planner says what is wrong with it
    assert {Path(m.path).name for m in models} == {"good.gguf", "cut.gguf", "tensors.gguf"}
    assert f"model {path} left out: broken GGUF header" in caplog.text and "not UTF-8" in caplog.text


def gguf_with(path: Path, block_count: object, file_type: int) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    if isinstance(block_count, str):
        writer.add_string("llama.block_count", block_count)
    else:
        writer.add_block_count(block_count)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_vocab_size(100)
    writer.add_uint32("general.file_type", file_type)
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("block_count", "file_type", "words"),
    [
        (2, 999, "unknown weight dtype/quantization 'type 999'"),
        ("four", 1, "GGUF metadata has a value the planner cannot use (ValueError: invalid literal"),
    ],
)
def test_it_says_what_is_wrong_with_a_well_formed_header_of_odd_values(
    tmp_path, capsys, block_count, file_type, words
):
    path = gguf_with(tmp_path / "odd.gguf", block_count, file_type)
    assert main(["plan", "--model", str(path), "--cluster", str(SEED_CLUSTER)]) == 1
    assert words in capsys.readouterr().err

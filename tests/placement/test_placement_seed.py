"""The field report end to end: Qwen3-VL-32B-Instruct on 4x A30 24 GB whose GPUs meet only over SYS."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from placement import check_command, load_cluster, load_model, plan
from placement.cli import main
from placement.request import Request

DATA = Path(__file__).parents[1] / "data" / "placement"
SEED_CLUSTER = DATA / "a30_seed_cluster.json"
# The seed's script, verbatim from `vllm serve` on (its exports are CUDA_VISIBLE_DEVICES="1,2,3,4" and
# logging/attention-backend variables that do not change placement).
SEED_VLLM = shlex.split(
    "vllm serve /model/Qwen3-VL-32B-Instruct --gpu-memory-utilization 0.8 --dtype auto --host 0.0.0.0 "
    "--port 7860 --tensor-parallel-size 2 --kv-cache-dtype fp8 --max-model-len 10000 "
    "--limit-mm-per-prompt image=4,video=1 --api-key yourkey"
)
SEED_OLLAMA = shlex.split(
    "CUDA_VISIBLE_DEVICES=0,1,2,3 OLLAMA_NUM_PARALLEL=10 ollama run qwen3-vl-32b-instruct-bf16:latest"
)
ALL_SYS = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      SYS     SYS     SYS     0-23            0
GPU1    SYS      X      SYS     SYS     0-23            0
GPU2    SYS     SYS      X      SYS     24-47           1
GPU3    SYS     SYS     SYS      X      24-47           1
"""


def _codes(items: list[dict[str, str]]) -> set[str]:
    return {item["code"] for item in items}


def _seed_check_json(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["check", "--cluster", str(SEED_CLUSTER), "--visible", "1,2,3,4", "--json", "--", *SEED_VLLM])
    return code, json.loads(capsys.readouterr().out)


def test_it_finds_the_seed_command_infeasible_for_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = _seed_check_json(capsys)
    assert code == 2 and data["feasible"] is False
    assert (data["backend"], data["tp"], data["pp"], data["gpus"]) == ("vllm", 2, 1, [1, 2])
    memory = [p["message"] for p in data["problems"] if p["code"] == "memory"]
    assert (
        memory
        and "weights 31.1" in memory[0]
        and "0.8 x 23.6 GiB (the total CUDA reports) = 18.9 GiB" in memory[0]
    )
    assert all(m > 24 for m in data["memory_gib_per_gpu"])


def test_it_explains_the_seed_link_risk_with_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    _, data = _seed_check_json(capsys)
    link = [r["message"] for r in data["risks"] if r["code"] == "link"]
    assert link, data["risks"]
    for needle in ("SYS", "NCCL hang risk", "NCCL_P2P_DISABLE=1", "--disable-custom-all-reduce", "pipeline"):
        assert needle in link[0]


def test_it_notes_that_cuda_stops_at_the_missing_gpu_4(capsys: pytest.CaptureFixture[str]) -> None:
    _, data = _seed_check_json(capsys)
    assert any("GPU 4 does not exist" in note and "GPUs 1,2,3 are visible" in note for note in data["notes"])


def test_it_suggests_a_plan_that_fits_without_tp_across_sys(capsys: pytest.CaptureFixture[str]) -> None:
    _, data = _seed_check_json(capsys)
    best = data["suggestion"]
    assert best["tp"] == 1 and best["pp"] == 4  # layer/pipeline split: boundaries on SYS, no all-reduce there
    assert not _codes(best["risks"]) & {"link", "memory"}
    assert all(used <= 24.0 for used in best["memory_gib_per_gpu"])
    assert best["kv_cache_tokens"] >= 10000
    assert (
        "--tensor-parallel-size 1 --pipeline-parallel-size 4" in best["command"] or best["backend"] != "vllm"
    )


def test_it_offers_the_llama_cpp_and_ollama_layer_split_that_the_seed_ran() -> None:
    result = check_command(SEED_VLLM, load_cluster(SEED_CLUSTER), visible="1,2,3,4")
    plans = result.suggestions.plans if result.suggestions else []
    split = [p for p in plans if p.backend in ("llama.cpp", "ollama") and len(p.layout.gpus) == 4]
    assert {p.backend for p in split} == {"llama.cpp", "ollama"}
    assert all(p.feasible and p.layout.tp == 1 for p in split)


def test_it_rejects_vllm_tp_over_sys_in_favour_of_the_pipeline() -> None:
    result = plan(
        load_model("/model/Qwen3-VL-32B-Instruct"),
        load_cluster(SEED_CLUSTER),
        Request(max_model_len=10000, kv_cache_dtype="fp8"),
    )
    tp4 = [c for c in result.rejected if c.backend == "vllm" and c.layout.tp == 4]
    assert tp4 and tp4[0].problems[0].code == "link"
    assert "PP" in tp4[0].problems[0].message or "layer split" in tp4[0].problems[0].message
    assert all(
        link is None or link.kind != "cross_socket" for c in result.plans for link in c.layout.tp_links
    )


def test_it_accepts_the_seed_ollama_script_that_ran() -> None:
    result = check_command(SEED_OLLAMA, load_cluster(SEED_CLUSTER))
    assert result.feasible
    assert result.candidate.layout.pp == 4 and result.candidate.settings.concurrency == 10
    perf = result.candidate.perf
    assert perf is not None and 25 <= perf.decode_tok_s_total <= 100  # the report says "about 50 tokens/s"


def test_it_gives_the_same_verdict_from_raw_topology_text() -> None:
    pytest.importorskip("agents.topo")
    data = json.loads(SEED_CLUSTER.read_text())
    data["nodes"][0]["topology"] = ALL_SYS
    result = check_command(SEED_VLLM, load_cluster(data), visible="1,2,3,4")
    assert not result.feasible
    assert {p.code for p in result.problems} == {"memory"}
    assert "link" in {r.code for r in result.candidate.risks}

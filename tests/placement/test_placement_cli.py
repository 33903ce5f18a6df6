"""`python -m placement plan/check`: JSON shape, human output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placement.cli import main

REPO = Path(__file__).resolve().parents[2]
SEED_CLUSTER = REPO / "tests" / "data" / "placement" / "a30_seed_cluster.json"
PLAN_FIELDS = {
    "backend",
    "tp",
    "pp",
    "node",
    "gpus",
    "weights_gib_per_gpu",
    "memory_gib_per_gpu",
    "breakdown",
    "kv_cache_tokens",
    "decode_tok_s",
    "decode_tok_s_total",
    "prefill_tok_s",
    "env",
    "command",
    "risks",
    "why",
}
REJECTED_FIELDS = {"backend", "tp", "pp", "node", "gpus", "problems"}
CHECK_FIELDS = {"feasible", "problems", "risks", "memory_gib_per_gpu", "suggestion"}


def test_it_prints_plans_as_json_from_the_module_entry_point() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "placement",
            "plan",
            "--model",
            "Qwen3-VL-32B-Instruct",
            "--cluster",
            str(SEED_CLUSTER),
            "--max-model-len",
            "10000",
            "--concurrency",
            "4",
            "--kv-cache-dtype",
            "fp8",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["plans"] and data["rejected"]
    for plan in data["plans"]:
        assert set(plan) >= PLAN_FIELDS
        assert len(plan["memory_gib_per_gpu"]) == len(plan["gpus"]) == len(plan["breakdown"])
        assert plan["weights_gib_per_gpu"] == max(g["weights_gib"] for g in plan["breakdown"])
        assert all(set(r) == {"code", "message"} for r in plan["risks"])
        served = plan["performance"]["streams"]  # up to the 4 asked for, as many as the KV cache holds
        assert plan["decode_tok_s_total"] == pytest.approx(plan["decode_tok_s"] * served, rel=0.02)
    for rejected in data["rejected"]:
        assert set(rejected) >= REJECTED_FIELDS and rejected["problems"]
        assert all(
            p["code"] in {"memory", "divisibility", "context", "link", "numa", "network", "busy"}
            for p in rejected["problems"]
        )


def test_it_shows_the_arithmetic_in_each_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan", "--model", "Qwen3-32B", "--cluster", str(SEED_CLUSTER), "--backend", "vllm", "--json"])
        == 0
    )
    best = json.loads(capsys.readouterr().out)["plans"][0]
    for gpu in best["breakdown"]:
        parts = sum(
            v
            for k, v in gpu.items()
            if k.endswith("_gib")
            and k not in {"total_gib", "limit_gib", "free_gib", "capacity_gib", "budget_gib"}
        )
        assert parts == pytest.approx(gpu["total_gib"], abs=0.05)
        assert gpu["total_gib"] <= gpu["free_gib"]
    assert "0.9 x 23.6 GiB = 21.2 GiB budget" in best["why"] and "tok/s" in best["why"]


def test_it_prints_a_readable_ranking(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan", "--model", "Qwen3-VL-32B-Instruct", "--cluster", str(SEED_CLUSTER), "--limit", "3"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("  1. ")
    assert "why: " in out and "run: " in out and "rejected:" in out


def test_it_answers_check_in_the_same_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["check", "--cluster", str(SEED_CLUSTER), "--json", "--", "vllm", "serve", "Qwen/Qwen3-8B-AWQ-X"]
    )
    assert code == 1  # not a catalog model and no such folder
    assert "unknown model 'Qwen/Qwen3-8B-AWQ-X'" in capsys.readouterr().err
    code = main(
        [
            "check",
            "--cluster",
            str(SEED_CLUSTER),
            "--json",
            "--",
            "vllm",
            "serve",
            "Qwen/Qwen3-32B",
            "--tensor-parallel-size",
            "4",
            "--max-model-len",
            "8192",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= CHECK_FIELDS
    assert code == 0 and data["feasible"] is True  # the operator forced TP: it runs, with the risks listed
    assert {"link", "numa"} <= {r["code"] for r in data["risks"]}
    assert data["suggestion"]["tp"] == 1  # while the planner would not put TP across SYS


def test_it_exits_2_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen2.5-72B-Instruct", "--cluster", str(SEED_CLUSTER)]) == 2
    assert "0 plan(s)" in capsys.readouterr().out

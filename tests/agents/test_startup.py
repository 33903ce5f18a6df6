"""Startup measurements (weights, KV cache) read from public vLLM, SGLang and llama.cpp logs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents.startup import read_startup
from tests.fixtures import REPO, fixture_files, read_fixture


def facts_of(kind: str, pattern: str) -> dict[str, float | int]:
    _, body = read_fixture(fixture_files(kind, pattern)[0])
    return read_startup(body.splitlines()).found()


@pytest.mark.parametrize(
    ("kind", "pattern", "expected"),
    [
        (
            "startup",
            "vllm_pr17122_*",
            {
                "weights_gib": 14.9889,
                "kv_tokens": 158656,
                "max_concurrency": 4.84,
                "context_tokens": 32768,
                "load_seconds": 2.95,
            },
        ),
        ("startup", "vllm_issue21348_*", {"kv_cache_gib": 8.11, "kv_tokens": 178880}),
        ("startup", "sglang_issue21348_*", {"kv_cache_gib": 16.46, "kv_tokens": 367404}),
        (
            "logs",
            "044_*",
            {"kv_cache_gib": 112.61, "kv_tokens": 922496, "max_concurrency": 23.06, "context_tokens": 40000},
        ),
        ("logs", "041_*", {"weights_gib": 51.3655, "load_seconds": 145.32}),
    ],
)
def test_it_reads_the_startup_lines_of_each_server(kind: str, pattern: str, expected: dict) -> None:
    assert facts_of(kind, pattern) == pytest.approx(expected)


def test_it_keeps_the_largest_gpu_of_a_llama_cpp_split() -> None:
    facts = facts_of("startup", "llamacpp_issue9390_*")
    assert facts["weights_gib"] == pytest.approx(25338.47 / 1024)
    assert facts["kv_cache_gib"] == pytest.approx(5824.0 / 1024)
    assert facts["kv_tokens"] == 16384


def test_it_takes_no_weights_from_a_server_that_loaded_nothing() -> None:
    line = "(EngineCore_0 pid=7) INFO [gpu_model_runner.py:1801] Model loading took 0.00 GiB and 0.2 seconds (simulated)"
    assert read_startup([line]).weights_gib is None


def test_it_finds_nothing_in_lines_that_measure_nothing() -> None:
    assert (
        read_startup(
            ["INFO Uvicorn running on http://0.0.0.0:8000", "CPU_Mapped model buffer size = 5 MiB"]
        ).found()
        == {}
    )


def test_it_prints_the_measurements_of_a_log_file_and_refuses_a_missing_one() -> None:
    path = fixture_files("startup", "vllm_pr17122_*")[0]
    ok = subprocess.run(
        [sys.executable, "-m", "agents.startup", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0 and '"kv_tokens": 158656' in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "agents.startup", "/nonexistent.log"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1 and "cannot read /nonexistent.log" in bad.stderr

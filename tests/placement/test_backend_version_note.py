"""Every vLLM plan and check says which vLLM release it assumed and where that came from (issue #14: the
server fills the release from the node agents' reports; the CLI takes --backend-version)."""

from __future__ import annotations

import pytest

from placement import Request, check_command, load_cluster, load_model, plan

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}


def cluster():
    return load_cluster({"nodes": [{"name": "n", "gpus": [{"index": i, **H100} for i in range(2)]}]})


def vllm_notes(request: Request) -> list[str]:
    best = plan(load_model("Llama-3.1-8B-Instruct"), cluster(), request).plans[0]
    return [note for note in best.perf.assumes if note.startswith("vLLM ")]


@pytest.mark.parametrize(
    ("version", "source", "note"),
    [
        (
            None,
            "",
            "vLLM release unknown (none given with the request): non-torch memory at the pessimistic 0.35",
        ),
        ("0.7.3", "", "vLLM 0.7.3 (given with the request): non-torch memory 0.16 GiB per rank, 0.2 at TP>1"),
        ("0.7.3", "reported by n's agent", "vLLM 0.7.3 (reported by n's agent): non-torch memory 0.16 GiB"),
        (
            "0.11.0",
            "reported by n's agent",
            "vLLM 0.11.0 (reported by n's agent): no public profiling figures",
        ),
    ],
)
def test_it_names_the_vllm_release_and_its_source(version, source, note) -> None:
    request = Request(
        backend="vllm", max_model_len=8192, backend_version=version, backend_version_source=source
    )
    [said] = vllm_notes(request)
    assert said.startswith(note)


def test_it_says_nothing_of_vllm_for_another_backend() -> None:
    assert vllm_notes(Request(backend="sglang", max_model_len=8192, backend_version="0.7.3")) == []


def test_check_takes_the_release_it_is_given_with_its_source() -> None:
    argv = "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192"
    result = check_command(argv, cluster(), backend_version=("0.6.5", "reported by n's agent")).to_json()
    assert any(
        a.startswith("vLLM 0.6.5 (reported by n's agent): non-torch memory 1.79") for a in result["assumes"]
    )
    assert result["breakdown"][0]["non_torch_gib"] == pytest.approx(1.79, abs=0.01)

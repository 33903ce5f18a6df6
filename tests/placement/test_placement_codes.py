"""Every risk and reject code is reachable, TP groups follow the links, and multi-node plans are built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from placement import Request, load_cluster, load_model, plan
from placement.plans import BUSY_SHAPES
from placement.result import PlanResult

DATA = Path(__file__).parents[1] / "data" / "placement"
SEED_CLUSTER = DATA / "a30_seed_cluster.json"
CODES = {"memory", "divisibility", "context", "link", "numa", "network", "busy"}


def node(
    name: str,
    gpu: str,
    count: int,
    mib: float,
    links: dict[tuple[int, int], str] | str | None = None,
    free: list[float] | None = None,
    numa: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    gpus = [{"index": i, "name": gpu, "memory_total_mib": mib} for i in range(count)]
    for i, value in enumerate(free or []):
        gpus[i]["memory_free_mib"] = value
    data: dict[str, Any] = {"name": name, "gpus": gpus, **extra}
    if links is not None:
        pairs = [(a, b) for a in range(count) for b in range(a + 1, count)]
        label = (lambda a, b: links) if isinstance(links, str) else (lambda a, b: links[(a, b)])
        entries = [{"name": f"GPU{i}", "numa_affinity": (numa or [None] * count)[i]} for i in range(count)]
        data["topology"] = {
            "kind": "matrix",
            "gpus": entries,
            "nics": [],
            "links": [{"a": f"GPU{a}", "b": f"GPU{b}", "link": label(a, b)} for a, b in pairs],
        }
    return data


def codes(result: PlanResult) -> tuple[set[str], set[str]]:
    """(codes among rejected problems, codes among plan risks)."""
    rejected = {p.code for c in result.rejected for p in c.problems}
    risks = {r.code for c in result.plans for r in c.risks}
    return rejected, risks


def seed_plan(**request: Any) -> PlanResult:
    return plan(
        load_model("Qwen3-VL-32B-Instruct"),
        load_cluster(SEED_CLUSTER),
        Request(max_model_len=10000, kv_cache_dtype="fp8", **request),
    )


def test_it_rejects_for_memory_divisibility_and_link_on_the_seed_box() -> None:
    rejected, _ = codes(seed_plan())
    assert {"memory", "divisibility", "link"} <= rejected


def test_it_rejects_a_context_longer_than_the_model_allows() -> None:
    result = plan(load_model("Qwen3-32B"), load_cluster(SEED_CLUSTER), Request(max_model_len=300000))
    assert not result.plans
    assert any(p.code == "context" and "40,960" in p.message for c in result.rejected for p in c.problems)


def test_it_keeps_forced_tp_over_sys_as_a_plan_with_link_and_numa_risks() -> None:
    result = seed_plan(backend="vllm", tp=4)
    assert result.plans
    risks = {r.code for r in result.plans[0].risks}
    assert {"link", "numa"} <= risks
    best = result.to_json(limit=1)["plans"][0]
    assert best["env"]["NCCL_P2P_DISABLE"] == "1" and "--disable-custom-all-reduce" in best["command"]


def test_it_builds_tp_groups_inside_pix_and_pxb_pairs_with_the_boundary_on_sys() -> None:
    links = {(0, 1): "PXB", (2, 3): "PIX", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS", (1, 3): "SYS"}
    cluster = load_cluster({"nodes": [node("box", "NVIDIA A30", 4, 24576, links, numa=["0", "0", "1", "1"])]})
    result = plan(load_model("Qwen3-32B"), cluster, Request(backend="vllm", max_model_len=8192))
    tp2 = next(c for c in result.plans if c.layout.tp == 2 and c.layout.pp == 2)
    assert [[g.index for g in stage] for stage in tp2.layout.stages] == [[0, 1], [2, 3]]
    assert tp2.layout.boundaries[0].label == "SYS" and not tp2.risks
    tp4 = next(c for c in result.rejected if c.layout.tp == 4)
    assert tp4.problems[-1].code == "link" and "TP=2 x PP=2" in tp4.problems[-1].message


def test_it_allows_tp_without_p2p_inside_one_socket_but_flags_it() -> None:
    cluster = load_cluster({"nodes": [node("ws", "NVIDIA GeForce RTX 4090", 2, 24564, "PHB")]})
    result = plan(load_model("Qwen3-32B"), cluster, Request(backend="vllm", max_model_len=8192, dtype="awq"))
    tp2 = next(c for c in result.plans if c.layout.tp == 2)
    assert [r.code for r in tp2.risks] == ["link"]  # GeForce: the stock driver disables PCIe P2P
    assert "PCIe without P2P" in tp2.risks[0].message


def busy_a100(free_mib: float) -> Any:
    return load_cluster({"nodes": [node("shared", "NVIDIA A100-SXM4-80GB", 1, 81920, free=[free_mib])]})


def test_it_flags_memory_other_processes_hold_and_lowers_the_utilization() -> None:
    result = plan(
        load_model("Llama-3.1-8B-Instruct"), busy_a100(40960), Request(backend="vllm", max_model_len=8192)
    )
    best = result.plans[0]
    assert [r.code for r in best.risks] == ["busy"]
    assert best.memory.knobs["gpu_memory_utilization"] == pytest.approx(0.49)  # (40 - 0.5 graphs - 0.25) / 80
    assert "lowered from 0.9" in best.risks[0].message


def test_it_rejects_an_explicit_utilization_busy_gpus_cannot_give() -> None:
    result = plan(
        load_model("Llama-3.1-8B-Instruct"),
        busy_a100(40960),
        Request(backend="vllm", gpu_memory_utilization=0.9),
    )
    assert not result.plans
    problem = result.rejected[0].problems[0]
    assert problem.code == "busy" and "refuses to start" in problem.message


def test_it_rejects_weights_that_only_fit_if_other_processes_let_go() -> None:
    result = plan(load_model("Llama-3.1-8B-Instruct"), busy_a100(10240), Request(backend="llama.cpp"))
    assert [p.code for c in result.rejected for p in c.problems] == ["busy"]


def _two_l4_nodes(**extra: Any) -> Any:
    return load_cluster(
        {
            "nodes": [
                node(
                    n,
                    "NVIDIA L4",
                    4,
                    23034,
                    "PHB",
                    address=f"10.0.0.{i + 1}",
                    network_interface="eth1",
                    **extra,
                )
                for i, n in enumerate(("l4-a", "l4-b"))
            ]
        }
    )


def test_it_plans_across_nodes_with_pp_between_them() -> None:
    result = plan(
        load_model("Llama-3.1-70B-Instruct"), _two_l4_nodes(network_gbps=25), Request(max_model_len=8192)
    )
    assert result.plans and all(c.layout.multi_node for c in result.plans)
    data = result.to_json()
    by_backend = {p["backend"]: p for p in reversed(data["plans"])}
    assert set(by_backend) == {"vllm", "sglang", "llama.cpp"}  # Ollama has no multi-node mode
    assert (
        "ray start --head" in by_backend["vllm"]["command"]
        and "ray start --address 10.0.0.1:6379" in by_backend["vllm"]["node_commands"]["l4-b"]
    )
    assert "--nnodes 2 --node-rank 1" in by_backend["sglang"]["node_commands"]["l4-b"]
    assert "--rpc 10.0.0.2:50052" in by_backend["llama.cpp"]["command"]
    assert by_backend["vllm"]["env"]["NCCL_SOCKET_IFNAME"] == "eth1"
    assert "network" in {r["code"] for r in by_backend["vllm"]["risks"]}
    assert all(p["tp"] <= 4 for p in data["plans"])  # TP never spans the network


def test_it_rejects_tp_across_nodes() -> None:
    result = plan(
        load_model("Llama-3.1-70B-Instruct"),
        _two_l4_nodes(network_gbps=25),
        Request(backend="vllm", tp=8, max_model_len=8192),
    )
    assert not result.plans
    assert "network" in codes(result)[0]


def test_it_rejects_multi_node_plans_without_network_facts() -> None:
    result = plan(load_model("Llama-3.1-70B-Instruct"), _two_l4_nodes(), Request(max_model_len=8192))
    assert not result.plans
    assert any("no network_gbps" in p.message for c in result.rejected for p in c.problems)


def test_it_reaches_every_code() -> None:
    seen: set[str] = set()
    for result in (
        seed_plan(),
        seed_plan(backend="vllm", tp=4),
        plan(load_model("Qwen3-32B"), load_cluster(SEED_CLUSTER), Request(max_model_len=300000)),
        plan(load_model("Llama-3.1-70B-Instruct"), _two_l4_nodes(network_gbps=25), Request()),
        plan(load_model("Llama-3.1-8B-Instruct"), busy_a100(40960), Request()),
    ):
        rejected, risks = codes(result)
        seen |= rejected | risks
    assert seen == CODES


def test_it_reports_identical_nodes_once_with_their_twins() -> None:
    nodes = [node(f"h{i}", "NVIDIA H100 80GB HBM3", 8, 81559, "NV18") for i in range(3)]
    result = plan(
        load_model("Qwen3-32B"), load_cluster({"nodes": nodes}), Request(backend="vllm", tp=2, pp=1)
    )
    single = [c for c in result.plans if not c.layout.multi_node]
    assert len(single) == 1 and single[0].equivalent_nodes == ["h1", "h2"]
    assert json.loads(json.dumps(result.to_json()))["plans"][0]["equivalent_nodes"] == ["h1", "h2"]


@pytest.mark.parametrize("backend", ["vllm", "sglang", "llama.cpp", "ollama"])
def test_it_emits_runnable_commands_per_backend(backend: str) -> None:
    result = seed_plan(backend=backend)
    command = result.to_json(limit=1)["plans"][0]["command"]
    expected = {
        "vllm": "vllm serve Qwen/Qwen3-VL-32B-Instruct",
        "sglang": "python -m sglang.launch_server",
        "llama.cpp": "llama-server -m Qwen3-VL-32B-Instruct-BF16.gguf --mmproj",
        "ollama": "ollama serve",
    }
    assert expected[backend] in command and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in command


def test_it_evaluates_busy_nodes_of_a_large_fleet_for_their_fastest_shapes_only() -> None:
    idle = [node(f"idle{i}", "NVIDIA H100 80GB HBM3", 8, 81559, "NV18") for i in range(12)]
    busy = [
        node(f"busy{i}", "NVIDIA H100 80GB HBM3", 8, 81559, "NV18", free=[60000 - 100 * i] * 8)
        for i in range(8)
    ]
    result = plan(load_model("Qwen3-32B"), load_cluster({"nodes": idle + busy}), Request(max_model_len=8192))
    per_node: dict[str, int] = {}
    for c in result.plans + result.rejected:
        per_node[c.layout.node_names[0]] = per_node.get(c.layout.node_names[0], 0) + 1
    assert all(per_node[f"busy{i}"] <= BUSY_SHAPES for i in range(8))
    best = result.plans[0]
    assert best.layout.node_names[0].startswith("idle") and len(best.equivalent_nodes) == 11

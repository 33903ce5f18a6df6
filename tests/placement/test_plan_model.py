"""The typed plan (placement.plan_model.Plan): every plan the planner writes reads back into it and out again
unchanged, so rows stored as JSON before the class existed load, and the dashboard reads plans by name."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from placement import Request, load_cluster, load_model, plan
from placement.plan_model import Plan

SEED_CLUSTER = Path(__file__).parents[1] / "data" / "placement" / "a30_seed_cluster.json"


def twin_seed_cluster() -> dict:
    """Two copies of the seed server, so models too big for one get multi-node plans."""
    one = json.loads(SEED_CLUSTER.read_text())["nodes"][0]
    return {"nodes": [{**copy.deepcopy(one), "name": name} for name in ("a30-a", "a30-b")]}


def planned(model: str, cluster, **request) -> list[dict]:
    result = plan(load_model(model), load_cluster(cluster), Request(**request)).to_json()
    return json.loads(json.dumps(result))["plans"]  # as the JSON column hands it back


SCENARIOS = {
    "seed, every backend": ("Qwen3-VL-32B-Instruct", SEED_CLUSTER, {"max_model_len": 8192}),
    "seed, llama.cpp": (
        "Qwen3-VL-32B-Instruct",
        SEED_CLUSTER,
        {"max_model_len": 8192, "backend": "llama.cpp"},
    ),
    "seed, ollama": ("Qwen3-VL-32B-Instruct", SEED_CLUSTER, {"max_model_len": 8192, "backend": "ollama"}),
    "two nodes": ("Llama-3.1-70B-Instruct", None, {"max_model_len": 8192}),
}


@pytest.fixture(scope="module", params=list(SCENARIOS))
def plans(request) -> list[dict]:
    model, cluster, options = SCENARIOS[request.param]
    return planned(model, cluster or twin_seed_cluster(), **options)


def test_it_reads_every_planned_plan_and_writes_the_same_json_back(plans):
    assert plans
    for data in plans:
        typed = Plan.from_json(data)
        assert typed.extra == {}, f"Plan does not name {sorted(typed.extra)}"
        assert typed.settings is not None and typed.settings.knobs.keys() <= {
            "max_num_batched_tokens",
            "max_num_seqs",
            "num_ctx",
            "OLLAMA_NUM_PARALLEL",
            "split_mode",
        }
        assert typed.to_json() == data
        assert json.loads(json.dumps(typed.to_json())) == data


def test_it_gives_single_and_multi_node_plans_the_same_placements():
    plans = [
        Plan.from_json(p) for p in planned("Llama-3.1-70B-Instruct", twin_seed_cluster(), max_model_len=8192)
    ]
    multi = next(p for p in plans if p.multi_node)
    assert multi.nodes in (["a30-a", "a30-b"], ["a30-b", "a30-a"])
    assert [gpus for _, gpus in multi.placements()] == [multi.gpus_on(node) for node in multi.nodes]
    assert multi.to_json()["gpus"] == dict(multi.placements())
    single = Plan.from_json({"backend": "vllm", "tp": 2, "pp": 1, "node": "box", "gpus": [1, 2]})
    assert single.placements() == [("box", [1, 2])] and single.where_text() == "box GPUs 1,2"


def test_it_loads_sparse_hand_made_plans_with_the_old_defaults():
    sparse = Plan.from_json({"tp": 2, "gpus": [0, 1]})
    assert (sparse.tp, sparse.pp, sparse.head_gpus, sparse.placements()) == (2, 1, [0, 1], [])
    assert not sparse.needs_override and sparse.settings is None


def test_it_needs_an_override_only_for_a_plan_on_busy_gpus():
    busy = {
        "backend": "vllm",
        "node": "box",
        "gpus": [0],
        "risks": [{"code": "busy", "message": "GPU 0 in use"}],
    }
    assert Plan.from_json(busy).needs_override
    assert not Plan.from_json({**busy, "risks": [{"code": "no_p2p", "message": "SYS"}]}).needs_override


def test_it_draws_memory_bars_without_changing_the_stored_breakdown(plans):
    data = plans[0]
    before = copy.deepcopy(data)
    bars = Plan.from_json(data).memory_bars()
    assert len(bars) == len(data["breakdown"]) and data == before
    assert all(0 <= bar.other_gib <= bar.total_gib for bar in bars)


def test_it_refuses_a_plan_that_is_not_an_object():
    with pytest.raises(ValueError, match="a plan must be a JSON object, not list"):
        Plan.from_json([1, 2])

"""One node the planner cannot use (issue #10, item 4): it is left out and reported with the reason, and every
other node is still planned, from a cluster file, through the CLI and through the dashboard's plan request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.utils import timezone

from dashboard import tasks
from dashboard.choices import PlanStatus
from dashboard.ingest import apply_hello
from dashboard.models import Gpu, GpuSample, Node, PlanRequest
from placement import PlacementError, Request, load_cluster, load_model, plan
from placement.cli import main
from placement.cluster import estimated_speed
from tests.dashboard.test_deploy import planned
from tests.personas import hello_for, seed_server, sim_node

SEED = json.loads((Path(__file__).parents[1] / "data" / "placement" / "a30_seed_cluster.json").read_text())
A6000 = {"index": 0, "name": "NVIDIA RTX A6000", "memory_total_mib": 49140}
SMALL_MODEL = "Llama-3.1-8B-Instruct"


def nodes_of(plans: list[dict]) -> set[str]:
    return {name for p in plans for name in p.get("nodes") or [p["node"]]}


def with_node(node: dict) -> dict:
    return {"nodes": [*SEED["nodes"], node]}


def gpu(**fields) -> dict:
    return {"index": 0, "name": "NVIDIA A30", "memory_total_mib": 24576, **fields}


BAD_NODES = [
    (
        {"name": "x", "gpus": [gpu(memory_free_mib=30000)]},
        "memory_free_mib 30000 exceeds memory_total_mib 24576",
    ),
    (
        {"name": "x", "gpus": [gpu(memory_total_mib=float("nan"))]},
        "'memory_total_mib' must be a positive finite",
    ),
    ({"name": "x", "gpus": []}, "'gpus' must be a non-empty list"),
    ({"name": "x", "gpus": [gpu(), gpu()]}, "GPU indices repeat"),
    ({"name": "x", "gpus": [gpu()], "topology": "this is not nvidia-smi output"}, "node 'x' topology"),
    (
        {"name": "x", "gpus": [gpu()], "topology": {"kind": "matrix", "links": [], "gpus": [7]}},
        "malformed entry",
    ),
    ({"name": "x", "gpus": ["GPU0"]}, "expected an object"),
    ({"name": "a30-box", "gpus": [gpu()]}, "2 nodes are named 'a30-box'"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_NODES)
def test_it_leaves_out_a_node_it_cannot_use_and_still_plans_the_others(bad: dict, reason: str) -> None:
    cluster = load_cluster({"nodes": [*SEED["nodes"], {**SEED["nodes"][0], "name": "good"}, bad]})
    assert [r.name for r in cluster.rejected_nodes] == [bad["name"]]
    assert reason in cluster.rejected_nodes[0].reason
    result = plan(load_model(SMALL_MODEL), cluster, Request(max_model_len=8192)).to_json()
    assert result["plans"] and bad["name"] not in nodes_of(result["plans"])
    left_out = result["rejected"][0]
    assert left_out["node"] == bad["name"] and left_out["problems"][0]["code"] == "node_input"
    assert reason in left_out["problems"][0]["message"]


def test_it_plans_a_request_pinned_to_a_good_node_next_to_a_bad_one() -> None:
    cluster = load_cluster(with_node({"name": "x", "gpus": [gpu(memory_free_mib=99999)]}))
    result = plan(load_model(SMALL_MODEL), cluster, Request(max_model_len=8192, node="a30-box"))
    assert result.plans and {c.layout.node_names[0] for c in result.plans} == {"a30-box"}
    with pytest.raises(PlacementError, match="node 'x' cannot be planned: .*exceeds memory_total_mib"):
        plan(load_model(SMALL_MODEL), cluster, Request(max_model_len=8192, node="x"))


def test_it_fails_only_when_no_node_can_be_planned_and_names_every_reason() -> None:
    nodes = [{"name": "x", "gpus": [gpu(memory_free_mib=99999)]}, {"name": "y", "gpus": []}]
    with pytest.raises(
        PlacementError, match="no node can be planned: .*'x' gpus\\[0\\].*exceeds.*'y': 'gpus'"
    ):
        load_cluster({"nodes": nodes})


def test_it_plans_an_unknown_gpu_from_its_memory_with_a_conservative_speed_and_says_so() -> None:
    cluster = load_cluster({"nodes": [{"name": "ws", "gpus": [A6000]}]})
    a6000 = cluster.nodes[0].gpus[0]
    assert (a6000.mem_bw_gbs, a6000.tflops) == estimated_speed() == (300.0, 65.0)  # the table's L4 and T4
    result = plan(load_model(SMALL_MODEL), cluster, Request(max_model_len=8192))
    best = result.to_json()["plans"][0]
    assert best["node"] == "ws" and best["breakdown"][0]["capacity_gib"] == pytest.approx(
        49140 / 1024, abs=0.01
    )
    risk = next(r for r in best["risks"] if r["code"] == "estimated_speed")
    assert "'NVIDIA RTX A6000' (ws)" in risk["message"] and "300 GB/s" in risk["message"]
    assert best["decode_tok_s"] < 300 / 16  # a floor: 8B bf16 weights (16 GB) read at 300 GB/s per token


def test_it_gives_no_speed_risk_for_a_gpu_in_the_table() -> None:
    result = plan(load_model(SMALL_MODEL), load_cluster(SEED), Request(max_model_len=8192)).to_json()
    assert not any(r["code"] == "estimated_speed" for p in result["plans"] for r in p["risks"])


def test_it_prints_the_left_out_node_in_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(with_node({"name": "x", "gpus": [gpu(memory_free_mib=99999)]})))
    assert main(["plan", "--model", SMALL_MODEL, "--cluster", str(path), "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert "node x (left out): [node_input]" in out and "exceeds memory_total_mib" in out


# ---- through the dashboard: the fleet as the agents reported it ----------------------------------------------
def report_free_memory(node: Node, index: int, free_mib: float) -> None:
    """The node's newest sample says `free_mib` free on GPU `index`."""
    GpuSample.objects.create(
        gpu=node.gpus.get(index=index),
        t=timezone.now(),
        seq=1,
        util_gpu=0,
        util_mem=0,
        mem_used_mib=0,
        mem_free_mib=free_mib,
        temp_c=40,
        power_w=60,
    )


def fleet_with_an_unknown_gpu_and_a_broken_node() -> Node:
    """a30-seed (good), a6000-ws (a GPU the table does not know) and broken (free memory above total)."""
    seed = seed_server()
    Gpu.objects.filter(node=sim_node("a6000-ws", "sim:a30x4")).update(name="NVIDIA RTX A6000")
    report_free_memory(sim_node("broken", "sim:a30x4"), 0, 10**6)
    return seed


@pytest.mark.django_db
def test_it_plans_the_fleet_when_one_node_reports_an_unknown_gpu_and_another_free_above_total(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    seed = fleet_with_an_unknown_gpu_and_a_broken_node()
    row = PlanRequest.objects.create(model_ref=SMALL_MODEL, max_model_len=8192)
    assert tasks.plan_request(row.pk) == PlanStatus.DONE
    row.refresh_from_db()
    assert row.status == PlanStatus.DONE, row.error
    assert "a30-seed" in nodes_of(row.result["plans"])
    left_out = [r for r in row.result["rejected"] if r["problems"][0]["code"] == "node_input"]
    assert [r["node"] for r in left_out] == ["broken"] and "exceeds" in left_out[0]["problems"][0]["message"]
    pinned = planned(SMALL_MODEL, max_model_len=8192, node=seed)
    assert pinned.status == PlanStatus.DONE and nodes_of(pinned.result["plans"]) == {"a30-seed"}
    unknown = planned(SMALL_MODEL, max_model_len=8192, node=Node.objects.get(name="a6000-ws"))
    assert unknown.status == PlanStatus.DONE and nodes_of(unknown.result["plans"]) == {"a6000-ws"}
    assert all("estimated_speed" in {r["code"] for r in p["risks"]} for p in unknown.result["plans"])


@pytest.mark.django_db
def test_it_shows_the_left_out_node_where_rejected_configurations_show(client, alice):
    fleet_with_an_unknown_gpu_and_a_broken_node()
    row = planned(SMALL_MODEL, max_model_len=8192)
    client.force_login(alice)
    page = client.get(f"/deploy/plans/{row.pk}/fragment/").content.decode()
    rejected = page[page.index("Rejected configurations") :]
    assert "broken" in rejected and "node_input" in rejected and "exceeds memory_total_mib" in rejected
    assert "whole node left out" in rejected
    unknown = planned(SMALL_MODEL, max_model_len=8192, node=Node.objects.get(name="a6000-ws"))
    page = client.get(f"/deploy/plans/{unknown.pk}/fragment/").content.decode()
    assert "<b>estimated_speed</b>" in page and "NVIDIA RTX A6000" in page


def fleet_with_nodes_not_reported_yet() -> None:
    """a30-seed, `no-topo` (its agent's hello carried no topology) and `silent` (no agent connected yet)."""
    seed_server()
    no_topo = Node.objects.create(name="no-topo")
    apply_hello(no_topo, hello_for("no-topo", "sim:a30x4").model_copy(update={"topology": None}))
    Node.objects.create(name="silent")


def left_out_reasons(result: dict) -> dict[str, str]:
    return {
        r["node"]: r["problems"][0]["message"]
        for r in result["rejected"]
        if r["problems"][0]["code"] == "node_input"
    }


@pytest.mark.django_db
def test_it_lists_nodes_without_a_topology_or_gpus_among_the_rejected_with_why(client, alice):
    fleet_with_nodes_not_reported_yet()
    row = planned(SMALL_MODEL, max_model_len=8192)
    assert row.status == PlanStatus.DONE, row.error
    assert nodes_of(row.result["plans"]) == {"a30-seed"}
    reasons = left_out_reasons(row.result)
    assert set(reasons) == {"no-topo", "silent"}
    assert "no topology reported yet" in reasons["no-topo"] and "no GPUs reported yet" in reasons["silent"]
    client.force_login(alice)
    page = client.get(f"/deploy/plans/{row.pk}/fragment/").content.decode()
    rejected = page[page.index("Rejected configurations") :]
    assert "no-topo" in rejected and "no topology reported yet" in rejected and "silent" in rejected


@pytest.mark.django_db
def test_it_says_why_a_chosen_node_without_a_topology_cannot_be_planned():
    fleet_with_nodes_not_reported_yet()
    pinned = planned(SMALL_MODEL, max_model_len=8192, node=Node.objects.get(name="no-topo"))
    assert pinned.status == PlanStatus.FAILED
    assert "node 'no-topo' cannot be planned" in pinned.error and "no topology reported yet" in pinned.error


@pytest.mark.django_db
def test_it_says_why_no_node_can_be_planned_when_none_has_a_topology():
    Node.objects.create(name="silent")
    row = planned(SMALL_MODEL, max_model_len=8192)
    assert row.status == PlanStatus.FAILED and "silent: no GPUs reported yet" in row.error

"""Deploy, server side: the fleet as planner input, plan requests, deployments and their launch commands."""

import json

import pytest

from agents import protocol
from dashboard import deploy, tasks
from dashboard.choices import DeploymentState, PlanStatus
from dashboard.jobs import LaunchMembers, StopProcesses
from dashboard.models import Deployment, Node, PlanRequest
from placement import load_cluster
from tests.personas import seed_server, sim_node

pytestmark = pytest.mark.django_db


def planned(model_ref: str, **fields) -> PlanRequest:
    row = PlanRequest.objects.create(
        model_ref=model_ref, max_model_len=fields.pop("max_model_len", 10000), **fields
    )
    return deploy.run_plan_request(row.pk)


def test_it_builds_the_planner_cluster_from_what_the_agents_reported():
    seed_server()
    cluster = load_cluster(deploy.fleet_cluster())
    node = cluster.node("a30-seed")
    assert [g.index for g in node.gpus] == [0, 1, 2, 3]
    assert {node.link(a, b).label for a in range(4) for b in range(4) if a < b} == {"SYS"}


def test_it_plans_the_seed_model_without_tensor_parallelism_across_sys():
    seed_server()
    row = planned("Qwen3-VL-32B-Instruct")
    assert row.status == PlanStatus.DONE, row.error
    best = row.result["plans"][0]
    assert best["node"] == "a30-seed" and best["tp"] == 1 and best["pp"] >= 3
    rejected = {
        (r["backend"], r["tp"], r["pp"]): [p["code"] for p in r["problems"]] for r in row.result["rejected"]
    }
    assert (
        "memory" in rejected[("vllm", 1, 2)]
    )  # two GPUs cannot hold it, whatever the split (the seed's TP=2)
    assert "link" in rejected[("vllm", 4, 1)]  # TP across SYS without P2P


def test_it_records_a_clear_error_for_an_unknown_model():
    seed_server()
    row = planned("not-a-real-model-xyz")
    assert row.status == PlanStatus.FAILED and "not-a-real-model-xyz" in row.error


def test_it_records_a_clear_error_when_no_agent_reported_yet():
    row = planned("Qwen3-VL-32B-Instruct")
    assert row.status == PlanStatus.FAILED and "start an agent" in row.error


def test_it_runs_vllm_plans_on_simulated_nodes_with_the_simulated_backend(alice):
    seed_server()
    row = planned("Qwen3-VL-32B-Instruct", backend="vllm")
    deployment = deploy.create_deployment(row, 0, alice)
    launch = deployment.launch_command()
    assert launch.backend == "simulated" and launch.model == "Qwen3-VL-32B-Instruct"
    assert launch.options.sim_tokens_per_s == pytest.approx(row.result["plans"][0]["decode_tok_s"])
    assert launch.gpus == row.result["plans"][0]["gpus"]


def test_it_refuses_a_model_name_with_shell_characters(alice):
    seed_server()
    row = planned("Qwen3-VL-32B-Instruct")
    row.model_ref = "Qwen3-VL-32B-Instruct; rm -rf /"
    with pytest.raises(deploy.DeployError, match="cannot be sent"):
        deploy.create_deployment(row, 0, alice)
    assert not Deployment.objects.exists()


def test_it_refuses_a_plan_number_that_does_not_exist(alice):
    seed_server()
    row = planned("Qwen3-VL-32B-Instruct")
    with pytest.raises(deploy.DeployError, match="does not exist"):
        deploy.create_deployment(row, 99, alice)


def test_it_needs_an_explicit_override_for_busy_gpus(alice):
    seed_server()
    row = planned("Qwen3-VL-32B-Instruct")
    row.result["plans"][0]["risks"].append({"code": "busy", "message": "GPU 1 has 20 GiB in use"})
    with pytest.raises(deploy.DeployError, match="busy"):
        deploy.create_deployment(row, 0, alice)
    assert deploy.create_deployment(row, 0, alice, override_busy=True).override_busy


def test_it_sends_the_launch_once_however_often_the_task_runs(alice, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    sim_node("rtx4090-box", "sim:rtx4090x2")
    deployment = deploy.create_deployment(planned("Qwen2.5-7B-Instruct", max_model_len=4096), 0, alice)
    tasks.launch_deployment(deployment.pk)
    tasks.launch_deployment(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.LAUNCHING
    assert list(deployment.events.values_list("state", flat=True)) == ["launching"]


def test_it_tells_a_reconnecting_agent_what_should_be_running(alice):
    node = seed_server()
    deployment = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    assert deploy.desired_launches(node) == []
    deployment.move_to(DeploymentState.SERVING)
    frames = [json.loads(f) for f in deploy.desired_launches(node)]
    assert [(f["type"], f["deployment"]) for f in frames] == [
        ("canary", deployment.pk),
        ("launch", deployment.pk),
    ]
    assert protocol.parse_server_command(json.dumps(frames[0])).canary.enabled is True
    assert protocol.parse_server_command(json.dumps(frames[1])).backend == "simulated"


def test_it_applies_agent_reports_and_turns_counters_into_tokens_per_second(alice):
    seed_server()
    deployment = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    status = protocol.DeploymentStatus(
        type="deployment", v=1, seq=1, t=100.0, deployment=deployment.pk, state="ready", port=8123, pid=4242
    )
    deployment.apply_status(status)
    for t, tokens in ((100.0, 1000), (102.0, 1100)):
        deployment.record_metrics(
            t, protocol.ServerCounters(generation_tokens_total=tokens, requests_running=1)
        )
    deployment.refresh_from_db()
    assert (deployment.state, deployment.port, deployment.pid) == ("ready", 8123, 4242)
    assert deployment.tokens_per_s == pytest.approx(50.0)
    assert deployment.metrics.get().generation_tokens_per_s == pytest.approx(50.0)


def test_it_plans_without_tensor_parallelism_when_asked(alice):
    sim_node("h100-nvlink", "sim:h100x8,workload=idle")
    row = planned("Llama-3.1-70B-Instruct", max_model_len=8192, tp=1)
    assert row.status == PlanStatus.DONE, row.error
    assert {p["tp"] for p in row.result["plans"]} == {1}


def test_it_keeps_a_concurrent_change_when_the_state_moves(alice):
    """The launch task and the operator (or a test) may hold the same row: a state move writes only its columns."""
    seed_server()
    deployment = deploy.create_deployment(planned("Qwen3-VL-32B-Instruct"), 0, alice)
    Deployment.objects.filter(pk=deployment.pk).update(stall_window_s=5.0)
    deployment.move_to(DeploymentState.LAUNCHING, "launch sent")
    deployment.refresh_from_db()
    assert (deployment.state, deployment.stall_window_s) == ("launching", 5.0)


# ---- multi-node ------------------------------------------------------------------------------------------
def twin_boxes() -> list:
    nodes = [sim_node(name, "sim:rtx4090x2") for name in ("box-a", "box-b")]
    Node.objects.update(address="10.0.0.5")
    return nodes


def status(deployment_id: str, state: str, **fields) -> protocol.DeploymentStatus:
    return protocol.DeploymentStatus(
        type="deployment", v=1, seq=1, t=1.0, deployment=deployment_id, state=state, **fields
    )


def across_both(alice) -> Deployment:
    twin_boxes()
    row = planned("Qwen3-VL-32B-Instruct", backend="vllm", max_model_len=8192)
    assert "nodes" in row.result["plans"][0], row.result["plans"][0]
    return deploy.create_deployment(row, 0, alice)


def test_it_makes_a_head_launch_and_a_member_per_further_node(alice):
    deployment = across_both(alice)
    plan, head = deployment.plan, deployment.launch_command()
    (member,) = deployment.members.all()
    assert [deployment.node.name, member.node.name] == plan["nodes"] and member.rank == 1
    assert head.gpus == plan["gpus"][plan["nodes"][0]] and member.gpus == plan["gpus"][plan["nodes"][1]]
    o = head.options
    assert (o.nnodes, o.node_rank, o.master_addr, o.master_port) == (2, 0, "10.0.0.5", None)
    assert member.launch is None  # it waits for the head's rendezvous port


def test_it_launches_the_other_nodes_once_the_head_reports_its_port(alice, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    deployment = across_both(alice)
    deployment.apply_status(status(deployment.pk, "loading"))
    assert deploy.follow_head(deployment, status(deployment.pk, "loading")) == []  # no port yet
    deployment.apply_status(status(deployment.pk, "loading", dist_port=29517))
    assert deploy.follow_head(deployment, status(deployment.pk, "loading", dist_port=29517)) == [
        LaunchMembers(deployment.pk)
    ]
    assert tasks.launch_members(deployment.pk) == 1
    member = deployment.members.get()
    launch = protocol.Launch.model_validate(member.launch)
    assert (launch.options.node_rank, launch.options.master_port, member.state) == (1, 29517, "launching")
    assert tasks.launch_members(deployment.pk) == 0  # sent once, however often the task runs
    deployment.move_to(DeploymentState.SERVING)
    assert json.loads(deploy.desired_launches(member.node)[0]) == member.launch
    # it serves no API: it is up once the head that waits for it is
    assert (member.state, member.shown_state()) == ("launching", "serving")


def test_it_fails_the_deployment_when_another_node_fails_but_not_when_it_was_asked_to_stop(alice):
    deployment = across_both(alice)
    member = deployment.members.select_related("node").get()
    member.move_to(DeploymentState.STOPPING, "stopped for the restart")
    assert (
        deploy.apply_member_status(
            deployment, member, status(deployment.pk, "failed", exit_code=1, detail="peer lost")
        )
        == []
    )
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.PLANNED
    member.move_to(DeploymentState.LOADING)
    assert deploy.apply_member_status(
        deployment, member, status(deployment.pk, "failed", exit_code=-9, detail="SIGKILL")
    ) == [StopProcesses(deployment.pk)]
    deployment.refresh_from_db()
    assert (
        deployment.state == DeploymentState.FAILED
        and deployment.detail == "node box-b (rank 1) failed: SIGKILL"
    )
    deployment.apply_status(status(deployment.pk, "failed", exit_code=1, detail="NCCL error"))
    deployment.apply_status(status(deployment.pk, "stopped"))
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.FAILED
    assert deployment.detail == "node box-b (rank 1) failed: SIGKILL\n\nthe head: NCCL error"


def test_it_refuses_llama_cpp_rpc_across_real_nodes(alice):
    twin_boxes()
    Node.objects.update(simulated=False)
    row = planned("Qwen3-VL-32B-Instruct", backend="llama.cpp", max_model_len=8192)
    plan = next(i for i, p in enumerate(row.result["plans"]) if "nodes" in p)
    with pytest.raises(deploy.DeployError, match="rpc-server"):
        deploy.create_deployment(row, plan, alice)
    assert not Deployment.objects.exists()


def test_it_refuses_a_plan_over_simulated_and_real_nodes(alice):
    twin_boxes()
    Node.objects.filter(name="box-b").update(simulated=False)
    row = planned("Qwen3-VL-32B-Instruct", backend="vllm", max_model_len=8192)
    with pytest.raises(deploy.DeployError, match="mixes simulated and real"):
        deploy.create_deployment(row, 0, alice)


def test_it_does_not_launch_a_deployment_the_operator_stopped_before_the_task_ran(alice, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    sim_node("rtx4090-box", "sim:rtx4090x2")
    deployment = deploy.create_deployment(planned("Qwen2.5-7B-Instruct", max_model_len=4096), 0, alice)
    Deployment.objects.filter(pk=deployment.pk).update(desired="stopped")
    assert tasks.launch_deployment(deployment.pk) == DeploymentState.PLANNED
    assert not deployment.events.exists()


def test_it_records_every_state_an_agent_can_report_and_two_only_the_server_decides():
    recorded = {value for value, _ in DeploymentState.choices()}
    assert set(DeploymentState.REPORTED) <= recorded
    assert (
        recorded - set(DeploymentState.REPORTED)
        == set(DeploymentState.SERVER_ONLY)
        == {"planned", "stopping"}
    )

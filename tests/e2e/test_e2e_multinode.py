"""Multi-node deploy end to end: two simulated 2x RTX 4090 boxes, each with its own agent subprocess, the real
ASGI server, a real Celery worker and Redis. The model does not fit one box, so the top plan spans both: the
head launches first and reports its rendezvous port, then the other box is launched to join it over TCP."""

import contextlib
import json
import os
import signal

import httpx
import pytest

from dashboard.models import Deployment, DeploymentMember, Node
from tests.e2e.test_e2e_deploy import complete, deploy_plan, plan_through_the_form, state_of
from tests.harness import csrf_post, node_with_token, start_agent, wait_until

pytestmark = pytest.mark.slow
MODEL = "Qwen3-VL-32B-Instruct"  # ~62 GiB of bf16 weights: more than one box's 2 x 24 GiB


@pytest.fixture
def twin_boxes(live_stack, celery_worker, log_dir, tmp_path):
    nodes, agents = [], []
    for name in ("box-a", "box-b"):
        node, token = node_with_token(name)
        Node.objects.filter(pk=node.pk).update(address="127.0.0.1")  # set by the operator in the admin
        agents.append(
            start_agent(
                live_stack.url,
                token,
                "sim:rtx4090x2,workload=idle",
                log_dir,
                interval=0.5,
                run_dir=tmp_path / name,
            )
        )
        nodes.append(node)
    wait_until(lambda: all(n.gpus.count() == 2 for n in nodes), what="both agents' hello")
    yield nodes
    for agent in agents:
        agent.stop()
    for state in tmp_path.glob("box-*/*.json"):  # servers outlive their agents by design; end them here
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.killpg(json.loads(state.read_text()).get("pid"), signal.SIGKILL)


def plan_across_nodes(client: httpx.Client) -> tuple:
    row = plan_through_the_form(client, model=MODEL, max_model_len=8192, node="", backend="vllm")
    assert row.status == "done", row.error
    return row, row.plan(0)


def member_of(deployment: Deployment) -> DeploymentMember:
    return DeploymentMember.objects.select_related("node", "deployment").get(deployment=deployment)


def serving_across_both(client: httpx.Client) -> Deployment:
    row, plan = plan_across_nodes(client)
    assert plan.nodes == ["box-a", "box-b"] or plan.nodes == ["box-b", "box-a"], plan
    fragment = client.get(f"/deploy/plans/{row.pk}/fragment/").text
    where = " + ".join(f"{name} GPUs {','.join(map(str, gpus))}" for name, gpus in plan.placements())
    assert where in fragment and "2 nodes" in fragment  # the plan names every node, each with its grid
    assert all(f'data-node="{name}"' in fragment for name in plan.nodes)
    deployment = deploy_plan(client, row)
    wait_until(lambda: state_of(deployment) in ("ready", "serving", "failed"), timeout=60, what="head ready")
    assert deployment.state != "failed", deployment.detail
    wait_until(lambda: member_of(deployment).pid, timeout=20, what="the other node's process")
    return deployment


def test_it_launches_a_plan_on_both_nodes_head_first_and_serves(operator, twin_boxes):
    deployment = serving_across_both(operator)
    member = member_of(deployment)
    launch = member.launch["options"]
    assert (launch["nnodes"], launch["node_rank"], launch["master_addr"]) == (2, 1, "127.0.0.1")
    assert launch["master_port"] == deployment.dist_port and member.node != deployment.node
    events = list(deployment.events.order_by("t", "pk").values_list("detail", flat=True))
    head_sent = next(
        i for i, d in enumerate(events) if d.startswith(f"launch sent to {deployment.node.name}")
    )
    member_sent = next(i for i, d in enumerate(events) if f"launch sent to {member.node.name}" in d)
    assert head_sent < member_sent  # the head first: the other node needs its port
    assert complete(deployment.port)["usage"]["completion_tokens"] == 16
    wait_until(lambda: state_of(deployment) == "serving", timeout=30, what="serving")
    assert member_of(deployment).shown_state() == "serving"
    page = operator.get(deployment.get_absolute_url()).text
    assert 'id="members"' in page and member.node.name in page and "world_size=4" in page


def test_it_fails_the_deployment_and_stops_the_head_when_another_node_dies(operator, twin_boxes):
    deployment = serving_across_both(operator)
    member = member_of(deployment)
    os.kill(member.pid, signal.SIGKILL)
    # The head may notice first (its peer's socket closes): either way the detail ends up naming the node.
    wait_until(
        lambda: state_of(deployment) == "failed" and member.node.name in deployment.detail,
        timeout=10,
        what="deployment failed, naming the node",
    )
    assert (
        deployment.detail.startswith(f"node {member.node.name} (rank 1) failed: ")
        and "SIGKILL" in deployment.detail
    )
    member.refresh_from_db()
    assert member.state == "failed" and member.exit_code == -9
    head_pid = deployment.pid
    wait_until(lambda: not _alive(head_pid), timeout=15, what="the head to be taken down")
    assert state_of(deployment) == "failed"  # the head's own end does not hide why


def test_it_stops_and_restarts_every_node(operator, twin_boxes):
    deployment = serving_across_both(operator)
    first_head, first_member, first_port = deployment.pid, member_of(deployment).pid, deployment.dist_port
    csrf_post(operator, f"/deployments/{deployment.pk}/restart/")
    wait_until(
        lambda: state_of(deployment) in ("ready", "serving") and deployment.pid != first_head,
        timeout=60,
        what="head restarted",
    )
    wait_until(
        lambda: member_of(deployment).pid not in (None, first_member) and _alive(member_of(deployment).pid),
        timeout=30,
        what="the other node relaunched",
    )
    assert deployment.dist_port != first_port and not _alive(first_member)
    assert complete(deployment.port)["usage"]["completion_tokens"] == 16
    pids = (deployment.pid, member_of(deployment).pid)
    csrf_post(operator, f"/deployments/{deployment.pk}/stop/")
    wait_until(lambda: state_of(deployment) == "stopped", timeout=30, what="stopped")
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=15, what="every process gone")


def test_it_refuses_a_multi_node_plan_when_the_head_has_no_address(operator, twin_boxes):
    Node.objects.update(address="", hostname="")
    row, plan = plan_across_nodes(operator)
    response = csrf_post(operator, f"/deploy/plans/{row.pk}/0/deploy/")
    assert response.status_code == 302 and f"/deploy/plans/{row.pk}" in response.headers["location"]
    assert "no address" in operator.get(response.headers["location"]).text
    assert not Deployment.objects.exists()


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

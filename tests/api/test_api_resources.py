"""The API's resources give what the pages give (the same functions), with the form's rules and messages."""

from __future__ import annotations

import contextlib
import io
import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboard import deploy, fleet, roles
from dashboard.forms import DeployForm
from dashboard.ingest import apply_hello
from dashboard.models import AgentToken, Alert, Deployment, GpuSample, Node, PlanRequest
from placement import cli
from tests.api.conftest import MODEL, World, add_samples
from tests.personas import hello_for, sim_node

pytestmark = pytest.mark.django_db


def post(client: Client, url: str, body: dict | None = None):
    return client.post(url, json.dumps(body or {}), content_type="application/json")


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [n["name"] for n in response.json()["items"]]


# ---- nodes ---------------------------------------------------------------------------------------------------
@pytest.fixture
def h100(world: World) -> Node:
    node = sim_node("h100-nvlink", "sim:h100x8")
    Node.objects.filter(name="a30-seed").update(interval_s=3600)  # online for this test however slow it runs
    Node.objects.filter(pk=node.pk).update(last_seen=timezone.now() - timedelta(minutes=5))
    return node


def test_it_filters_nodes_by_name_gpu_model_simulated_and_state(world, h100):
    c = world.client(roles.VIEWER, "read")
    assert names(c.get("/api/v1/nodes/")) == ["a30-seed", "h100-nvlink"]
    assert names(c.get("/api/v1/nodes/?gpu_model=H100")) == ["h100-nvlink"]
    assert names(c.get("/api/v1/nodes/?name=seed")) == ["a30-seed"]
    assert names(c.get("/api/v1/nodes/?simulated=false")) == []
    assert names(c.get("/api/v1/nodes/?stale=true")) == ["h100-nvlink"]
    assert names(c.get("/api/v1/nodes/?stale=false")) == ["a30-seed"]
    assert names(c.get("/api/v1/nodes/?state=online")) == ["a30-seed"]
    refused = c.get("/api/v1/nodes/?state=sideways").json()["error"]
    assert refused == {"code": "invalid", "message": refused["message"], "field": "state"}
    assert "online" in refused["message"]


def test_it_pages_lists(world, h100):
    c = world.client(roles.VIEWER, "read")
    page = c.get("/api/v1/nodes/?limit=1&offset=1").json()
    assert page["count"] == 2 and [n["name"] for n in page["items"]] == ["h100-nvlink"]
    assert c.get("/api/v1/nodes/?limit=0").json()["error"]["field"] == "limit"
    assert c.get("/api/v1/nodes/?limit=201").json()["error"]["field"] == "limit"
    assert c.get("/api/v1/alerts/").json()["count"] == 1


def test_it_shows_a_node_with_its_topology_and_newest_samples(world):
    body = world.client(roles.VIEWER, "read").get("/api/v1/nodes/a30-seed/").json()
    assert [g["index"] for g in body["gpus"]] == [0, 1, 2, 3]
    newest = GpuSample.objects.filter(gpu__node=world.node, gpu__index=0).order_by("-t").first()
    assert body["gpus"][0]["latest"]["util"] == newest.util_gpu == 50.0
    assert body["gpus"][0]["latest"]["sm_clock_mhz"] == 1400.0
    links = {(x["a"], x["b"]): x for x in body["topology"]["links"]}
    assert links[("GPU0", "GPU1")]["link"] == "SYS"  # the field report's server: every pair through the CPU
    assert body["topology"]["grid"] == json.loads(json.dumps(fleet.topology_grid(world.node)))


def test_it_gives_the_charts_history_thinned_to_the_step(world):
    c = world.client(roles.VIEWER, "read")
    full = c.get("/api/v1/nodes/a30-seed/history/?minutes=5").json()
    assert full == json.loads(json.dumps(fleet.gpu_history(world.node, minutes=5)))
    gpu0 = str(world.node.gpus.get(index=0).pk)
    thinned = c.get("/api/v1/nodes/a30-seed/history/?minutes=5&step=60&gpus=0").json()
    assert list(thinned["gpus"]) == [gpu0]
    points = thinned["gpus"][gpu0]
    assert 1 <= len(points) <= 2  # six samples a second apart fall in one or two minute windows
    utils = [p[1] for p in full["gpus"][gpu0]]
    assert sum(p[1] for p in points) / len(points) == pytest.approx(sum(utils) / len(utils), abs=30)
    assert c.get("/api/v1/nodes/a30-seed/history/?step=0.5").json()["error"]["field"] == "step"


# ---- plans and check -----------------------------------------------------------------------------------------
BAD_REQUESTS = [
    {"model": MODEL, "gpus": "0;1"},
    {"model": MODEL, "max_model_len": 5},
    {"model": MODEL, "concurrency": 0},
    {"model": MODEL, "tp": 65},
    {"model": MODEL, "node": "no-such-node"},
    {"model": MODEL, "backend": "tensorrt"},
    {"model": ""},
    {"model": "", "config": {"hidden_size": 10, "torch_dtype": float("nan")}},
]


@pytest.mark.parametrize(
    "fields", BAD_REQUESTS, ids=lambda f: ",".join(f"{k}" for k in f if k != "model") or "no model"
)
def test_it_refuses_a_bad_plan_request_with_the_forms_own_message(world, fields):
    data = {
        "max_model_len": 8192,
        "concurrency": 1,
        "node": "",
        "backend": "",
        "gpus": "",
        "tp": "",
        **fields,
    }
    form = DeployForm({k: v for k, v in data.items() if k != "config"})
    assert not form.is_valid() or "config" in fields
    response = post(world.client(roles.OPERATOR), "/api/v1/plans/", fields)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    if "config" in fields:  # the upload's own check: NaN is no JSON number (the database refuses it)
        assert error["field"] == "config" and error["message"].startswith("config.json is not valid JSON")
    else:
        field, messages = next(iter(form.errors.items()))
        assert error == {
            "code": "invalid",
            "message": " ".join(messages),
            "field": None if field == "__all__" else field,
        }
    assert PlanRequest.objects.count() == 1 and not world.queued


def test_it_queues_a_plan_and_gives_its_outcome(world):
    response = post(world.client(roles.OPERATOR), "/api/v1/plans/", {"model": MODEL, "max_model_len": 10000})
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["status"] == "queued" and world.queued == [("plan_request", accepted["id"])]
    deploy.run_plan_request(accepted["id"])  # what the queued task runs
    outcome = world.client(roles.VIEWER, "read").get(accepted["url"]).json()
    row = PlanRequest.objects.get(pk=accepted["id"])
    assert outcome["status"] == "done" and outcome["model"] == MODEL
    assert [p["plan"] for p in outcome["plans"]] == [p.to_json() for p in row.plans()]
    assert [p["number"] for p in outcome["plans"]] == list(range(len(row.plans())))
    assert outcome["rejected"] and all(r["problems"] for r in outcome["rejected"])


def test_it_lists_a_node_without_a_topology_among_the_rejected_of_a_plan(world):
    no_topo = Node.objects.create(name="no-topo")
    apply_hello(no_topo, hello_for("no-topo", "sim:a30x4").model_copy(update={"topology": None}))
    response = post(world.client(roles.OPERATOR), "/api/v1/plans/", {"model": MODEL, "max_model_len": 10000})
    deploy.run_plan_request(response.json()["id"])  # what the queued task runs
    outcome = world.client(roles.VIEWER, "read").get(response.json()["url"]).json()
    assert outcome["status"] == "done" and {p["plan"]["node"] for p in outcome["plans"]} == {"a30-seed"}
    left_out = [r for r in outcome["rejected"] if r["node"] == "no-topo"]
    assert len(left_out) == 1 and "no topology reported yet" in left_out[0]["problems"][0]["message"]


def test_it_plans_from_an_uploaded_config(world):
    config = {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "vocab_size": 32000}
    response = post(world.client(roles.OPERATOR), "/api/v1/plans/", {"config": config, "max_model_len": 4096})
    assert response.status_code == 202, response.content
    assert PlanRequest.objects.get(pk=response.json()["id"]).config == config


def unknown_release(result: dict) -> dict:
    """The result with the reason why no vLLM release was known left out."""
    return json.loads(re.sub(r"vLLM release unknown \([^()]*\)", "vLLM release unknown", json.dumps(result)))


def test_it_checks_a_launch_command_as_the_command_line_does(world, tmp_path):
    command = ["vllm", "serve", MODEL, "--tensor-parallel-size", "4", "--max-model-len", "8192"]
    response = post(world.client(roles.OPERATOR), "/api/v1/check/", {"command": command, "node": "a30-seed"})
    assert response.status_code == 200, response.content
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(deploy.fleet_cluster()))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main(
            [
                "check",
                "--cluster",
                str(cluster),
                "--node",
                "a30-seed",
                "--visible",
                "",
                "--json",
                "--",
                *command,
            ]
        )
    said = json.loads(printed.getvalue())
    # The same judgement; only why no vLLM release was assumed differs (the server asked the node's agent).
    assert "vLLM release unknown (a30-seed's agent reported no vLLM version)" in response.content.decode()
    assert unknown_release(response.json()) == unknown_release(
        {**said, "suggestion_same_backend": said.get("suggestion_same_backend")}
    )
    assert response.json()["risks"]  # TP over SYS without P2P is the field report's hang


def test_it_never_reads_a_server_file_named_in_a_checked_command(world):
    response = post(
        world.client(roles.OPERATOR),
        "/api/v1/check/",
        {"command": "vllm serve /etc --tensor-parallel-size 2"},
    )
    assert response.status_code == 422
    assert "model directories" in response.json()["error"]["message"]


# ---- deployments ---------------------------------------------------------------------------------------------
def test_it_refuses_busy_gpus_without_the_override_as_the_form_does(world):
    GpuSample.objects.all().delete()
    add_samples(world.node, used_mib=4000.0)  # something else holds 4 GB on every GPU
    busy = deploy.run_plan_request(PlanRequest.objects.create(model_ref=MODEL, max_model_len=10000).pk)
    number = next(i for i, p in enumerate(busy.plans()) if p.needs_override)
    c = world.client(roles.OPERATOR)
    refused = post(c, "/api/v1/deployments/", {"plan_request": busy.pk, "number": number})
    assert refused.status_code == 409
    with pytest.raises(deploy.DeployError) as form_says:
        deploy.create_deployment(busy, number, world.people[roles.OPERATOR])
    assert refused.json()["error"]["message"] == str(form_says.value)
    assert Deployment.objects.count() == 1 and not world.queued
    taken = post(
        c, "/api/v1/deployments/", {"plan_request": busy.pk, "number": number, "override_busy": True}
    )
    assert taken.status_code == 202 and taken.json()["override_busy"] is True
    assert world.queued == [("launch_deployment", taken.json()["id"])]


def test_it_shows_a_deployment_with_its_lifecycle_and_measurements(world):
    d = world.deployment
    d.move_to("serving", "up", port=8001)
    Deployment.objects.filter(pk=d.pk).update(tokens_per_s=42.5, last_counters={"requests_running": 3})
    body = world.client(roles.VIEWER, "read").get(f"/api/v1/deployments/{d.pk}/").json()
    assert body["state"] == "serving" and body["tokens_per_s"] == 42.5 and body["requests_running"] == 3
    assert [e["state"] for e in body["events"]] == ["serving"] and body["gpus"] == d.launch["gpus"]
    assert body["node"] == "a30-seed" and body["backend"] == "simulated"


def test_it_deletes_only_a_deployment_that_runs_nowhere(world):
    world.deployment.move_to("serving", "up")
    refused = world.client(roles.OPERATOR).delete(f"/api/v1/deployments/{world.deployment.pk}/")
    assert refused.status_code == 409 and "stop it first" in refused.json()["error"]["message"]
    assert Deployment.objects.filter(pk=world.deployment.pk).exists()


def test_it_refuses_an_unknown_deployment_action(world):
    response = post(world.client(roles.OPERATOR), f"/api/v1/deployments/{world.deployment.pk}/explode/")
    assert response.status_code == 404 and not world.queued
    assert response.json()["error"]["code"] == "not_found"


# ---- alerts --------------------------------------------------------------------------------------------------
def test_it_filters_alerts_and_acknowledges_once(world):
    c = world.client(roles.OPERATOR)
    assert [a["id"] for a in c.get("/api/v1/alerts/?status=open&kind=stall").json()["items"]] == [
        world.alert.pk
    ]
    assert c.get("/api/v1/alerts/?kind=xid").json()["count"] == 0
    detail = c.get(f"/api/v1/alerts/{world.alert.pk}/").json()
    assert detail["evidence"] == {"log": ["a line"]} and detail["deployment"] == world.deployment.pk
    first = post(c, f"/api/v1/alerts/{world.alert.pk}/acknowledge/")
    assert first.status_code == 200 and first.json()["acknowledged_by"] == roles.OPERATOR
    again = post(c, f"/api/v1/alerts/{world.alert.pk}/acknowledge/")
    assert again.status_code == 409 and "acknowledged already" in again.json()["error"]["message"]
    assert Alert.objects.get(pk=world.alert.pk).events.count() == 2  # opened, acknowledged


# ---- agent tokens and errors ---------------------------------------------------------------------------------
def test_it_issues_an_agent_token_once_and_revokes_it(world):
    c = world.client(roles.ADMIN)
    issued = post(c, "/api/v1/agent-tokens/", {"node": "gpu-node-1"}).json()
    assert AgentToken.authenticate(issued["token"]).name == "gpu-node-1"
    listed = c.get("/api/v1/agent-tokens/?node=gpu-node-1").json()["items"]
    assert [t["id"] for t in listed] == [issued["id"]] and "token" not in listed[0]
    assert issued["token"] not in json.dumps(c.get("/api/v1/agent-tokens/").json())
    post(c, f"/api/v1/agent-tokens/{issued['id']}/revoke/")
    assert AgentToken.authenticate(issued["token"]) is None


def test_it_answers_a_body_that_is_not_json_in_the_one_error_shape(world):
    c = world.client(roles.OPERATOR)
    response = c.post("/api/v1/plans/", "{not json", content_type="application/json")
    assert response.status_code in (400, 422)
    assert set(response.json()["error"]) == {"code", "message", "field"}
    assert PlanRequest.objects.count() == 1


def test_it_plans_with_the_non_torch_memory_of_the_vllm_release_asked_for(world):
    """Issue #14 item 1.6: the deploy form's and the API's vLLM version selects what that release's profiler
    counts as non-torch memory (0.7.x: 0.16 GiB at TP1); no version keeps the pessimistic 0.35 GiB."""
    outcomes = {}
    for version in ("0.7.3", ""):
        fields = {"model": "Qwen/Qwen3-8B", "max_model_len": 4096, "backend": "vllm", "tp": 1}
        response = post(
            world.client(roles.OPERATOR), "/api/v1/plans/", {**fields, "backend_version": version}
        )
        assert response.status_code == 202, response.content
        deploy.run_plan_request(response.json()["id"])
        outcomes[version] = world.client(roles.VIEWER, "read").get(response.json()["url"]).json()
    assert outcomes["0.7.3"]["backend_version"] == "0.7.3"
    breakdowns = {v: o["plans"][0]["plan"]["breakdown"][0] for v, o in outcomes.items()}
    assert (breakdowns["0.7.3"]["non_torch_gib"], breakdowns[""]["non_torch_gib"]) == (0.16, 0.35)
    assert breakdowns["0.7.3"]["kv_tokens"] > breakdowns[""]["kv_tokens"]
    bad = post(world.client(roles.OPERATOR), "/api/v1/plans/", {"model": MODEL, "backend_version": "latest"})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "backend_version"
    assert bad.json()["error"]["message"] == "backend version must look like 0.8.3, got 'latest'"

"""Issue #14 item 1.7, second half, server side: the models an agent reports are stored from its hello,
listed for the API (`reported_models`), offered by name in the deploy form and planned from the config keys
the agent sent, for a checkpoint the server itself cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from agents import protocol
from agents.inventory import scan_model_dirs
from dashboard import deploy, tasks
from dashboard.choices import PlanStatus
from dashboard.ingest import apply_hello
from dashboard.models import ApiToken, Node, NodeModel, PlanRequest
from dashboard.node_models import model_options, reported_models
from tests.agents.test_inventory import gguf_file, hf_folder
from tests.dashboard.test_deploy import planned
from tests.personas import hello_for, operator

pytestmark = pytest.mark.django_db


def node_reporting(name: str, spec: str, models: list[protocol.LocalModel]) -> Node:
    node = Node.objects.create(name=name)
    apply_hello(node, hello_for(name, spec).model_copy(update={"models": models}))
    return node


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    hf_folder(tmp_path, "gemma-2-9b-it", weights=2048)
    gguf_file(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    return tmp_path


def test_it_stores_the_reported_models_and_lists_them_for_the_api(model_dir: Path) -> None:
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    listed = reported_models()
    assert [(m["name"], m["node"], m["format"], m["plannable"]) for m in listed] == [
        ("Qwen3 8B", "h100-box", "gguf", True),  # its file name matches the catalog's Qwen3-8B
        ("gemma-2-9b-it", "h100-box", "hf", True),
    ]
    gemma = listed[1]
    assert gemma["path"] == str(model_dir / "gemma-2-9b-it") and gemma["size_bytes"] == 2048
    assert reported_models(node="other") == []


def test_it_replaces_a_nodes_models_on_its_next_hello(model_dir: Path) -> None:
    node = node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    apply_hello(node, hello_for("h100-box", "sim:h100x8").model_copy(update={"boot_id": "boot-second"}))
    assert NodeModel.objects.count() == 0


def test_it_plans_a_reported_checkpoint_the_server_cannot_read(model_dir: Path, settings) -> None:
    settings.MODEL_DIRS = []
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    row = planned(str(model_dir / "gemma-2-9b-it"), max_model_len=8192)
    assert row.status == PlanStatus.DONE, row.error
    assert row.result["model"]["name"] == "gemma-2-9b-it" and row.result["model"]["layers"] == 42
    assert "reported by h100-box's agent" in row.result["model"]["source"]
    assert str(model_dir / "gemma-2-9b-it") in row.result["plans"][0]["command"]


def test_it_offers_reported_models_by_name_in_the_deploy_form(model_dir: Path, client) -> None:
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    assert model_options()[0][1].startswith("Qwen3 8B on h100-box (gguf, qwen3, Q4_K_M, 8B")
    client.force_login(operator())
    page = client.get("/deploy/").content.decode()
    assert 'list="model-options"' in page
    assert f'<option value="{model_dir / "gemma-2-9b-it"}">gemma-2-9b-it on h100-box (hf' in page
    assert '<option value="Qwen3-8B">built-in catalog</option>' in page


@pytest.fixture
def queued(monkeypatch) -> list[int]:
    """Plan requests the form or the API queued (run by the test as the worker would)."""
    ids: list[int] = []
    monkeypatch.setattr(tasks.plan_request, "delay", ids.append)
    return ids


def plan_from_the_form(client, queued: list[int], **fields) -> PlanRequest:
    data = {"max_model_len": 8192, "concurrency": 1, **fields}
    response = client.post("/deploy/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    return deploy.run_plan_request(queued[-1])


def nodes_of(plan: dict) -> set[str]:
    return {*(plan.get("nodes") or [plan["node"]]), *plan.get("equivalent_nodes", [])}


def test_it_plans_a_reported_only_model_on_the_nodes_that_have_its_files(model_dir, settings, client, queued):
    """gemma-2-9b-it is on h100-box only; h100-other is the same hardware with no copy, so without the pin the
    plan would list it as an equivalent node and a launch there would not find the files."""
    settings.MODEL_DIRS = []
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    node_reporting("h100-other", "sim:h100x8", [])
    path = str(model_dir / "gemma-2-9b-it")
    client.force_login(operator())
    row = plan_from_the_form(client, queued, model=path)
    assert row.status == PlanStatus.DONE, row.error
    assert row.result["plans"] and all(nodes_of(p) == {"h100-box"} for p in row.result["plans"])
    catalog_row = plan_from_the_form(client, queued, model="gemma-2-9b-it")  # any node can download it
    assert {"h100-box", "h100-other"} <= set().union(*map(nodes_of, catalog_row.result["plans"]))


def test_it_refuses_a_reported_model_on_a_node_without_its_files(model_dir, settings, client, queued):
    settings.MODEL_DIRS = []
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    other = node_reporting("h100-other", "sim:h100x8", [])
    path = str(model_dir / "gemma-2-9b-it")
    user = operator()
    client.force_login(user)
    row = plan_from_the_form(client, queued, model=path, node=other.name)
    assert row.status == PlanStatus.FAILED
    assert row.error.startswith(
        f"{path} is only on h100-box (as their agents reported); node h100-other has no"
    )
    token = ApiToken.issue(user, "api", "operate", 30)[1]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"model": path, "max_model_len": 8192, "node": "h100-other"}
    response = api.post("/api/v1/plans/", json.dumps(body), content_type="application/json")
    assert response.status_code == 202, response.content
    deploy.run_plan_request(queued[-1])
    outcome = api.get(response.json()["url"]).json()
    assert (outcome["status"], outcome["error"]) == ("failed", row.error)

"""Issue #14 leftovers, server side: the engine versions an agent reports are stored on its node, shown on the node
page and in the API, and the planner takes the node's vLLM release when the request names none (saying which and
from where); a `check` of a command naming a reported model path judges only the nodes that hold it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from agents import protocol
from agents.inventory import scan_model_dirs
from dashboard import deploy
from dashboard.choices import PlanStatus
from dashboard.ingest import apply_hello
from dashboard.models import ApiToken, Node
from placement import PlacementError
from tests.agents.test_inventory import hf_folder
from tests.dashboard.test_deploy import planned
from tests.personas import hello_for, operator, viewer

pytestmark = pytest.mark.django_db


def engines(**versions: str | None) -> list[protocol.EngineVersion]:
    return [
        protocol.EngineVersion(
            backend=name.replace("_", "."), version=v, detail="" if v else "`ollama --version` timed out"
        )
        for name, v in versions.items()
    ]


def node_with(name: str, found: list[protocol.EngineVersion], models: list | None = None) -> Node:
    node = Node.objects.get_or_create(name=name)[0]
    hello = hello_for(name, "sim:h100x8").model_copy(update={"engines": found, "models": models or []})
    apply_hello(node, hello)
    node.refresh_from_db()
    return node


def api_client(role_user) -> Client:
    token = ApiToken.issue(role_user, "api", "operate", 30)[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def test_it_stores_the_reported_engines_and_shows_them_on_the_page_and_in_the_api(client) -> None:
    node = node_with("h100-box", engines(vllm="0.7.3", llama_cpp="b4567", ollama=None))
    assert node.engines == [
        {"backend": "vllm", "version": "0.7.3", "detail": ""},
        {"backend": "llama.cpp", "version": "b4567", "detail": ""},
        {"backend": "ollama", "version": None, "detail": "`ollama --version` timed out"},
    ]
    client.force_login(viewer())
    page = client.get("/nodes/h100-box/").content.decode()
    line = page[page.index('id="engines"') : page.index("</p>", page.index('id="engines"'))]
    assert "vllm 0.7.3" in line and "llama.cpp b4567" in line
    assert "ollama version unknown <small>(`ollama --version` timed out)</small>" in line
    body = api_client(operator()).get("/api/v1/nodes/h100-box/").json()
    assert body["engines"] == node.engines


def test_it_keeps_a_newer_hellos_engines_and_none_from_an_older_agent(client) -> None:
    node_with("h100-box", engines(vllm="0.7.3"))
    node = node_with("h100-box", engines(vllm="0.8.5"))
    assert node.engines[0]["version"] == "0.8.5"
    old_agent = hello_for("h100-box", "sim:h100x8").model_copy(update={"boot_id": "boot-older"})
    apply_hello(node, protocol.parse_agent_message(protocol.dump(old_agent)))
    node.refresh_from_db()
    assert node.engines == []
    client.force_login(viewer())
    assert "none reported" in client.get("/nodes/h100-box/").content.decode()


def vllm_note(row) -> str:
    assert row.status == PlanStatus.DONE, row.error
    notes = row.result["plans"][0]["performance"]["assumes"]
    [note] = [n for n in notes if n.startswith("vLLM ")]
    return note


def kv_tokens(row) -> int:
    return row.result["plans"][0]["kv_cache_tokens"]


def test_the_planner_defaults_to_the_vllm_release_the_node_reported() -> None:
    node_with("h100-box", engines(vllm="0.7.3"))
    reported = planned("Llama-3.1-8B-Instruct", max_model_len=8192, backend="vllm", gpus="0")
    assert vllm_note(reported).startswith("vLLM 0.7.3 (reported by h100-box's agent): non-torch memory 0.16")
    given = planned(
        "Llama-3.1-8B-Instruct", max_model_len=8192, backend="vllm", gpus="0", backend_version="0.7.3"
    )
    assert vllm_note(given).startswith("vLLM 0.7.3 (given with the request)")
    assert kv_tokens(reported) == kv_tokens(given)
    # The request's own version wins over the node's: 0.6.5 counts 1.79 GiB of non-torch memory, not 0.16.
    older = planned(
        "Llama-3.1-8B-Instruct", max_model_len=8192, backend="vllm", gpus="0", backend_version="0.6.5"
    )
    assert vllm_note(older).startswith("vLLM 0.6.5 (given with the request)")
    assert kv_tokens(older) < kv_tokens(reported)


def test_the_planner_says_why_it_took_no_reported_version() -> None:
    node_with("h100-a", engines(vllm="0.7.3"))
    node_with("h100-b", engines(vllm="0.6.5", sglang="0.4.6"))
    mixed = planned("Llama-3.1-8B-Instruct", max_model_len=8192, backend="vllm")
    assert vllm_note(mixed).startswith(
        "vLLM release unknown (the nodes' agents report different vLLM versions (0.6.5 on h100-b; 0.7.3 on "
        "h100-a): pick one for the plan): non-torch memory at the pessimistic 0.35 GiB"
    )
    pinned = Node.objects.get(name="h100-b")
    row = planned("Llama-3.1-8B-Instruct", max_model_len=8192, backend="vllm", node=pinned)
    assert vllm_note(row).startswith("vLLM 0.6.5 (reported by h100-b's agent)")
    node_with("h100-a", engines(ollama="0.5.7"))
    node_with("h100-b", [])
    none = planned("Llama-3.1-8B-Instruct", max_model_len=8192, backend="vllm")
    assert "vLLM release unknown (no node's agent reported a vLLM version)" in vllm_note(none)


# ---- check: a reported model path is judged only on the nodes that hold it -------------------------------


@pytest.fixture
def two_nodes(tmp_path: Path, settings) -> str:
    """gemma-2-9b-it's files on h100-box only (reported by its agent); h100-other is the same hardware."""
    settings.MODEL_DIRS = []
    hf_folder(tmp_path, "gemma-2-9b-it", weights=2048)
    node_with("h100-box", engines(vllm="0.7.3"), scan_model_dirs([tmp_path]))
    node_with("h100-other", engines(vllm="0.6.5"))
    return str(tmp_path / "gemma-2-9b-it")


def test_check_judges_a_reported_path_on_the_node_that_holds_it(two_nodes: str) -> None:
    result = deploy.check_launch(f"vllm serve {two_nodes} --max-model-len 8192", None, None, None)
    assert result["node"] == "h100-box" and result["feasible"], result["problems"]
    assert result["kv_cache_tokens"] > 0  # planned from the config h100-box reported (MODEL_DIRS is empty)
    suggestion = result["suggestion"]
    assert suggestion["node"] == "h100-box" and two_nodes in suggestion["command"]
    assert "h100-other" not in suggestion.get("equivalent_nodes", [])
    assert any(n.startswith("vLLM 0.7.3 (reported by h100-box's agent)") for n in result["assumes"])


def test_check_refuses_a_reported_path_on_a_node_without_it(two_nodes: str) -> None:
    with pytest.raises(PlacementError) as refused:
        deploy.check_launch(f"vllm serve {two_nodes}", "h100-other", None, None)
    assert str(refused.value).startswith(
        f"{two_nodes} is only on h100-box (as their agents reported); node h100-other has no copy"
    )
    response = api_client(operator()).post(
        "/api/v1/check/",
        json.dumps({"command": f"vllm serve {two_nodes}", "node": "h100-other"}),
        content_type="application/json",
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"] == str(refused.value)


def test_check_of_a_catalog_name_still_uses_every_node_with_its_vllm_release(two_nodes: str) -> None:
    result = deploy.check_launch("vllm serve gemma-2-9b-it --max-model-len 8192", "h100-other", None, None)
    assert result["node"] == "h100-other"
    assert any(n.startswith("vLLM 0.6.5 (reported by h100-other's agent)") for n in result["assumes"])

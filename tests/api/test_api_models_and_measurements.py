"""Issue #14: the models the deploy form offers (/api/v1/models/, item 1.7) and predicted against measured with
the Measure runs in a deployment's detail (part 2), from the same functions as the deploy form and the page."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from agents.inventory import scan_model_dirs
from dashboard import calibration, roles
from dashboard.forms import DeployForm
from dashboard.models import Deployment, DeploymentLoadTest
from dashboard.models.deployments import SHOWN_LOAD_TESTS
from tests.agents.test_inventory import gguf_file, hf_folder
from tests.api.conftest import World, add_load_test
from tests.dashboard.test_fleet_calibration import feed_counters, store_log
from tests.dashboard.test_node_models import node_reporting
from tests.fixtures import fixture_files, read_fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    hf_folder(tmp_path, "gemma-2-9b-it", weights=2048)
    gguf_file(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    return tmp_path


def every_item(client: Client, url: str) -> list[dict]:
    items: list[dict] = []
    while True:
        page = client.get(f"{url}{'&' if '?' in url else '?'}limit=50&offset={len(items)}")
        assert page.status_code == 200, page.content
        items += page.json()["items"]
        if len(items) >= page.json()["count"]:
            return items


# ---- models --------------------------------------------------------------------------------------------------
def test_it_lists_the_models_the_deploy_form_offers_in_its_order(world: World, model_dir: Path) -> None:
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    items = every_item(world.client(roles.VIEWER, "read"), "/api/v1/models/")
    assert [m["value"] for m in items] == [value for value, _ in DeployForm().model_options]
    by_value = {m["value"]: m for m in items}
    gguf = by_value[str(model_dir / "Qwen3-8B-Q4_K_M.gguf")]
    assert (gguf["name"], gguf["node"], gguf["source"], gguf["format"]) == (
        "Qwen3 8B",
        "h100-box",
        "reported",
        "gguf",
    )
    assert (gguf["architecture"], gguf["quantization"], gguf["size_label"]) == ("qwen3", "Q4_K_M", "8B")
    assert gguf["size_bytes"] == (model_dir / "Qwen3-8B-Q4_K_M.gguf").stat().st_size and gguf["plannable"]
    catalog = by_value["Qwen3-8B"]
    assert (catalog["source"], catalog["node"], catalog["plannable"]) == ("catalog", None, True)


def test_it_filters_the_models_by_node(world: World, model_dir: Path) -> None:
    node_reporting("h100-box", "sim:h100x8", scan_model_dirs([model_dir]))
    c = world.client(roles.VIEWER, "read")
    on_box = c.get("/api/v1/models/?node=h100-box").json()["items"]
    assert [(m["name"], m["node"]) for m in on_box] == [
        ("Qwen3 8B", "h100-box"),
        ("gemma-2-9b-it", "h100-box"),
    ]
    on_seed = c.get("/api/v1/models/?node=a30-seed").json()["items"]
    assert [(m["name"], m["path"]) for m in on_seed] == [("Qwen3 8B", "/models/Qwen3-8B-Q4_K_M.gguf")]


def test_it_refuses_an_unknown_node_filter_naming_it(world: World) -> None:
    response = world.client(roles.VIEWER, "read").get("/api/v1/models/?node=nowhere")
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "not_found",
        "message": "no node named 'nowhere'",
        "field": "node",
    }


def test_it_needs_a_login_for_the_models(world: World) -> None:
    assert Client().get("/api/v1/models/").status_code == 401


# ---- deployment detail: predicted against measured, Measure runs ------------------------------------------------
def detail(world: World) -> dict:
    response = world.client(roles.VIEWER, "read").get(f"/api/v1/deployments/{world.deployment.pk}/")
    assert response.status_code == 200, response.content
    return response.json()


def test_it_shows_predicted_against_measured_as_the_page_does(world: World) -> None:
    _, body = read_fixture(fixture_files("startup", "vllm_pr17122_*")[0])
    store_log(world.deployment, body.splitlines())
    feed_counters(world.deployment, rate=7.5, streams=2, seconds=4)
    shown = detail(world)["predicted_vs_measured"]
    expected = calibration.predicted_vs_measured(Deployment.objects.get(pk=world.deployment.pk))
    assert shown == {key: value for key, value in expected.items() if key != "deployment"}
    rows = {r["quantity"]: r for r in shown["rows"]}
    plan = world.deployment.plan
    assert rows["decode per stream (tok/s)"]["measured"] == 7.5
    assert rows["decode per stream (tok/s)"]["ratio"] == pytest.approx(7.5 / plan["decode_tok_s"])
    assert rows["KV cache (tokens)"]["ratio"] == pytest.approx(158656 / plan["kv_cache_tokens"])
    assert (shown["streams"], shown["total_tok_s"], shown["decode_intervals"]) == (2, 15.0, 4)


def test_it_shows_no_ratio_before_anything_was_measured(world: World) -> None:
    rows = detail(world)["predicted_vs_measured"]["rows"]
    assert [r["predicted"] is not None for r in rows] == [True, True, True]
    assert [(r["measured"], r["ratio"]) for r in rows] == [(None, None)] * 3


def test_it_lists_the_measure_runs_newest_first_and_bounded(world: World) -> None:
    now = timezone.now()
    for n in range(SHOWN_LOAD_TESTS + 1):
        run = add_load_test(world.deployment, f"run-{n}", per_stream=10.0 + n)
        DeploymentLoadTest.objects.filter(pk=run.pk).update(created=now + timedelta(seconds=n))
    runs = detail(world)["load_tests"]
    assert len(runs) == SHOWN_LOAD_TESTS
    assert [r["request"] for r in runs[:2]] == [f"run-{SHOWN_LOAD_TESTS}", f"run-{SHOWN_LOAD_TESTS - 1}"]
    newest = runs[0]
    assert newest["tok_s_per_stream"] == 10.0 + SHOWN_LOAD_TESTS and newest["status"] == "done"
    assert newest["ratio"] == pytest.approx((10.0 + SHOWN_LOAD_TESTS) / 25.0)
    assert "first" not in [r["request"] for r in runs]

"""Operator UX on the server-rendered pages: what runs on each GPU, how to reach a deployment, discarding and
expiring deployments that were never launched, readable topology cells."""

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard import fleet, read, tasks
from dashboard.choices import DeploymentState, DesiredState, LinkClass
from dashboard.models import Deployment, GpuSample, PlanRequest
from tests.personas import sim_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def box():
    return sim_node("rtx4090-box", "sim:rtx4090x2")


def running_on(node, gpus: list[int], pid: int = 4242, state: str = DeploymentState.SERVING) -> Deployment:
    launch = {
        "type": "launch",
        "v": 1,
        "deployment": "d1",
        "backend": "simulated",
        "model": "Qwen2.5-7B-Instruct",
    }
    plan = {"backend": "vllm", "tp": 1, "pp": 1, "decode_tok_s": 40.0}
    return Deployment.objects.create(
        id="d1",
        name="Qwen2.5-7B-Instruct",
        node=node,
        plan=plan,
        launch={**launch, "gpus": gpus, "options": {"served_model_name": "qwen-7b"}},
        state=state,
        pid=pid,
        port=51507,
        tokens_per_s=38.5,
    )


def sample(node, index: int, used: float, processes: list[dict]) -> None:
    GpuSample.objects.create(
        gpu=node.gpus.get(index=index),
        t=timezone.now(),
        seq=1,
        util_gpu=50,
        util_mem=5,
        mem_used_mib=used,
        mem_free_mib=24564 - used,
        temp_c=41,
        power_w=88,
        processes=processes,
    )


def test_it_names_the_deployment_holding_each_gpu_and_splits_its_memory(client, alice, box):
    running_on(box, [1])
    sample(
        box,
        1,
        20000,
        [{"pid": 4242, "name": "python3", "used_mib": 18000}, {"pid": 7, "name": "x", "used_mib": 2000}],
    )
    sample(box, 0, 3000, [{"pid": 7, "name": "blender", "used_mib": 3000}])
    client.force_login(alice)
    response = client.get("/nodes/rtx4090-box/")
    rows = {r["gpu"].index: r for r in response.context["gpu_use"]}
    assert rows[1]["holder"].pk == "d1" and rows[0]["holder"] is None
    total = box.gpus.get(index=1).memory_total_mib
    assert (rows[1]["split"].mine, rows[1]["split"].other, rows[1]["split"].free) == (
        18000,
        2000,
        total - 20000,
    )
    assert (rows[0]["split"].mine, rows[0]["split"].other) == (0, 3000)
    html = response.content.decode()
    assert "pid 4242 python3 · 18000 MiB" in html and "pid 7 blender · 3000 MiB" in html
    assert 'id="node-deployments"' in html and "38.5" in html


def test_it_counts_nothing_as_the_deployments_share_before_its_pid_is_known():
    split = read.memory_split(24576, 20000, [{"pid": 99, "used_mib": 20000}], server_pid=None)
    assert (split.mine, split.other) == (0, 20000)


def test_it_shows_on_the_fleet_page_which_deployment_holds_a_gpu_and_the_gpus_of_a_deployment(
    client, alice, box
):
    running_on(box, [0, 1])
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "GPU0, GPU1" in html and 'class="holder"' in html
    entries = {e.detail: e.rows for e in client.get("/").context["page_entries"]}
    rows = entries[box]
    assert [r.holder.pk if r.holder else None for r in rows] == ["d1", "d1"]


def test_it_gives_the_base_url_model_name_and_snippets_once_the_port_is_known(client, alice, box):
    deployment = running_on(box, [0])
    client.force_login(alice)
    html = client.get(deployment.get_absolute_url()).content.decode()
    assert "http://127.0.0.1:51507/v1" in html and "qwen-7b" in html
    assert "curl http://127.0.0.1:51507/v1/chat/completions \\\n" in html
    assert 'OpenAI(base_url="http://127.0.0.1:51507/v1"' in html
    assert f"ssh -N -L 51507:127.0.0.1:51507 {box.reach_address}" in html
    Deployment.objects.filter(pk="d1").update(port=None)
    assert 'id="use-it"' not in client.get(deployment.get_absolute_url()).content.decode()


def test_it_names_gpus_in_the_chart_legend_as_the_node_does(client, alice, box):
    deployment = running_on(box, [1])
    client.force_login(alice)
    names = client.get(deployment.get_absolute_url()).context["gpu_names"]
    assert sorted(names.values()) == ["GPU0", "GPU1"] and names[box.gpus.get(index=1).pk] == "GPU1"


def test_it_discards_a_planned_deployment_and_refuses_a_running_one(client, alice, box, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    deployment = running_on(box, [0], state=DeploymentState.PLANNED)
    client.force_login(alice)
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert 'id="discard"' in page
    assert f'action="/deployments/{deployment.pk}/discard/"' in client.get("/").content.decode()
    response = client.post(f"/deployments/{deployment.pk}/discard/")
    assert response.status_code == 302 and response.url == "/"
    deployment.refresh_from_db()
    assert (deployment.state, deployment.desired) == (DeploymentState.STOPPED, DesiredState.STOPPED)
    assert "discarded by alice" in deployment.detail
    assert (
        tasks.launch_deployment(deployment.pk) == DeploymentState.STOPPED
    )  # a late launch task does nothing
    Deployment.objects.filter(pk="d1").update(state=DeploymentState.SERVING)
    client.post(f"/deployments/{deployment.pk}/discard/")
    assert Deployment.objects.get(pk="d1").state == DeploymentState.SERVING


def test_it_expires_deployments_left_planned(box, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.PLANNED_EXPIRE_AFTER_S = 600
    old = running_on(box, [0], state=DeploymentState.PLANNED)
    Deployment.objects.filter(pk=old.pk).update(created=timezone.now() - timedelta(seconds=601))
    fresh = Deployment.objects.create(
        id="d2", name="fresh", node=box, plan=old.plan, launch=old.launch, state=DeploymentState.PLANNED
    )
    assert tasks.expire_planned_deployments() == 1
    assert Deployment.objects.get(pk=old.pk).state == DeploymentState.STOPPED
    assert "expired" in Deployment.objects.get(pk=old.pk).detail
    assert Deployment.objects.get(pk=fresh.pk).state == DeploymentState.PLANNED
    assert fleet.active_deployments() == [Deployment.objects.get(pk="d2")]


def test_it_refuses_to_discard_what_does_not_exist(client, alice):
    client.force_login(alice)
    assert client.post("/deployments/nope/discard/").status_code == 404
    assert not PlanRequest.objects.exists()


def test_it_draws_every_topology_cell_with_text_of_aa_contrast():
    for value, _, color in LinkClass.CHOICES:
        text = fleet.readable_text(color)
        assert fleet.contrast_ratio(text, color) >= 4.5, (value, color, text)
    assert fleet.contrast_ratio("#000000", "#ffffff") == pytest.approx(21.0)

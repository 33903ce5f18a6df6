"""The fleet page at fleet size: summary line, GPU heatmap, filters, sorting and pages (server side)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.template.defaultfilters import floatformat
from django.utils import timezone

from dashboard import fleet_view
from dashboard.choices import DeploymentState
from dashboard.models import Alert, Deployment, GpuSample, Node
from dashboard.templatetags.fleet_tags import whole
from tests import storm

pytestmark = pytest.mark.django_db


def load(nodes: list[Node], utils: list[float]) -> None:
    """Each node's GPUs report `util` %, node by node."""
    rows = [
        GpuSample(
            gpu=gpu,
            t=timezone.now(),
            seq=1,
            util_gpu=util,
            util_mem=1,
            mem_used_mib=2048,
            mem_free_mib=22528,
            temp_c=40,
            power_w=90,
        )
        for node, util in zip(nodes, utils, strict=True)
        for gpu in node.gpus.all()
    ]
    GpuSample.objects.bulk_create(rows)


@pytest.fixture
def fleet() -> list[Node]:
    nodes = storm.fleet(4, timezone.now(), prefix="gpu", gpus=2)
    load(nodes[:3], [95, 0, 40])  # gpu-0003 has not sampled
    storm.silence(nodes[2:3], 30)  # gpu-0002 went quiet
    Deployment.objects.create(
        id="d", name="d", node=nodes[1], plan={}, launch={}, state=DeploymentState.SERVING
    )
    Alert.objects.create(key="k", kind="xid", title="t", cause="c", remedy="r", node=nodes[3])
    return nodes


def page(client, alice, query: str = "") -> str:
    client.force_login(alice)
    response = client.get(f"/?{query}")
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


def cards(html: str) -> list[str]:
    return re.findall(r'<section class="node".*?<a href="/nodes/([^/]+)/', html, re.S)


def test_it_sums_up_the_fleet_in_one_line(client, alice, fleet):
    html = page(client, alice)
    line = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html.split('id="fleet-summary">')[1].split("</p>")[0]))
    assert "4 nodes: 3 online 1 stale" in line
    assert "GPUs 2 busy, 2 idle, 4 silent" in line and "1 serving" in line and "1 open alert" in line


def heatmap_data(html: str) -> dict:
    return json.loads(
        html.split('<script id="heatmap-data" type="application/json">')[1].split("</script>")[0]
    )


def test_it_gives_the_heatmap_one_cell_per_gpu_by_node_with_its_colour_and_memory(client, alice, fleet):
    data = heatmap_data(page(client, alice))
    assert [n[1] for n in data["nodes"]] == ["gpu-0000", "gpu-0001", "gpu-0002", "gpu-0003"]
    assert [n[2] for n in data["nodes"]] == ["online", "online", "stale", "online"]
    colours = [cell & 15 if cell >= 0 else None for n in data["nodes"] for cell in n[5]]
    assert colours == [9, 9, 0, 0, 4, 4, None, None]  # 95 %, 0 %, 40 %, no sample
    assert {cell >> 4 for n in data["nodes"][:3] for cell in n[5]} == {
        2048 // 256
    }  # memory used, 256 MiB steps
    assert data["nodes"][0][6:9] == [[95, 95], [2048, 2048], [24576, 24576]]  # the hover's values
    assert list(data["deployments"].values()) == ["serving"] and len(data["open_alerts"]) == 1
    assert 'id="heatmap-canvas"' in page(client, alice)


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("q=0001", ["gpu-0001"]),
        ("state=stale", ["gpu-0002"]),
        ("load=busy", ["gpu-0000"]),
        ("load=idle", ["gpu-0001"]),
        ("deployed=on", ["gpu-0001"]),
        ("alerting=on", ["gpu-0003"]),
        ("simulated=yes", []),
        ("model=NVIDIA+A30&sort=util", ["gpu-0000", "gpu-0002", "gpu-0001", "gpu-0003"]),
    ],
)
def test_it_filters_and_sorts_the_node_list(client, alice, fleet, query, shown):
    assert cards(page(client, alice, query)) == shown


def test_it_pages_the_node_list_keeping_the_filters(client, alice, fleet, monkeypatch):
    monkeypatch.setattr(fleet_view, "PAGE_SIZE", 3)
    first = page(client, alice, "sort=util")
    assert cards(first) == ["gpu-0000", "gpu-0002", "gpu-0001"] and "page 1 of 2" in first
    assert 'href="?sort=util&amp;page=2"' in first
    assert cards(page(client, alice, "sort=util&page=2")) == ["gpu-0003"]


@pytest.mark.parametrize(
    ("query", "named"), [("state=lost", "state must be one of"), ("page=0", "page must")]
)
def test_it_names_a_filter_it_does_not_understand(client, alice, fleet, query, named):
    client.force_login(alice)
    response = client.get(f"/?{query}")
    assert response.status_code == 400 and named in response.content.decode()


def test_it_keeps_the_page_small_at_a_thousand_nodes_of_eight_gpus(client, alice):
    nodes = storm.fleet(1000, timezone.now() - timedelta(seconds=1), prefix="big", gpus=8)
    load(nodes[:100], [50.0] * 100)
    html = page(client, alice)
    assert len(cards(html)) == fleet_view.PAGE_SIZE
    assert sum(len(n[4]) for n in heatmap_data(html)["nodes"]) == 8000
    assert len(html.encode()) < 500_000, len(html.encode())


def test_it_shows_each_gpus_newest_values_in_its_card_rounded_as_the_template_filter_does(
    client, alice, fleet
):
    GpuSample.objects.filter(gpu__node=fleet[0]).update(util_gpu=94.5, mem_used_mib=2047.5, power_w=-0.4)
    html = page(client, alice)
    card = html.split(f'data-node="{fleet[0].pk}"')[1].split("</section>")[0]
    assert card.count('<tr class="gpu"') == 2
    assert "95 %" in card and "2048 / 24576 MiB" in card and "40 °C" in card and "0 W" in card
    assert 'style="width: 8%"' in card  # 2047.5 of 24575.5 MiB
    silent = html.split(f'data-node="{fleet[3].pk}"')[1].split("</section>")[0]
    assert "– / " in silent and 'style="width: 0%"' in silent


@pytest.mark.parametrize("value", [0.0, -0.0, 0.5, 1.5, 2.5, -0.5, 99.95, 24575.5, 0.49999, float("inf")])
def test_it_rounds_a_reading_as_floatformat_0_does(value):
    assert whole(value) == str(floatformat(value, 0))

"""The fleet and node pages as an operator sees them (server-rendered part)."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.models import Gpu, GpuSample, Link, Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def seed_node():
    """The field report's server: 4x A30, every GPU pair SYS, no P2P, last heard from just now."""
    node = Node.objects.create(
        name="a30-seed",
        simulated=True,
        interval_s=1.0,
        last_seen=timezone.now(),
        connected=True,
        topology={
            "gpus": [{"name": f"GPU{i}", "cpu_affinity": "0-23", "numa_affinity": "0"} for i in range(4)],
            "nics": [],
            "links": [],
        },
    )
    for i in range(4):
        gpu = Gpu.objects.create(
            node=node, index=i, uuid=f"GPU-{i}", name="NVIDIA A30", memory_total_mib=24576
        )
        GpuSample.objects.create(
            gpu=gpu,
            t=timezone.now(),
            seq=1,
            util_gpu=37 + i,
            util_mem=5,
            mem_used_mib=1024,
            mem_free_mib=23552,
            temp_c=41,
            power_w=88,
        )
    for a in range(4):
        for b in range(a + 1, 4):
            Link.objects.create(node=node, a=f"GPU{a}", b=f"GPU{b}", link="SYS", p2p_read="NS")
    return node


def test_it_sends_anonymous_visitors_to_the_login_page(client):
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/accounts/login/")


def test_it_lists_nodes_with_their_latest_gpu_values(client, alice, seed_node):
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "a30-seed" in html and "simulated" in html
    assert "37 %" in html and "1024 / 24576 MiB" in html and "Online" in html


def test_it_shows_a_silent_node_as_stale_after_three_intervals(client, alice, seed_node):
    Node.objects.filter(pk=seed_node.pk).update(last_seen=timezone.now() - timedelta(seconds=3.5))
    client.force_login(alice)
    assert 'data-status="stale"' in client.get("/").content.decode()


def test_it_draws_the_topology_grid_with_p2p_status(client, alice, seed_node):
    client.force_login(alice)
    response = client.get("/nodes/a30-seed/")
    grid = response.context["grid"]
    assert grid["columns"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert [c["label"] for c in grid["rows"][1]["cells"]] == ["SYS", "X", "SYS", "SYS"]
    assert grid["rows"][0]["cells"][1]["p2p"] == "NS"
    assert "Across NUMA nodes" in response.content.decode()


def test_it_embeds_the_last_fifteen_minutes_for_the_charts(client, alice, seed_node):
    old = GpuSample.objects.first()
    GpuSample.objects.create(
        gpu=old.gpu,
        t=timezone.now() - timedelta(minutes=20),
        seq=0,
        util_gpu=1,
        util_mem=1,
        mem_used_mib=1,
        mem_free_mib=1,
        temp_c=1,
        power_w=1,
    )
    client.force_login(alice)
    history = client.get("/nodes/a30-seed/").context["history"]
    assert history["keys"] == ("t", "util", "mem_used", "mem_total", "temp", "power", "util_mem")
    assert sorted(len(points) for points in history["gpus"].values()) == [1, 1, 1, 1]


def test_it_sends_a_reconnecting_page_only_the_points_it_missed(client, alice, seed_node):
    newest = GpuSample.objects.order_by("-t").first().t
    client.force_login(alice)
    missed = client.get(
        f"/nodes/a30-seed/history.json?after={(newest - timedelta(seconds=1)).timestamp() * 1000}"
    )
    assert sorted(len(points) for points in missed.json()["gpus"].values()) == [1, 1, 1, 1]
    assert client.get(f"/nodes/a30-seed/history.json?after={newest.timestamp() * 1000}").json()["gpus"] == {}
    for bad in ("yesterday", "1e400", "nan"):
        response = client.get(f"/nodes/a30-seed/history.json?after={bad}")
        assert response.status_code == 400 and "unix milliseconds" in response.json()["error"]


def test_it_answers_404_for_an_unknown_node(client, alice):
    client.force_login(alice)
    assert client.get("/nodes/nope/").status_code == 404


def test_it_writes_strict_json_for_the_charts_when_a_stored_value_is_not_finite(client, alice, seed_node):
    """A sample stored before the protocol refused Infinity must not break the node page's JSON."""
    GpuSample.objects.update(power_w=float("inf"), temp_c=float("-inf"))
    client.force_login(alice)

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    history = json.loads(client.get("/nodes/a30-seed/history.json").content, parse_constant=refuse)
    named = [dict(zip(history["keys"], points[0], strict=True)) for points in history["gpus"].values()]
    assert [(point["temp"], point["power"]) for point in named] == [(None, None)] * 4
    page = client.get("/nodes/a30-seed/").content.decode()
    embedded = page.split('<script id="history" type="application/json">')[1].split("</script>")[0]
    assert json.loads(embedded, parse_constant=refuse) == history

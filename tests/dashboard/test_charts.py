"""Chart ranges: each range reads its tier (raw, minute, hour), and gaps in the data stay gaps."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard import fleet, storage
from dashboard.models import Deployment, DeploymentMetric, Gpu, GpuHour, GpuMinute, GpuSample, Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def node() -> Node:
    node = Node.objects.create(name="a30-seed", interval_s=1.0)
    for i in range(2):
        Gpu.objects.create(node=node, index=i, uuid=f"GPU-{i}", name="NVIDIA A30", memory_total_mib=24576)
    return node


def add_sample(gpu: Gpu, seconds_ago: float, util: float) -> None:
    GpuSample.objects.create(
        gpu=gpu,
        t=timezone.now() - timedelta(seconds=seconds_ago),
        seq=1,
        util_gpu=util,
        util_mem=1,
        mem_used_mib=1000,
        mem_free_mib=23576,
        temp_c=40,
        power_w=90,
    )


def add_bucket(tier, gpu: Gpu, seconds_ago: float, util: float) -> None:
    start = int((timezone.now() - timedelta(seconds=seconds_ago)).timestamp()) // tier.SECONDS * tier.SECONDS
    values = {
        f"{m}_{s}": util
        for m in ("util_gpu", "util_mem", "mem_used_mib", "temp_c", "power_w")
        for s in ("min", "avg", "max")
    }
    tier.objects.create(gpu=gpu, start=start, n=60, **values)


def test_it_draws_a_gap_where_samples_stopped(node):
    gpu = node.gpus.first()
    for seconds_ago, util in ((30, 10), (29, 20), (5, 30)):  # 24 s without a sample at a 1 s interval
        add_sample(gpu, seconds_ago, util)
    points = fleet.gpu_history(node, minutes=15)["gpus"][str(gpu.pk)]
    assert [p[1] for p in points] == [10, 20, None, 30]
    assert points[1][0] < points[2][0] < points[3][0]


def test_it_draws_no_gap_between_consecutive_samples(node):
    gpu = node.gpus.first()
    for seconds_ago in (3, 2, 1):
        add_sample(gpu, seconds_ago, 50)
    assert None not in [p[1] for p in fleet.gpu_history(node, minutes=15)["gpus"][str(gpu.pk)]]


@pytest.mark.parametrize(
    ("range_name", "tier", "step"), [("15m", "raw", 1.0), ("24h", "minute", 240), ("7d", "hour", 3600)]
)
def test_it_reads_the_tier_that_fits_the_range(node, range_name, tier, step):
    gpu = node.gpus.first()
    add_sample(gpu, 10, 1)
    add_bucket(GpuMinute, gpu, 3 * 3600, 2)
    add_bucket(GpuHour, gpu, 3 * 86400, 3)
    history = fleet.gpu_history(node, minutes=fleet.chart_minutes(range_name))
    assert (history["tier"], history["step_s"]) == (tier, step)
    utils = {"raw": [1], "minute": [2], "hour": [3]}[tier]
    assert [p[1] for p in history["gpus"][str(gpu.pk)]] == utils


def test_it_names_the_ranges_when_asked_for_an_unknown_one(client, alice, node):
    client.force_login(alice)
    response = client.get("/nodes/a30-seed/?range=3y")
    assert response.status_code == 400
    assert "range must be one of 15m, 1h, 6h, 24h, 7d, 90d" in response.content.decode()
    history = client.get("/nodes/a30-seed/history.json?range=3y&after=0")
    assert history.status_code == 400 and "15m" in history.json()["error"]


def test_it_shows_range_buttons_and_the_chosen_range(client, alice, node):
    gpu = node.gpus.first()
    add_bucket(GpuMinute, gpu, 3600 * 5, 42)
    client.force_login(alice)
    html = client.get("/nodes/a30-seed/?range=6h").content.decode()
    assert 'href="?range=90d"' in html and 'aria-current="true" class="current">6h<' in html
    start = html.index('id="history"')
    history = json.loads(html[html.index(">", start) + 1 : html.index("</script>", start)])
    assert history["tier"] == "minute" and history["gpus"][str(gpu.pk)][0][1] == 42


def test_it_averages_deployment_metrics_per_bucket_past_the_raw_window(node):
    deployment = Deployment.objects.create(name="d", node=node, plan={}, launch={"gpus": [0]})
    now = timezone.now().replace(second=30, microsecond=0) - timedelta(hours=2)
    for offset, tok in ((0, 10.0), (1, 30.0), (600, 5.0)):
        DeploymentMetric.objects.create(
            deployment=deployment, t=now + timedelta(seconds=offset), generation_tokens_per_s=tok
        )
    points = fleet.metric_history(deployment, minutes=fleet.chart_minutes("6h"))
    assert [p[1] for p in points] == [20.0, None, 5.0]
    assert storage.tier_for(360) is GpuMinute


def test_it_merges_buckets_so_that_a_chart_has_at_most_360_points_per_gpu(node):
    gpu = node.gpus.first()
    for hours_ago in range(24 * 80):
        add_bucket(GpuHour, gpu, hours_ago * 3600 + 60, hours_ago % 2)  # 0 and 1 by turns
    history = fleet.gpu_history(node, minutes=fleet.chart_minutes("90d"))
    points = history["gpus"][str(gpu.pk)]
    assert history["step_s"] == 6 * 3600 and 300 < len(points) <= 360
    assert sorted(p[1] for p in points)[len(points) // 2] == 0.5  # a 6 h point averages its six hours


def test_it_keeps_a_gap_a_gap_when_the_api_thins_the_history(node):
    """The API's `step` averages windows of points; the nulls that mark a gap are not values to average."""
    history, gpu = fleet.gpu_history(node, minutes=15), str(node.gpus.first().pk)
    history["gpus"][gpu] = [[0, 10.0, None], [1000, 30.0, 5.0], [1500, None, None], [600_000, 50.0, 7.0]]
    thinned = fleet.thinned_history({**history, "step_s": 1.0}, 60)
    assert thinned["gpus"][gpu] == [[0, 20.0, 5.0], [300_000.0, None, None], [600_000, 50.0, 7.0]]
    assert thinned["step_s"] == 60

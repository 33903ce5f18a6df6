"""The /metrics fast path: each family's text is byte for byte what prometheus_client's generate_latest writes."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import generate_latest

from dashboard import exporter, telemetry
from dashboard.exposition import Family, FamilyText, render_plain
from dashboard.models import Node
from tests.dashboard.test_metrics_endpoint import hello_of, report

GPU = ("node", "gpu", "uuid", "model")
ODD_NODES = (
    "plain-node",
    'rack "7"',
    "back\\slash\\",
    "new\nline",
    "carriage\rreturn",
    "tab\tand\u2028separator\x0bvt",
    "ünïcødé-節点",
    "",
    "{braces} and = signs, commas",
)
ODD_VALUES = (
    0.0, -0.0, 1, 7, True, 0.5, 1 / 3, -2.5, 1e-7, 123456.0, 1234567.0, 80e9, 1e21, 2**53 + 1.0,
    float("nan"), float("inf"), float("-inf"), 5e-324, 1.7976931348623157e308,
)  # fmt: skip


def gpu_points(values: list[float], nodes=ODD_NODES) -> tuple:
    labels = [(node, str(i), f"GPU-{node}-{i}", 'NVIDIA "H100" 80GB\\') for node in nodes for i in range(2)]
    return tuple(zip(labels, values, strict=False))


def assert_same_text(text: FamilyText, family: Family) -> None:
    assert text.render(family) == render_plain(family)


@pytest.mark.parametrize("counter", [False, True])
def test_it_writes_what_prometheus_client_writes_for_odd_labels_and_values(counter):
    values = list(ODD_VALUES) * 2
    family = Family(
        "layercake_gpu_odd", 'Help with "quotes", \\ and\na newline.', GPU, gpu_points(values), counter
    )
    assert_same_text(FamilyText(), family)


def test_it_stays_identical_as_values_change_and_readings_come_and_go():
    text, rng = FamilyText(), random.Random(12)
    for scrape in range(30):
        values = [
            rng.choice([rng.uniform(-1e3, 1e12), rng.choice(ODD_VALUES), rng.randrange(300)])
            for _ in range(18)
        ]
        points = tuple(
            p for p in gpu_points(values) if rng.random() > 0.2
        )  # a GPU without a reading: no point
        assert_same_text(text, Family("layercake_gpu_power_watts", "Power draw.", GPU, points))
        assert_same_text(text, Family("layercake_gpu_temperature_celsius", "T.", GPU, points[scrape % 3 :]))


def test_it_writes_unlabelled_and_empty_families_and_other_label_names():
    text = FamilyText()
    assert_same_text(text, Family("layercake_agents_connected", "Agents.", (), (((), 12.0),)))
    assert_same_text(
        text, Family("layercake_ingest_samples_stored", "Stored.", (), (((), 8e6),), counter=True)
    )
    assert_same_text(text, Family("layercake_ingest_lag_seconds", "Lag.", (), ()))
    assert_same_text(text, Family("layercake_gpu_odd", "Empty.", GPU, ()))
    node = ("node", "status")
    points = tuple(((n, s), float(s == "online")) for n in ODD_NODES for s in ("online", "stale"))
    assert_same_text(text, Family("layercake_node_status", "Status.", node, points))
    # the same label values under other label names are other text ("a" sorts before "node")
    assert_same_text(text, Family("layercake_x", "X.", ("status", "a"), points[:3]))


def test_it_forgets_label_sets_gone_for_good():
    text = FamilyText()
    for generation in range(5):
        nodes = [f"node-{generation}-{n}" for n in range(600)]
        family = Family("layercake_node_info", "Info.", ("node",), tuple(((n,), 1.0) for n in nodes))
        assert_same_text(text, family)
    assert len(text.label_texts[("node",)]) <= 2 * 600 + 1024


def test_it_tells_zero_from_minus_zero_and_keeps_no_nan():
    text = FamilyText()
    for values in ([0.0, -0.0, 3.0, float("nan")], [-0.0, 0.0, 3, float("nan")]):
        assert_same_text(text, Family("layercake_gpu_power_watts", "P.", GPU, gpu_points(values)))
    assert dict(text.value_texts) == {3.0: "3.0"}


def test_it_writes_nan_and_infinity_as_prometheus_client_does():
    family = Family("layercake_gpu_power_watts", "P.", GPU, gpu_points([math.nan, -math.inf]))
    assert FamilyText().render(family).splitlines()[-2:] == [
        b'layercake_gpu_power_watts{gpu="0",model="NVIDIA \\"H100\\" 80GB\\\\",node="plain-node",uuid="GPU-plain-node-0"} NaN',
        b'layercake_gpu_power_watts{gpu="1",model="NVIDIA \\"H100\\" 80GB\\\\",node="plain-node",uuid="GPU-plain-node-1"} -Inf',
    ]


def test_it_renders_a_whole_scrape_as_generate_latest_does(transactional_db):
    from agents.sim.gpus import SimSource
    from dashboard import ingest

    live = telemetry.LiveState()
    for n, name in enumerate(['rack "7" \\ node', "ünïcødé-節点"]):
        source = SimSource("a30x4")
        node = Node.objects.create(name=name)
        gpu_ids = ingest.apply_hello(node, hello_of(source))
        source.inject_xid(1, 79)
        report(live, node, source, gpu_ids, 1 + n)
    Node.objects.update(interval_s=3600)  # online for both reads of the fleet, however slow this machine is
    renderer = exporter.Renderer()
    for _ in range(2):  # rendered, then again from the kept pieces
        snapshot = live.snapshot()
        text, _ = renderer.render(snapshot)
        expected = generate_latest(exporter.FleetCollector(snapshot, exporter.read_fleet(None)))
        assert text == expected
        assert b'node="rack \\"7\\" \\\\ node"' in text

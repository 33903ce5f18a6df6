"""/metrics in-process: who gets in, and what the exposition holds for a node whose readings went through ingest."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from agents.sim.gpus import SimSource
from dashboard import exporter, ingest, metrics_views, telemetry
from dashboard.models import Alert, Node
from layercake import settings as layercake_settings

TOKEN = "scrape-token-0123456789abcdef"


@pytest.fixture
def live(monkeypatch):
    """A fresh live state and renderer for the view (the process-wide ones outlive tests)."""
    state = telemetry.LiveState()
    monkeypatch.setattr(metrics_views, "LIVE", state)
    monkeypatch.setattr(metrics_views, "RENDERER", exporter.Renderer())
    return state


@pytest.fixture
def scrape_settings(settings):
    settings.METRICS_TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()
    settings.METRICS_ALLOW = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128")]
    return settings


def hello_of(source: SimSource) -> protocol.Hello:
    return protocol.Hello(
        type="hello", v=1, agent_version="0.1.0", hostname="a30-seed", boot_id="boot-0001", interval_s=1.0,
        gpu_source="sim", simulated=True, driver_version=source.driver_version(),
        cuda_version=source.cuda_version(), gpus=source.inventory(), topology=source.topology(),
    )  # fmt: skip


class Stored:
    """An item as the ingest buffer hands it to its listeners once stored."""

    def __init__(self, node_id: int, message: protocol.Samples, gpu_ids: dict[int, int]) -> None:
        self.node_id, self.sampled_at = node_id, message.t
        self.rows = ingest.sample_rows(message, gpu_ids)
        self.xids = ingest.sample_xids(message, gpu_ids)


def report(state: telemetry.LiveState, node: Node, source: SimSource, gpu_ids: dict[int, int], seq: int):
    readings = source.sample()
    message = protocol.Samples(type="samples", v=1, seq=seq, t=time.time(), gpus=readings)
    state.record([Stored(node.pk, message, gpu_ids)])
    # As ingest's store does: without it a loaded machine that takes 3 intervals to get to the scrape shows
    # the node stale and its readings left out (the test failed so under load).
    Node.objects.filter(pk=node.pk).update(last_seen=timezone.now())
    return readings


def scrape(client: Client, **headers) -> dict:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"} | headers)
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def values(families: dict, name: str) -> dict[tuple, float]:
    family = families.get(name) or families[name.removesuffix("_total")]  # a counter's family has no _total
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name == name}


def gpu_key(node: str, index: int, uuid: str, model: str) -> tuple:
    return tuple(sorted({"node": node, "gpu": str(index), "uuid": uuid, "model": model}.items()))


def test_it_exposes_the_readings_the_agent_sent_in_base_units(transactional_db, live, scrape_settings):
    source = SimSource("a30x4")
    node = Node.objects.create(name="a30-seed")
    gpu_ids = ingest.apply_hello(node, hello_of(source))
    source.inject_ecc_errors(2, corrected=7, uncorrected=1)
    source.inject_xid(1, 79)
    report(live, node, source, gpu_ids, 1)
    readings = report(live, node, source, gpu_ids, 2)
    families = scrape(Client())
    info = {g.index: g for g in source.inventory()}
    for r in readings:
        key = gpu_key("a30-seed", r.index, info[r.index].uuid, "NVIDIA A30")
        assert values(families, "layercake_gpu_utilization_ratio")[key] == pytest.approx(r.util_gpu / 100)
        assert values(families, "layercake_gpu_memory_used_bytes")[key] == r.mem_used_mib * 2**20
        assert values(families, "layercake_gpu_memory_total_bytes")[key] == 24576 * 2**20
        assert values(families, "layercake_gpu_temperature_celsius")[key] == r.temp_c
        assert values(families, "layercake_gpu_power_watts")[key] == r.power_w
        assert values(families, "layercake_gpu_power_limit_watts")[key] == 165
        assert values(families, "layercake_gpu_sm_clock_hertz")[key] == r.sm_clock_mhz * 1e6
        assert values(families, "layercake_gpu_throttle_reasons")[key] == r.throttle_reasons
        assert values(families, "layercake_gpu_ecc_corrected_errors_total")[key] == r.ecc_corrected
        assert values(families, "layercake_gpu_xid_events_total")[key] == (1 if r.index == 1 else 0)
    assert sorted(values(families, "layercake_gpu_ecc_corrected_errors_total").values()) == [0, 0, 0, 7]
    assert list(values(families, "layercake_gpu_last_xid").values()) == [79]


def test_it_exposes_node_status_topology_and_the_server_itself(transactional_db, live, scrape_settings):
    source = SimSource("a30x4")
    node = Node.objects.create(name="a30-seed")
    Node.objects.create(name="never-seen")
    gpu_ids = ingest.apply_hello(node, hello_of(source))
    report(live, node, source, gpu_ids, 1)
    live.socket_opened("agent")
    live.agent_online(node.pk)
    families = scrape(Client())
    status = values(families, "layercake_node_status")
    assert status[(("node", "a30-seed"), ("status", "online"))] == 1
    assert status[(("node", "a30-seed"), ("status", "stale"))] == 0
    assert status[(("node", "never-seen"), ("status", "new"))] == 1
    links = values(families, "layercake_gpu_link_info")
    assert len(links) == 6  # every pair of 4 GPUs, no NIC pairs
    assert all(dict(k)["link"] == "SYS" and dict(k)["p2p"] == "NS" for k in links)
    assert values(families, "layercake_node_last_sample_age_seconds")[(("node", "a30-seed"),)] < 5
    assert values(families, "layercake_agents_connected")[()] == 1
    assert values(families, "layercake_websocket_clients")[(("kind", "agent"),)] == 1
    assert values(families, "layercake_ingest_samples_stored_total")[()] == 4
    assert values(families, "layercake_metrics_scrapes_total")[()] == 0  # counted once answered
    assert values(scrape(Client()), "layercake_metrics_scrapes_total")[()] == 1


def test_it_leaves_out_the_readings_of_a_node_gone_stale(transactional_db, live, scrape_settings):
    source = SimSource("rtx4090x2")
    node = Node.objects.create(name="rtx4090-box")
    gpu_ids = ingest.apply_hello(node, hello_of(source))
    report(live, node, source, gpu_ids, 1)
    assert len(values(scrape(Client()), "layercake_gpu_temperature_celsius")) == 2
    Node.objects.filter(pk=node.pk).update(last_seen=node.last_seen.replace(year=2020))
    families = scrape(Client())
    assert values(families, "layercake_gpu_temperature_celsius") == {}
    assert values(families, "layercake_node_status")[(("node", "rtx4090-box"), ("status", "stale"))] == 1
    assert len(values(families, "layercake_gpu_memory_total_bytes")) == 2  # the inventory stays


def test_it_counts_unresolved_alerts_by_kind_and_severity(transactional_db, live, scrape_settings):
    common = {"title": "t", "cause": "c", "remedy": "r"}
    Alert.objects.create(key="stall:a", kind="stall", severity="critical", **common)
    Alert.objects.create(key="stall:b", kind="stall", severity="critical", status="acknowledged", **common)
    Alert.objects.create(key="xid:a", kind="xid", severity="warning", status="resolved", **common)
    families = scrape(Client())
    assert values(families, "layercake_alerts_open") == {
        (("kind", "stall"), ("severity", "critical")): 2,
        (("kind", "xid"), ("severity", "warning")): 0,
    }
    assert (
        values(families, "layercake_alerts_acknowledged")[(("kind", "stall"), ("severity", "critical"))] == 1
    )


@pytest.mark.parametrize(
    ("headers", "remote", "status", "says"),
    [
        ({}, "127.0.0.1", 401, "a bearer token is required"),
        ({"Authorization": "Bearer not-the-token"}, "127.0.0.1", 401, "wrong token"),
        ({"Authorization": f"Basic {TOKEN}"}, "127.0.0.1", 401, "wrong token"),
        ({"Authorization": f"Bearer {TOKEN}"}, "127.0.0.1", 200, "layercake_gpu"),
        ({}, "10.1.2.3", 200, "layercake_gpu"),
        ({}, "::ffff:10.1.2.3", 200, "layercake_gpu"),
        ({}, "::1", 200, "layercake_gpu"),
    ],
)
def test_it_lets_in_only_the_token_or_an_allowed_address(
    transactional_db, live, scrape_settings, headers, remote, status, says
):
    response = Client(REMOTE_ADDR=remote).get("/metrics", headers=headers)
    assert response.status_code == status
    assert says in response.content.decode()
    if status == 401:
        assert response["WWW-Authenticate"].startswith('Bearer realm="layercake metrics"')
    assert live.scrapes == (1 if status == 200 else 0)


def test_it_is_closed_to_everyone_when_nothing_is_configured(transactional_db, live, settings):
    settings.METRICS_TOKEN_SHA256, settings.METRICS_ALLOW = "", []
    response = Client().get("/metrics", headers={"Authorization": "Bearer anything-at-all-here"})
    assert response.status_code == 401
    response = Client().get("/metrics")
    assert response.status_code == 403 and "LAYERCAKE_METRICS_ALLOW" in response.content.decode()


def test_it_only_answers_get_and_head(transactional_db, live, scrape_settings):
    response = Client().post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 405


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LAYERCAKE_METRICS_TOKEN": "short"}, "at least 16 characters"),
        (
            {"LAYERCAKE_METRICS_ALLOW": "10.0.0.0/8, prometheus.internal"},
            "'prometheus.internal' is not an IP",
        ),
        ({"LAYERCAKE_METRICS_ALLOW": "10.0.0.0/33"}, "'10.0.0.0/33' is not an IP"),
    ],
)
def test_it_refuses_a_bad_scrape_setting_naming_it(monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        layercake_settings.metrics_token_digest()
        layercake_settings.envnetworks("LAYERCAKE_METRICS_ALLOW")


def test_it_keeps_only_the_tokens_digest(monkeypatch):
    monkeypatch.setenv("LAYERCAKE_METRICS_TOKEN", f"  {TOKEN}\n")
    assert layercake_settings.metrics_token_digest() == hashlib.sha256(TOKEN.encode()).hexdigest()


def test_it_logs_a_batch_it_cannot_record_instead_of_failing_the_ingest_flush(caplog):
    class Broken:
        node_id, rows, sampled_at, xids = 1, [object()], time.time(), {}

    telemetry.LiveState().record([Broken()])  # a row without gpu_id
    assert "a stored batch was not recorded" in caplog.text


PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def test_it_passes_promtools_naming_lint(transactional_db, live, scrape_settings):
    """promtool (Debian's prometheus package) checks the text against Prometheus's naming conventions."""
    if not os.path.exists(PROMTOOL):
        pytest.skip(f"{PROMTOOL} is not installed (./test.sh installs Debian's prometheus when run as root)")
    source = SimSource("a30x4")
    node = Node.objects.create(name="a30-seed")
    report(live, node, source, ingest.apply_hello(node, hello_of(source)), 1)
    Alert.objects.create(key="stall:a", kind="stall", severity="critical", title="t", cause="c", remedy="r")
    body = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr
    )

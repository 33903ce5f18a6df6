"""A real Prometheus scrapes the real server (uvicorn, Redis) while real agents with simulated GPUs report; its
HTTP API must then hold every family of /metrics with the values the agents sent. It scrapes the main port
(Django) and the server's metrics listener (LAYERCAKE_METRICS_LISTEN): both must give the same series. The
Grafana dashboard's queries run against the same Prometheus."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from agents import protocol
from dashboard import stack
from dashboard.models import Alert, Deployment, GpuSample
from tests.harness import node_with_token, wait_until
from tests.prometheus import (
    PROMETHEUS,
    AgentThread,
    RecordingSource,
    query,
    series,
    start_prometheus,
    targets,
)

pytestmark = pytest.mark.slow
TOKEN = "e2e-scrape-token-0123456789"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "layercake.json"
MIB = 2**20
HIDDEN = {"__name__", "job", "instance"}


@pytest.fixture
def server_env(server_env):
    """The server takes scrapes with TOKEN, on its main port and on its metrics listener; the allowed network
    is not the one the tests connect from."""
    return {
        **server_env,
        "LAYERCAKE_METRICS_TOKEN": TOKEN,
        "LAYERCAKE_METRICS_ALLOW": "10.99.0.0/16",
        "LAYERCAKE_METRICS_LISTEN": f"127.0.0.1:{stack.free_port()}",
    }


@pytest.fixture
def prometheus(live_stack, tmp_path):
    if not os.path.exists(PROMETHEUS):
        pytest.skip(
            f"{PROMETHEUS} is not installed (./test.sh installs Debian's prometheus when run as root)"
        )
    target, listener = f"127.0.0.1:{live_stack.port}", live_stack.env["LAYERCAKE_METRICS_LISTEN"]
    jobs = {"layercake": (target, TOKEN), "wrong-token": (target, "not-the-token")}
    jobs |= {"listener": (listener, TOKEN), "listener-wrong-token": (listener, "not-the-token")}
    service, url = start_prometheus(tmp_path / "prometheus", jobs)
    yield url
    service.stop()


class Fleet:
    """Two nodes with known readings: a30-seed (4x A30, ECC) and rtx4090-box (2x RTX 4090, no ECC)."""

    def __init__(self, url: str) -> None:
        self.a30, self.rtx = RecordingSource("sim:a30x4"), RecordingSource("sim:rtx4090x2")
        self.a30.set_load(2, util=37, mem_used_mib=12345)
        self.a30.inject_ecc_errors(1, corrected=7, uncorrected=2)
        self.a30.inject_xid(3, 79)
        self.nodes = {}
        self.agents = []
        for name, source in (("a30-seed", self.a30), ("rtx4090-box", self.rtx)):
            self.nodes[name], token = node_with_token(name)
            self.agents.append(AgentThread(url, token, source).start())
        wait_until(lambda: all(n.gpus.count() for n in self.nodes.values()), what="both hellos")

    def serve(self) -> Deployment:
        """A deployment on a30-seed whose agent reports it serving, with two scrapes of its counters."""
        deployment = Deployment.objects.create(
            name="Qwen2.5-7B-Instruct",
            node=self.nodes["a30-seed"],
            plan={"backend": "vllm", "tp": 1, "pp": 4, "node": "a30-seed", "gpus": [0, 1, 2, 3],
                  "decode_tok_s": 25.0, "decode_tok_s_total": 25.0},
            launch={},
        )  # fmt: skip
        agent = self.agents[0]
        agent.call(agent.agent.emit_status, deployment.pk, "serving")
        for generated, prompt in ((1000, 500), (1100, 700)):
            counters = protocol.ServerCounters(
                generation_tokens_total=generated,
                prompt_tokens_total=prompt,
                requests_running=2,
                requests_waiting=1,
            )
            agent.call(agent.agent.emit_metrics, deployment.pk, counters)
            time.sleep(1.0)
        wait_until(lambda: Deployment.objects.get(pk=deployment.pk).tokens_per_s, what="tokens/s measured")
        return Deployment.objects.get(pk=deployment.pk)

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()


@pytest.fixture
def fleet(live_stack):
    running = Fleet(live_stack.url)
    yield running
    running.stop()


@pytest.fixture
def scraped(prometheus, fleet):
    """The fleet reporting, a deployment serving and an alert open, all scraped by Prometheus."""
    deployment = fleet.serve()
    Alert.objects.create(key="stall:x", kind="stall", severity="critical", title="t", cause="c", remedy="r")
    wait_until(
        lambda: (
            series(prometheus, "layercake_alerts_open")
            and series(prometheus, "layercake_gpu_xid_events_total > 0")
        ),
        timeout=30,
        what="Prometheus to scrape the alert and the XID",
    )
    time.sleep(3)  # a few more scrapes: rate() over the dashboard's ranges needs two points or more
    return prometheus, fleet, deployment


def by_gpu(result: dict[frozenset, float], node: str) -> dict[int, float]:
    return {int(dict(k)["gpu"]): v for k, v in result.items() if dict(k)["node"] == node}


def test_it_has_every_family_with_the_values_the_agents_sent(scraped):
    """One Prometheus run for all of them: each setup costs ~15 s (server, Prometheus, agents, scrapes)."""
    url, fleet, deployment = scraped
    check_gpu_families(url, fleet)
    check_node_families(url, fleet)
    check_deployment_families(url, deployment)
    check_alert_and_server_families(url)
    check_wrong_token_job(url)
    check_listener_job(url)


def check_gpu_families(url: str, fleet: Fleet) -> None:
    util = by_gpu(series(url, "layercake_gpu_utilization_ratio"), "a30-seed")
    assert util[2] == 0.37  # pinned on the simulated GPU
    assert by_gpu(series(url, "layercake_gpu_memory_used_bytes"), "a30-seed")[2] == 12345 * MIB
    assert set(by_gpu(series(url, "layercake_gpu_memory_total_bytes"), "rtx4090-box").values()) == {
        24564 * MIB
    }
    for node, source, count in (("a30-seed", fleet.a30, 4), ("rtx4090-box", fleet.rtx, 2)):
        checks = {
            "layercake_gpu_temperature_celsius": ("temp_c", 1),
            "layercake_gpu_power_watts": ("power_w", 1),
            "layercake_gpu_power_limit_watts": ("power_limit_w", 1),
            "layercake_gpu_sm_clock_hertz": ("sm_clock_mhz", 1e6),
            "layercake_gpu_throttle_reasons": ("throttle_reasons", 1),
        }
        for family, (field, scale) in checks.items():
            values = by_gpu(series(url, family), node)
            assert sorted(values) == list(range(count)), family
            for index, value in values.items():
                assert value in {v * scale for v in source.values_sent(index, field)}, (family, node, index)
    ecc = series(url, "layercake_gpu_ecc_corrected_errors_total")
    assert by_gpu(ecc, "a30-seed") == {0: 0, 1: 7, 2: 0, 3: 0}
    assert by_gpu(ecc, "rtx4090-box") == {}  # GeForce: no ECC, no series
    assert by_gpu(series(url, "layercake_gpu_ecc_uncorrected_errors_total"), "a30-seed")[1] == 2
    assert by_gpu(series(url, "layercake_gpu_xid_events_total"), "a30-seed") == {0: 0, 1: 0, 2: 0, 3: 1}
    assert by_gpu(series(url, "layercake_gpu_last_xid"), "a30-seed") == {3: 79}
    labels = next(iter(series(url, 'layercake_gpu_temperature_celsius{node="a30-seed",gpu="0"}')))
    assert dict(labels)["uuid"] == fleet.a30.inventory()[0].uuid and dict(labels)["model"] == "NVIDIA A30"


def check_node_families(url: str, fleet: Fleet) -> None:
    status = series(url, "layercake_node_status == 1")
    assert {dict(k)["node"]: dict(k)["status"] for k in status} == {
        "a30-seed": "online",
        "rtx4090-box": "online",
    }
    assert all(v < 5 for v in series(url, "layercake_node_last_sample_age_seconds").values())
    info = {dict(k)["node"]: dict(k) for k in series(url, "layercake_node_info")}
    assert (
        info["a30-seed"]["driver_version"] == fleet.a30.driver_version()
        and info["a30-seed"]["gpu_source"] == "sim"
    )
    links = {
        (dict(k)["node"], dict(k)["a"], dict(k)["b"]): dict(k) for k in series(url, "layercake_gpu_link_info")
    }
    sent = {(x.a, x.b): x.link for x in fleet.a30.topology().p2p["r"]}
    assert {(a, b): links[("a30-seed", a, b)]["p2p"] for a, b in sent} == sent
    assert {links[("a30-seed", a, b)]["link"] for a, b in sent} == {"SYS"}
    assert links[("rtx4090-box", "GPU0", "GPU1")]["link"] == "PHB"


def check_deployment_families(url: str, deployment: Deployment) -> None:
    one = {"deployment": deployment.pk, "model": "Qwen2.5-7B-Instruct", "node": "a30-seed", "backend": "vllm"}
    selector = ",".join(f'{k}="{v}"' for k, v in one.items())
    assert series(url, f'layercake_deployment_state{{{selector},state="serving"}}') == {
        frozenset({**one, "state": "serving"}.items()): 1.0
    }
    measured = series(url, f"layercake_deployment_generation_tokens_per_second{{{selector}}}")
    assert list(measured.values()) == [pytest.approx(deployment.tokens_per_s)]
    assert 60 < deployment.tokens_per_s < 110  # 100 tokens over the ~1 s between the agent's two reports
    assert list(series(url, "layercake_deployment_prompt_tokens_per_second").values()) == [
        pytest.approx(2 * deployment.tokens_per_s)
    ]
    assert list(series(url, "layercake_deployment_predicted_generation_tokens_per_second").values()) == [25.0]
    assert list(series(url, "layercake_deployment_generation_tokens_total").values()) == [1100.0]
    assert list(series(url, "layercake_deployment_prompt_tokens_total").values()) == [700.0]
    assert list(series(url, "layercake_deployment_requests_running").values()) == [2.0]
    assert list(series(url, "layercake_deployment_requests_waiting").values()) == [1.0]


def check_alert_and_server_families(url: str) -> None:
    assert series(url, "layercake_alerts_open") == {
        frozenset({"kind": "stall", "severity": "critical"}.items()): 1.0
    }
    assert list(series(url, "layercake_agents_connected").values()) == [2.0]
    assert series(url, 'layercake_websocket_clients{kind="agent"}') == {frozenset({("kind", "agent")}): 2.0}
    stored = list(series(url, "layercake_ingest_samples_stored_total").values())[0]
    assert 6 <= stored <= GpuSample.objects.count()
    assert 0 <= list(series(url, "layercake_ingest_lag_seconds").values())[0] < 5
    assert list(series(url, "layercake_ingest_buffer_rows").values())[0] >= 0
    assert list(series(url, "layercake_metrics_scrapes_total").values())[0] >= 3


def check_wrong_token_job(url: str) -> None:
    """Prometheus shows a job scraping with a wrong token as down, with the server's 401."""
    jobs = targets(url)
    assert jobs["layercake"]["health"] == "up", jobs["layercake"]["lastError"]
    assert jobs["wrong-token"]["health"] == "down" and "401" in jobs["wrong-token"]["lastError"]
    assert series(url, 'up{job="wrong-token"}') == {frozenset(): 0.0}


def check_listener_job(url: str) -> None:
    """The listener's scrapes hold the same series as the main port's (the values are each scrape's own)."""
    jobs = targets(url)
    assert jobs["listener"]["health"] == "up", jobs["listener"]["lastError"]
    assert (
        jobs["listener-wrong-token"]["health"] == "down"
        and "401" in jobs["listener-wrong-token"]["lastError"]
    )
    by_job = {
        job: {
            (r["metric"]["__name__"], frozenset((k, v) for k, v in r["metric"].items() if k not in HIDDEN))
            for r in query(url, f'{{job="{job}", __name__=~"layercake_.+"}}')
        }
        for job in ("layercake", "listener")
    }
    assert len(by_job["listener"]) > 100 and by_job["listener"] == by_job["layercake"]
    memory = 'layercake_gpu_memory_total_bytes{node="rtx4090-box", job="listener"}'
    assert set(series(url, memory).values()) == {24564 * MIB}


def test_it_answers_401_without_or_with_a_wrong_token_over_the_real_server(live_stack):
    assert httpx.get(live_stack.url + "/metrics").status_code == 401
    wrong = httpx.get(live_stack.url + "/metrics", headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
    right = httpx.get(live_stack.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 200 and "# TYPE layercake_gpu_link_info gauge" in right.text


# ---- the Grafana dashboard's queries -----------------------------------------------------------------------
# What Grafana puts in for its variables: every node, and ranges a few scrapes long.
GRAFANA_VARIABLES = {
    "$__rate_interval": "30s",
    "$__interval": "5s",
    "$__range": "5m",
    "$node": ".*",
    "$deployment": ".*",
}


def dashboard_expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel, rows' panels included."""
    found = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))
        found += [(panel.get("title", "?"), t["expr"]) for t in panel.get("targets", []) if t.get("expr")]
    return found


def with_variables(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    left = re.findall(r"\$\{?\w+", expr)
    assert not left, f"{expr}: no test value for {left}"
    return expr


def test_it_runs_every_query_of_the_grafana_dashboard_and_each_returns_series(scraped):
    url, _, _ = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = dashboard_expressions(dashboard)
    assert len(expressions) >= 12
    empty = [(title, expr) for title, expr in expressions if not query(url, with_variables(expr))]
    assert not empty, f"queries without series: {empty}"
    for variable in (v for v in dashboard["templating"]["list"] if v["type"] == "query"):
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"]).groups()
        assert all(label in dict(k) for k in series(url, metric)) and series(url, metric), variable["name"]


def test_it_takes_the_datasource_as_a_variable_in_every_panel():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    sources = {json.dumps(x["datasource"]) for p in panels for x in [p, *p["targets"]]}
    assert sources == {json.dumps({"type": "prometheus", "uid": "${datasource}"})}

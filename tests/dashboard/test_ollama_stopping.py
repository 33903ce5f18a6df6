"""An Ollama model stuck in "Stopping..." (ollama/ollama#10119, fixture 032), caught live from /api/ps.

The log classifier calls fixture 032 healthy on purpose (tests/agents/test_logscan.py says why); the live rule reads
`ollama ps`'s own condition instead: a model still listed after its expires_at. These tests serve /api/ps from
a real HTTP server, scrape it the way the agent's supervisor does, send the counters as the agent's Metrics
frame through validation and the ingest write, and run the beat task that opens and resolves alerts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from agents import protocol
from agents.backends import ADAPTERS
from agents.logscan import PHASES
from agents.supervisor import http_call
from dashboard import deploy, ingest, tasks
from dashboard.choices import DeploymentState
from dashboard.models import Alert, Deployment, Node
from tests.dashboard.test_deploy import planned
from tests.personas import seed_server

pytestmark = pytest.mark.django_db(transaction=True)  # store_batch closes old connections, as in the server
ALLOWED = PHASES["stopping"].allowance


def go_time(t: float, hours: int = 0) -> str:
    """A time as Go's encoding/json writes it: RFC 3339, nanoseconds, the zone's offset ('Z' for UTC)."""
    local = datetime.fromtimestamp(t, tz=dt_timezone(timedelta(hours=hours)))
    offset = "Z" if hours == 0 else local.isoformat()[-6:]
    return f"{local:%Y-%m-%dT%H:%M:%S.%f}123{offset}"


def loaded(name: str, expires_at: str) -> dict:
    """One /api/ps entry as Ollama 0.6 answers it."""
    return {
        "name": name,
        "model": name,
        "size": 3_400_000_000,
        "digest": "a80c4f17acd5",
        "details": {
            "format": "gguf",
            "family": "llama",
            "parameter_size": "3.2B",
            "quantization_level": "Q4_K_M",
        },
        "expires_at": expires_at,
        "size_vram": 3_400_000_000,
        "context_length": 4096,
    }


class OllamaPs(ThreadingHTTPServer):
    """Answers GET /api/ps with the models the test lists, like `ollama serve` would."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), OllamaPsHandler)
        self.models: list[dict] = []

    @property
    def port(self) -> int:
        return self.server_address[1]


class OllamaPsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        found = self.path == "/api/ps"
        body = json.dumps({"models": self.server.models} if found else {"error": "not found"}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def ollama() -> Iterator[OllamaPs]:
    server = OllamaPs()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def scrape(server: OllamaPs) -> protocol.ServerCounters:
    """What the supervisor's scrape does for an Ollama deployment: GET metrics_url, adapter.counters(body)."""
    adapter = ADAPTERS["ollama"]
    status, body = http_call(adapter.metrics_url(server.port), timeout=5)
    assert status == 200, body
    return adapter.counters(body)


@pytest.fixture
def ready(alice) -> Deployment:
    """An Ollama deployment that loaded its model (the agent scrapes /api/ps from here on), on the seed server's
    hardware reported by a real agent (a simulated node would run the plan on the simulated backend)."""
    Node.objects.filter(pk=seed_server().pk).update(simulated=False)
    d = deploy.create_deployment(
        planned("Qwen2.5-7B-Instruct", max_model_len=4096, backend="ollama"), 0, alice
    )
    assert d.launch_command().backend == "ollama"
    d.move_to(DeploymentState.READY)
    return d


def send_metrics(d: Deployment, counters: protocol.ServerCounters, t: float | None = None) -> None:
    """The agent's Metrics frame for these counters, validated and stored as the server's ingest stores it."""
    node = Node.objects.get(pk=d.node_id)
    seq = node.last_seq + 1
    frame = protocol.dump(
        protocol.Metrics(
            type="metrics",
            v=protocol.VERSION,
            seq=seq,
            t=t or time.time(),
            deployment=d.pk,
            counters=counters,
        )
    )
    report = protocol.parse_agent_message(frame)
    ingest.store_batch([ingest.Pending(node.pk, seq, [], [], stored, report)])


async def stored(seq: int) -> None:
    """The ack callback; store_batch does not call it (the buffer's flush acks after the write)."""


def unload_alert(d: Deployment) -> Alert | None:
    return Alert.objects.filter(key=f"unload:{d.pk}").first()


def test_it_scrapes_the_unload_overrun_from_a_real_api_ps(ollama):
    now = time.time()
    ollama.models = [loaded("llama3.2:3b", go_time(now + 292 * 365 * 86400, hours=8))]  # OLLAMA_KEEP_ALIVE=-1
    assert scrape(ollama).unload_overdue_s == 0.0
    ollama.models.append(loaded("qwen2.5:7b", go_time(now - 150)))
    assert scrape(ollama).unload_overdue_s == pytest.approx(150, abs=5)
    ollama.models = []
    assert scrape(ollama).model_dump() == dict.fromkeys(protocol.ServerCounters.model_fields)


def test_it_opens_the_stopping_alert_from_api_ps_and_resolves_it_once_the_model_is_gone(ready, ollama):
    ollama.models = [loaded("qwen2.5:7b", go_time(time.time() - ALLOWED - 60))]
    send_metrics(ready, scrape(ollama))
    assert tasks.evaluate_fleet() == 1
    alert = unload_alert(ready)
    assert alert.status == "open" and alert.kind == "unload" and alert.deployment_id == ready.pk
    assert "stuck in 'Stopping...'" in alert.title
    assert (
        alert.cause.startswith("The model has been unloading for 18")
        and f"allowed {ALLOWED:.0f} s" in alert.cause
    )
    assert alert.remedy == PHASES["stopping"].advice
    assert 175 <= alert.evidence["unload_overdue_s"] <= 190
    ollama.models = []  # the runner finally exited
    send_metrics(ready, scrape(ollama))
    assert tasks.evaluate_fleet() == 0
    alert.refresh_from_db()
    assert alert.status == "resolved" and alert.events.last().reason == "the condition cleared"


def test_it_lets_a_normal_unload_and_a_kept_alive_model_be(ready, ollama):
    now = time.time()
    ollama.models = [
        loaded("llama3.2:3b", go_time(now + 292 * 365 * 86400)),
        loaded("qwen2.5:7b", go_time(now - ALLOWED + 30, hours=-7)),
    ]  # unloading for 90 s: allowed
    send_metrics(ready, scrape(ollama))
    assert Deployment.objects.get(pk=ready.pk).last_counters["unload_overdue_s"] == pytest.approx(
        ALLOWED - 30, abs=5
    )
    assert tasks.evaluate_fleet() == 0 and not Alert.objects.exists()


def test_it_does_not_judge_stale_counters_or_a_node_that_went_silent(ready, ollama):
    ollama.models = [loaded("qwen2.5:7b", go_time(time.time() - 3600))]
    send_metrics(ready, scrape(ollama), t=time.time() - 60)  # a scrape from a minute ago, replayed late
    assert tasks.evaluate_fleet() == 0 and unload_alert(ready) is None
    send_metrics(
        ready, scrape(ollama), t=time.time() - 10
    )  # a fresh scrape from an agent whose clock lags 10 s
    assert tasks.evaluate_fleet() == 1 and unload_alert(ready).status == "open"
    silent = timezone.now() - timedelta(seconds=60)
    Node.objects.filter(pk=ready.node_id).update(last_seen=silent)  # the agent stopped reporting
    tasks.evaluate_fleet()
    kinds = dict(Alert.objects.values_list("kind", "status"))
    assert kinds == {"unload": "open", "node-lost": "open"}  # unknown now, not cleared


def test_it_resolves_the_stopping_alert_when_the_deployment_stops(ready, ollama):
    ollama.models = [loaded("qwen2.5:7b", go_time(time.time() - 3600))]
    send_metrics(ready, scrape(ollama))
    tasks.evaluate_fleet()
    ready.move_to(DeploymentState.STOPPED, "stopped by the operator", desired="stopped")
    tasks.evaluate_fleet()
    assert unload_alert(ready).status == "resolved"

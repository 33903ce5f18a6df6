"""Predicted against measured, and the fleet calibration learning from it (issue #14, part 2).

The learning test runs real simulated backends (agents.sim.backend subprocesses) at 0.6 of the rate the planner
predicted, scrapes their /metrics the way the agent does, stores their startup log lines as the agent would,
and checks that the next plan's prediction moves toward the measured rate."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from agents.metrics import counters_from_exposition
from agents.protocol import ServerCounters
from dashboard import calibration, deploy, tasks
from dashboard.choices import DeploymentState
from dashboard.management.commands.calibration_report import END, START
from dashboard.models import Deployment, DeploymentMeasurement, LogChunk, PlanRequest
from dashboard.stack import BASE_DIR, free_port
from placement.calibration import MIN_SAMPLES
from tests.agents.test_simbackend import Sim
from tests.fixtures import fixture_files, read_fixture
from tests.personas import sim_node

pytestmark = pytest.mark.django_db
MODEL = "Llama-3.1-8B-Instruct"
KEY = ("RTX 4090", "vllm", "none")
RATIO = 0.6


def planned() -> PlanRequest:
    row = PlanRequest.objects.create(model_ref=MODEL, max_model_len=8192, backend="vllm", tp=1)
    row = deploy.run_plan_request(row.pk)
    assert row.result and row.result["plans"], row.error
    return row


def single_stream(row: PlanRequest) -> float:
    return row.result["plans"][0]["performance"]["single_stream_tok_s"]


def store_log(deployment: Deployment, lines: list[str]) -> None:
    """As the agent sends a log tail: keyed by its boot id and its next sequence number."""
    seq = LogChunk.objects.filter(node=deployment.node).count() + 1
    LogChunk.objects.create(
        node=deployment.node, source=deployment.pk, boot_id="b", seq=seq, t=timezone.now(), lines=lines
    )


def feed_counters(deployment: Deployment, rate: float, streams: int, seconds: int) -> None:
    """Counters as an agent scrapes them every second from a server generating `rate` tok/s per stream."""
    for second in range(seconds + 1):
        counters = ServerCounters(generation_tokens_total=rate * streams * second, requests_running=streams)
        deployment.record_metrics(1000.0 + second, counters)


@pytest.fixture
def box() -> None:
    sim_node("rtx4090-box", "sim:rtx4090x2")


def test_it_records_startup_lines_and_decode_rates_beside_the_plan(box, alice) -> None:
    row = planned()
    deployment = deploy.create_deployment(row, 0, alice)
    _, body = read_fixture(fixture_files("startup", "vllm_pr17122_*")[0])
    store_log(deployment, body.splitlines())
    feed_counters(deployment, rate=40.0, streams=2, seconds=4)
    m = calibration.measure(deployment)
    plan = row.result["plans"][0]
    assert (m.gpu_model, m.backend, m.link_class, m.fleet_factor) == (*KEY, 1.0)
    assert (m.weights_gib, m.kv_tokens, m.max_concurrency) == (14.9889, 158656, 4.84)
    assert (m.streams, m.stream_tok_s, m.total_tok_s, m.decode_intervals) == (2, 40.0, 80.0, 4)
    rows = {r["quantity"]: r for r in m.comparison()}
    assert rows["weights per GPU (GiB)"]["ratio"] == pytest.approx(14.9889 / plan["weights_gib_per_gpu"])
    assert rows["KV cache (tokens)"]["ratio"] == pytest.approx(158656 / plan["kv_cache_tokens"])
    assert rows["decode per stream (tok/s)"]["ratio"] == pytest.approx(40.0 / plan["decode_tok_s"])


def test_it_shows_predicted_against_measured_on_the_deployment_page(box, alice, client) -> None:
    deployment = deploy.create_deployment(planned(), 0, alice)
    feed_counters(deployment, rate=25.0, streams=1, seconds=3)
    client.force_login(alice)
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert "Predicted against measured" in page and "decode per stream (tok/s)" in page
    ratio = 25.0 / single_stream(deployment.plan_request)
    assert f'<td class="ratio">{ratio:.2f}</td>' in page
    data = calibration.predicted_vs_measured(deployment)
    assert data["rows"][2]["measured"] == 25.0 and data["calibration_key"]["gpu"] == "RTX 4090"


def test_it_measures_running_and_recently_ended_deployments_on_the_beat(box, alice) -> None:
    row = planned()
    running, old, recent = (deploy.create_deployment(row, 0, alice) for _ in range(3))
    running.move_to(DeploymentState.SERVING)
    long_ago = timezone.now() - calibration.RECENT * 2
    Deployment.objects.filter(pk=old.pk).update(state=DeploymentState.STOPPED, state_since=long_ago)
    Deployment.objects.filter(pk=recent.pk).update(state=DeploymentState.STOPPED)
    assert tasks.measure_deployments() == 2
    assert set(DeploymentMeasurement.objects.values_list("pk", flat=True)) == {running.pk, recent.pk}


def test_it_keeps_the_published_calibration_below_the_minimum_sample_count(box, alice) -> None:
    row = planned()
    for _ in range(MIN_SAMPLES - 1):
        deployment = deploy.create_deployment(row, 0, alice)
        feed_counters(deployment, rate=single_stream(row) / 3, streams=1, seconds=3)
        calibration.measure(deployment)
    assert calibration.fleet_factors() == ()
    assert single_stream(planned()) == pytest.approx(single_stream(row))
    (only,) = calibration.calibration_rows()
    assert only.samples == MIN_SAMPLES - 1 and not only.in_use


class Backends:
    """Simulated vLLM servers started for the learning test, stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.sims = tmp_path, []

    def start(self, rate: float) -> Sim:
        n, port = len(self.sims), free_port()
        stdout, log_file = self.tmp_path / f"out{n}.log", self.tmp_path / f"sim{n}.log"
        argv = [sys.executable, "-m", "agents.sim.backend", "--port", str(port), "--model", MODEL]
        argv += ["--tokens-per-s", f"{rate:.3f}", "--load-seconds", "0.2", "--stats-interval", "1"]
        argv += ["--kv-cache-tokens", "60000", "--max-model-len", "8192", "--log-file", str(log_file)]
        with stdout.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=BASE_DIR, stdout=out, stderr=subprocess.STDOUT)
        sim = Sim(port, proc, stdout, log_file)
        self.sims.append(sim)
        return sim

    def stop(self) -> None:
        for sim in self.sims:
            if sim.proc.poll() is None:
                sim.proc.terminate()
                sim.proc.wait(10)


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[Backends]:
    started = Backends(tmp_path)
    yield started
    started.stop()


def complete(sim: Sim, max_tokens: int) -> None:
    payload = {"model": MODEL, "prompt": "Say hello to the cluster", "max_tokens": max_tokens}
    response = httpx.post(f"{sim.url}/v1/completions", json=payload, timeout=60)
    assert response.status_code == 200, response.text


def serve_and_scrape(pairs: list[tuple[Sim, Deployment]], seconds: float) -> None:
    """One request per server generating for `seconds`; every /metrics scraped each 0.5 s into its deployment's
    metrics (in this thread: the test database lives in its connection), then the servers' logs stored."""
    requests = []
    for sim, deployment in pairs:
        rate = float(deployment.launch["options"]["sim_tokens_per_s"])
        requests.append(threading.Thread(target=complete, args=(sim, int(rate * seconds)), daemon=True))
        requests[-1].start()
    while any(r.is_alive() for r in requests):
        for sim, deployment in pairs:
            text = httpx.get(f"{sim.url}/metrics", timeout=5).text
            deployment.record_metrics(time.time(), counters_from_exposition(text))
        time.sleep(0.5)
    for sim, deployment in pairs:
        store_log(deployment, sim.stdout.read_text(encoding="utf-8").splitlines())


@pytest.mark.slow
def test_it_moves_the_next_prediction_toward_what_the_fleet_measured(box, alice, backends, tmp_path) -> None:
    row = planned()
    predicted = single_stream(row)
    # The simulated servers run at 0.6 of the predicted rate: far from both edges of the 1.5x checks below
    # (0.49 and 0.67), so a loaded machine's few percent of slower decoding cannot cross either (at 0.5 a CI
    # run measured 0.485 and fell out of the 1.5x line).
    measured_rate = predicted * RATIO
    deployments = [deploy.create_deployment(row, 0, alice) for _ in range(MIN_SAMPLES + 1)]
    sims = []
    for d in deployments:
        d.launch["options"]["sim_tokens_per_s"] = measured_rate
        sims.append(backends.start(measured_rate))
    for sim in sims:
        sim.wait_ready()
    serve_and_scrape(list(zip(sims, deployments, strict=True)), seconds=3.0)
    for d in deployments:
        m = calibration.measure(d)
        assert m.decode_intervals >= 3 and m.decode_ratio == pytest.approx(RATIO, rel=0.15), m.__dict__
        assert m.kv_tokens == 60000  # read from the simulated server's "GPU KV cache size" line
    ((gpu, backend, link, factor),) = calibration.fleet_factors()
    assert (gpu, backend, link) == KEY and 0.65 < factor < 0.85  # shrunk: 4 samples at 0.6 -> 0.6 ** (4 / 8)
    again = planned()
    assert single_stream(again) == pytest.approx(predicted * factor, rel=0.01)
    assert abs(single_stream(again) - measured_rate) < abs(predicted - measured_rate)
    assert any(
        "fleet's measured deployments" in a for a in again.result["plans"][0]["performance"]["assumes"]
    )
    (report,) = calibration.calibration_rows()
    assert report.samples == MIN_SAMPLES + 1 and report.in_use
    # at 0.6 the published figure misses 1.5x everywhere; the fleet factor (left-one-out: 3 samples and the
    # 4 prior ones, 0.6 ** (3 / 7) = 0.80) brings them to 0.6 ** (4 / 7) = 0.75, inside the 1.5x line (0.67)
    # as long as the measured ratio stays above 0.49, and all within 2x
    assert report.published_within_1_5 == 0.0 < report.fleet_within_1_5 and report.fleet_within_2 == 1.0
    docs = tmp_path / "placement.md"
    docs.write_text(f"# Placement\n\n{START}\nold\n{END}\n\nrest\n", encoding="utf-8")
    call_command("calibration_report", "--output", str(docs))
    written = docs.read_text(encoding="utf-8")
    assert "| RTX 4090 / vllm / TP over none | 4 |" in written and "old" not in written
    assert written.endswith(f"{END}\n\nrest\n")


def test_it_refuses_a_docs_file_without_the_markers(tmp_path) -> None:
    docs = tmp_path / "placement.md"
    docs.write_text("# Placement\n", encoding="utf-8")
    with pytest.raises(CommandError, match="must hold one"):
        call_command("calibration_report", "--output", str(docs))
    assert docs.read_text(encoding="utf-8") == "# Placement\n"


def test_it_lists_the_calibration_on_its_page(box, alice, client) -> None:
    row = planned()
    for _ in range(MIN_SAMPLES):
        deployment = deploy.create_deployment(row, 0, alice)
        feed_counters(deployment, rate=single_stream(row) * 1.5, streams=1, seconds=3)
        calibration.measure(deployment)
    client.force_login(alice)
    page = client.get("/calibration/").content.decode()
    factor = 1.5 ** (MIN_SAMPLES / (MIN_SAMPLES + 4))
    assert 'data-key="RTX 4090|vllm|none"' in page and f'<td class="factor">{factor:.2f}</td>' in page

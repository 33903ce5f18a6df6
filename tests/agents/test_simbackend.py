"""The simulated backend as a real subprocess: OpenAI API, counted /metrics, vLLM log lines, faults."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from agents.logscan import scan_log
from agents.metrics import counters_from_exposition, rates
from agents.protocol import ServerCounters
from dashboard.stack import BASE_DIR, free_port

MODEL = "sim/TinyLlama-1.1B"


@dataclass
class Sim:
    port: int
    proc: subprocess.Popen
    stdout: Path
    log_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.stdout.read_text(encoding="utf-8")

    def counters(self) -> ServerCounters:
        return counters_from_exposition(httpx.get(f"{self.url}/metrics", timeout=5).text)

    def complete(self, max_tokens: int, **body) -> dict:
        payload = {"model": MODEL, "prompt": "Say hello to the cluster", "max_tokens": max_tokens, **body}
        response = httpx.post(f"{self.url}/v1/completions", json=payload, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def wait_ready(self, timeout: float = 15.0) -> None:
        wait_for(lambda: self._healthy(), timeout, "the simulated backend to answer /health")

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.log()}"
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    started: list[Sim] = []

    def start(*args: str, tokens_per_s: float = 50, ready: bool = True) -> Sim:
        port, n = free_port(), len(started)
        stdout, log_file = tmp_path / f"stdout{n}.log", tmp_path / f"sim{n}.log"
        argv = [
            sys.executable,
            "-m",
            "agents.sim.backend",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--tokens-per-s",
            str(tokens_per_s),
            "--load-seconds",
            "0.2",
            "--stats-interval",
            "0.5",
            "--log-file",
            str(log_file),
            *args,
        ]
        with stdout.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=BASE_DIR, stdout=out, stderr=subprocess.STDOUT)
        sim = Sim(port, proc, stdout, log_file)
        started.append(sim)
        if ready:
            sim.wait_ready()
        return sim

    yield start
    for sim in started:
        if sim.proc.poll() is None:
            sim.proc.terminate()
            try:
                sim.proc.wait(10)
            except subprocess.TimeoutExpired:
                sim.proc.kill()
                sim.proc.wait()


@dataclass
class Stream:
    """A streamed completion read in a thread: token texts with their arrival times."""

    sim: Sim
    body: dict
    path: str = "/v1/completions"
    tokens: list[tuple[float, str]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> Stream:
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        try:
            payload = {"model": MODEL, "stream": True, **self.body}
            with httpx.stream("POST", f"{self.sim.url}{self.path}", json=payload, timeout=60) as response:
                for line in response.iter_lines():
                    self._on_line(line)
        except BaseException as exc:  # reported by finish()
            self.error = exc
        finally:
            self.done.set()

    def _on_line(self, line: str) -> None:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return
        event = json.loads(line.removeprefix("data: "))
        self.events.append(event)
        for choice in event["choices"]:
            text = choice.get("text", choice.get("delta", {}).get("content"))
            if text:
                self.tokens.append((time.monotonic(), text))

    def finish(self, timeout: float = 30) -> Stream:
        assert self.done.wait(timeout), f"stream still open after {timeout} s"
        assert self.error is None, self.error
        return self


# ---- serving ---------------------------------------------------------------------------------------


def test_it_completes_exactly_max_tokens_at_the_requested_rate(start_sim) -> None:
    sim = start_sim(tokens_per_s=50)
    started = time.monotonic()
    answer = sim.complete(25)
    elapsed = time.monotonic() - started
    text = answer["choices"][0]["text"]
    assert len(text.split()) == 25 == answer["usage"]["completion_tokens"]
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["prompt_tokens"] == 5  # "Say hello to the cluster"
    assert "simulated" in answer["system_fingerprint"]
    assert 0.4 <= elapsed < 1.0  # 25 tokens at 50/s: 0.5 s


def test_it_streams_tokens_at_the_requested_rate(start_sim) -> None:
    sim = start_sim(tokens_per_s=40)
    stream = Stream(sim, {"prompt": "Count", "max_tokens": 40}).start().finish()
    assert len(stream.tokens) == 40
    assert stream.events[-1]["choices"][0]["finish_reason"] == "length"
    (first, _), (last, _) = stream.tokens[0], stream.tokens[-1]
    assert 39 / (last - first) == pytest.approx(40, rel=0.2)


def test_it_streams_chat_with_usage(start_sim) -> None:
    sim = start_sim()
    body = {
        "messages": [{"role": "user", "content": "Hi there!"}],
        "max_tokens": 6,
        "stream_options": {"include_usage": True},
    }
    stream = Stream(sim, body, "/v1/chat/completions").start().finish()
    assert stream.events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in stream.events)
    assert "".join(text for _, text in stream.tokens).split() == [
        "this",
        "text",
        "comes",
        "from",
        "a",
        "simulated",
    ]
    # 3 tokens ("Hi", "there", "!") + 4 for the message + 2 for the assistant turn
    assert stream.events[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}


def test_it_answers_chat_without_streaming(start_sim) -> None:
    sim = start_sim(tokens_per_s=200)
    response = httpx.post(
        f"{sim.url}/v1/chat/completions",
        timeout=10,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_completion_tokens": 3,
        },
    )
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "this text comes"}


def test_it_says_it_is_simulated(start_sim) -> None:
    sim = start_sim()
    card = httpx.get(f"{sim.url}/v1/models", timeout=5).json()["data"][0]
    assert card["id"] == MODEL and "SIMULATED" in card["owned_by"]
    assert "SIMULATED inference backend" in sim.log().splitlines()[0]
    assert "Uvicorn running on http://127.0.0.1:" in sim.log()
    assert sim.log_file.read_text() == sim.log()  # --log-file gets the same lines


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "The model `other` does not exist."),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be a positive integer"),
        ("/v1/completions", {"prompt": {"text": "x"}}, 400, "prompt must be a string or a list of token ids"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n must be 1"),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": 5000},
            400,
            "maximum context length is 4096 tokens",
        ),
        ("/v1/chat/completions", {"messages": []}, 400, "messages must be a non-empty list"),
        ("/v1/completions", "not json", 400, "request body is not JSON"),
        ("/sim/fault", {"fault": "crash"}, 400, "fault must be one of none, stall, idle-hang at run time"),
    ],
)
def test_it_refuses_bad_requests(start_sim, path, body, status, message) -> None:
    sim = start_sim()
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    response = httpx.post(f"{sim.url}{path}", content=content, timeout=5)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]


def test_it_refuses_unknown_routes(start_sim) -> None:
    sim = start_sim()
    assert httpx.get(f"{sim.url}/v1/engines", timeout=5).status_code == 404
    assert httpx.get(f"{sim.url}/v1/completions", timeout=5).status_code == 405


def test_it_refuses_bad_arguments() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.sim.backend",
            "--port",
            "8000",
            "--model",
            "m",
            "--tokens-per-s",
            "10",
            "--fault",
            "nccl-init-hang",
        ],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2 and "--fault nccl-init-hang needs --tp 2 or more" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "agents.sim.backend", "--port", "8000", "--model", "m", "--tokens-per-s", "0"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2 and "--tokens-per-s: must be > 0" in run.stderr


# ---- metrics -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_it_counts_in_metrics_what_it_generated(start_sim) -> None:
    sim = start_sim("--max-num-seqs", "2", tokens_per_s=20)
    assert sim.counters().generation_tokens_total == 0
    streams = [Stream(sim, {"prompt": "one two three", "max_tokens": 40}).start() for _ in range(3)]
    wait_for(lambda: sim.counters().requests_waiting == 1, 5, "the third request to wait for a slot")
    busy = sim.counters()
    assert busy.requests_running == 2 and busy.kv_cache_usage > 0
    t0, before = time.monotonic(), sim.counters()
    time.sleep(1.0)
    t1, after = time.monotonic(), sim.counters()
    assert rates(before, t0, after, t1)["generation_tokens_per_s"] == pytest.approx(40, rel=0.25)  # 2 x 20
    for stream in streams:
        assert len(stream.finish().tokens) == 40
    answer = sim.complete(7)
    c = sim.counters()
    assert c.generation_tokens_total == 3 * 40 + 7 == 120 + answer["usage"]["completion_tokens"]
    assert c.prompt_tokens_total == 3 * 3 + answer["usage"]["prompt_tokens"]
    assert c.ttft_seconds_count == c.requests_finished_total == 4
    assert c.itl_seconds_count == c.generation_tokens_total - 4  # one gap fewer than tokens per request
    assert c.itl_seconds_sum / c.itl_seconds_count == pytest.approx(1 / 20, rel=0.25)
    assert c.steps_total >= 40 + 40 + 7  # the waiting request ran after the first two
    assert (c.requests_running, c.requests_waiting, c.kv_cache_usage) == (0, 0, 0)


# ---- log lines -------------------------------------------------------------------------------------


def scanned(sim: Sim, verdict: str, silent_for: float = 0.0, timeout: float = 8.0):
    """Wait until the log classifier reaches `verdict` on the log printed so far; return its result."""

    def judge():
        result = scan_log(sim.log(), silent_for=silent_for)
        return result if result.verdict == verdict else None

    return wait_for(judge, timeout, f"logscan to say {verdict}; it says {scan_log(sim.log()).to_json()}")


def stats_lines(sim: Sim) -> list[str]:
    return [line for line in sim.log().splitlines() if "Avg generation throughput" in line]


@pytest.mark.slow
def test_it_logs_like_a_healthy_vllm_while_serving(start_sim) -> None:
    sim = start_sim(tokens_per_s=20)
    stream = Stream(sim, {"prompt": "Write", "max_tokens": 50}).start()
    wait_for(
        lambda: len([s for s in stats_lines(sim) if "Running: 1 reqs" in s]) >= 3, 6, "3 busy stats lines"
    )
    result = scan_log(sim.log())
    assert (result.verdict, result.backend, result.phase) == ("healthy", "vllm", "serving")
    busy = [s for s in stats_lines(sim) if "Running: 1 reqs" in s]
    assert "Avg generation throughput: 0.0 tokens/s" not in busy[1]
    stream.finish()
    assert scan_log(sim.log()).verdict == "healthy"


@pytest.mark.slow
def test_it_stalls_on_the_first_request_until_sigusr1(start_sim) -> None:
    sim = start_sim("--fault", "stall", tokens_per_s=50)
    assert httpx.get(f"{sim.url}/v1/models", timeout=5).status_code == 200  # serves normally until a request
    stream = Stream(sim, {"prompt": "Hello", "max_tokens": 10}).start()
    result = scanned(sim, "hang")
    assert result.findings[0].signature == "stalled-zero-generation"
    stalled = [s for s in stats_lines(sim) if "Running: 1 reqs" in s]
    assert len(stalled) >= 2
    assert all("Avg generation throughput: 0.0 tokens/s" in s for s in stalled)
    c = sim.counters()
    assert (c.requests_running, c.generation_tokens_total) == (1, 0)
    assert httpx.get(f"{sim.url}/health", timeout=5).status_code == 200  # like vLLM: healthy while stuck
    assert stream.tokens == []

    sim.proc.send_signal(signal.SIGUSR1)
    assert len(stream.finish().tokens) == 10
    assert sim.counters().generation_tokens_total == 10
    scanned(sim, "healthy")  # the next stats line shows progress: the hang is over

    sim.proc.send_signal(signal.SIGUSR1)  # and on again
    wait_for(lambda: httpx.get(f"{sim.url}/sim/fault", timeout=5).json()["fault"] == "stall", 5, "stall on")
    again = Stream(sim, {"prompt": "Hello", "max_tokens": 5}).start()
    scanned(sim, "hang")
    assert again.tokens == []
    sim.proc.send_signal(signal.SIGUSR1)
    assert len(again.finish().tokens) == 5


@pytest.mark.slow
def test_it_stalls_and_resumes_by_post(start_sim) -> None:
    sim = start_sim(tokens_per_s=50)
    sim.complete(5)
    switch = httpx.post(f"{sim.url}/sim/fault", json={"fault": "stall"}, timeout=5)
    assert switch.json() == {"fault": "stall", "simulated": True}
    stream = Stream(sim, {"prompt": "Hello", "max_tokens": 20}).start()
    wait_for(lambda: sim.counters().requests_running == 1, 5, "the request to run")
    frozen = sim.counters().generation_tokens_total
    time.sleep(0.6)
    assert sim.counters().generation_tokens_total == frozen == 5
    scanned(sim, "hang")

    assert httpx.post(f"{sim.url}/sim/fault", json={"fault": "none"}, timeout=5).json()["fault"] == "none"
    assert len(stream.finish().tokens) == 20
    assert sim.counters().generation_tokens_total == 25
    scanned(sim, "healthy")


@pytest.mark.slow
def test_it_answers_health_and_metrics_but_never_generates_while_idle_hung(start_sim) -> None:
    sim = start_sim("--fault", "idle-hang")
    assert httpx.get(f"{sim.url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{sim.url}/sim/fault", timeout=5).json() == {"fault": "idle-hang", "simulated": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{sim.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=1
        )
    held = Stream(sim, {"prompt": "Hello", "max_tokens": 3}).start()
    time.sleep(0.3)
    c = sim.counters()
    assert (c.requests_running, c.requests_waiting, c.generation_tokens_total) == (
        0,
        0,
        0,
    )  # the engine saw none
    assert held.tokens == []
    assert httpx.post(f"{sim.url}/sim/fault", json={"fault": "none"}, timeout=5).json()["fault"] == "none"
    assert len(held.finish().tokens) == 3  # released, served
    assert sim.complete(2)["usage"]["completion_tokens"] == 2


@pytest.mark.slow
def test_it_hangs_in_nccl_init(start_sim) -> None:
    sim = start_sim("--tp", "2", "--fault", "nccl-init-hang", ready=False)
    wait_for(lambda: "via P2P/CUMEM" in sim.log(), 10, "the NCCL channel lines")
    time.sleep(1.0)
    assert sim.proc.poll() is None
    with pytest.raises(httpx.ConnectError):  # never ready: the port is not even open
        httpx.get(f"{sim.url}/health", timeout=1)
    log = sim.log()
    assert "Loading weights" not in log and "Init COMPLETE" not in log
    by_content = scan_log(log)
    assert (by_content.verdict, by_content.phase) == ("healthy", "nccl-init")
    after_silence = scan_log(log, silent_for=301)
    assert (after_silence.verdict, after_silence.phase) == ("hang", "nccl-init")
    assert after_silence.findings[0].signature == "no-progress-nccl-init"
    sim.proc.terminate()
    assert sim.proc.wait(10) == 0


def test_it_sets_up_nccl_then_serves_with_tp(start_sim) -> None:
    sim = start_sim("--tp", "2")
    log = sim.log()
    assert log.count("Init COMPLETE") == 2 and "world_size=2 rank=1" in log
    assert log.index("Init COMPLETE") < log.index("Loading weights took") < log.index("Uvicorn running on")
    assert scan_log(log).verdict == "healthy"


@pytest.mark.slow
def test_it_crashes_after_the_given_time(start_sim) -> None:
    sim = start_sim("--fault", "crash", "--crash-after", "1.5")
    assert sim.complete(3)["usage"]["completion_tokens"] == 3  # serves until then
    assert sim.proc.wait(10) == 1
    log = sim.log()
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    assert "SIMULATED" in log.splitlines()[-3]
    result = scan_log(log)
    assert result.verdict == "failure"
    assert {f.signature for f in result.findings} >= {"cuda-error", "vllm-engine-dead"}


def test_it_shuts_down_cleanly_on_sigterm(start_sim) -> None:
    sim = start_sim()
    sim.proc.terminate()
    assert sim.proc.wait(10) == 0
    assert sim.log().splitlines()[-1].endswith(f"Finished server process [{sim.proc.pid}]")
    assert scan_log(sim.log()).phase == "stopped"

"""A real Prometheus (Debian's `prometheus` package) scraping the test server, and agents whose readings the
tests know: the real agent code in a thread of the test process, with simulated GPUs that record every sample."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agents.protocol import GpuReading
from agents.runner import Agent
from agents.sim.gpus import SimSource
from dashboard import stack

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def prometheus_config(targets: dict[str, tuple[str, str]]) -> str:
    """One scrape job per name: (host:port, bearer token). JSON is YAML, so Prometheus reads it as it is."""
    jobs = [
        {
            "job_name": name,
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "metrics_path": "/metrics",
            "authorization": {"type": "Bearer", "credentials": token},
            "static_configs": [{"targets": [target]}],
        }
        for name, (target, token) in targets.items()
    ]
    return json.dumps(
        {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": jobs}
    )


def start_prometheus(directory: Path, targets: dict[str, tuple[str, str]]) -> tuple[stack.Service, str]:
    """Its own config, storage and random port; returns the service and its URL once it is ready."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "prometheus.yml"
    config.write_text(prometheus_config(targets))
    port = stack.free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    service = stack.Service("prometheus", argv, log_path=directory / "prometheus.log").start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {service.log_tail()}")
        try:
            if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                return service, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    service.stop()
    raise TimeoutError(f"prometheus not ready after 60 s: {service.log_tail()}")


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus's HTTP API; a PromQL error fails with Prometheus's message."""
    response = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=10)
    body = response.json()
    if body.get("status") != "success":
        raise AssertionError(f"{promql!r}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def series(url: str, promql: str) -> dict[frozenset, float]:
    """label set (without __name__, job, instance) -> value."""
    hidden = {"__name__", "job", "instance"}
    return {
        frozenset((k, v) for k, v in r["metric"].items() if k not in hidden): float(r["value"][1])
        for r in query(url, promql)
    }


def targets(url: str) -> dict[str, dict]:
    active = httpx.get(url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return {t["labels"]["job"]: t for t in active}


class RecordingSource(SimSource):
    """Simulated GPUs that keep every reading they hand to the agent: the values the agent sent."""

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self.sent: list[list[GpuReading]] = []

    def sample(self) -> list[GpuReading]:
        readings = super().sample()
        self.sent.append(readings)
        return readings

    def values_sent(self, index: int, field: str) -> set[float]:
        return {getattr(readings[index], field) for readings in self.sent}


class AgentThread:
    """The real agent (agents.runner.Agent) on its own event loop in a thread; `call` runs a function there."""

    def __init__(self, server: str, token: str, source: SimSource, interval: float = 0.5) -> None:
        self.source = source
        self.loop = asyncio.new_event_loop()
        self.agent: Agent | None = None
        self.thread = threading.Thread(target=self._run, args=(server, token, interval), daemon=True)
        self.task: asyncio.Task | None = None

    def _run(self, server: str, token: str, interval: float) -> None:
        asyncio.set_event_loop(self.loop)
        self.agent = Agent(server, token, self.source, interval)
        self.task = self.loop.create_task(self.agent.run())
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self.task)

    def start(self) -> AgentThread:
        self.thread.start()
        return self

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run `fn` on the agent's loop (the agent's outbox and the source are not thread-safe)."""
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args, **kwargs)
            finally:
                done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(10), f"{fn} did not run on the agent's loop"

    def stop(self) -> None:
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(timeout=10)

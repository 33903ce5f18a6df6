"""Helpers for end-to-end tests: nodes with tokens, agent subprocesses, waiting on the database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import websockets
from django.test import Client

from dashboard import stack
from dashboard.models import AgentToken, Node


def node_with_token(name: str) -> tuple[Node, str]:
    node = Node.objects.create(name=name)
    return node, AgentToken.issue(node)[1]


def start_agent(
    server: str,
    token: str,
    spec: str,
    log_dir: Path,
    interval: float = 0.5,
    run_dir: Path | None = None,
    model_dirs: tuple[Path, ...] = (),
) -> stack.Service:
    extra = [
        *(["--run-dir", str(run_dir)] if run_dir else []),
        *(a for d in model_dirs for a in ("--model-dir", str(d))),
    ]
    log = log_dir / f"agent-{spec.replace(':', '-').replace(',', '-')}.log"
    return stack.agent_service(server, token, spec, interval, log, extra).start()


def end_servers_left_in(run_dir: Path) -> None:
    """Kill the inference servers an agent started from `run_dir`: they outlive the agent by design."""
    for state in run_dir.glob("*.json"):
        pid = json.loads(state.read_text()).get("pid")
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def login(client, username: str, password: str) -> None:
    """Log an httpx client in through the real login form (CSRF and all)."""
    client.get("/accounts/login/")
    form = {"username": username, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]}
    response = client.post("/accounts/login/", data=form)
    assert response.status_code == 302, response.text[:500]


def csrf_post(client, url: str, data: dict | None = None):
    return client.post(url, data={**(data or {}), "csrfmiddlewaretoken": client.cookies["csrftoken"]})


def wait_until(check: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def browser_messages(url: str, sessionid: str, count: int, timeout: float = 20.0) -> list[dict]:
    """Connect to the browsers' live feed as a logged-in user and collect `count` fleet updates."""
    ws_url = url.replace("http://", "ws://") + "/ws/fleet/"
    headers = {"Cookie": f"sessionid={sessionid}", "Origin": url}
    updates: list[dict] = []
    async with websockets.connect(ws_url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "subscribe", "nodes": "all"}))
        async with asyncio.timeout(timeout):
            while len(updates) < count:
                message = json.loads(await ws.recv())
                if message["type"] == "fleet.update":
                    updates.append(message)
    return updates

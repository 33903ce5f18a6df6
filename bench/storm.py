"""Restart the ASGI server under load and time the reconnect storm (issue #13, item 4).

    .venv/bin/python bench/storm.py --agents 1000 [--gpus 8] [--warmup 10] [--after 30] [--json]

The real stack (embedded Redis, uvicorn, SQLite) and N agents (the real agent code, in one helper process,
as bench/ingest.py runs them). Once every node is live in a logged-in browser client and `--warmup` seconds
have passed, the uvicorn process is stopped (SIGTERM) and started again on the same port. `stop_s`: until
the old process is gone, `server_down_s`: until the new one listens; `all_live_s`: from the stop until the browser client (reconnecting itself) has had a fresh value of every node from the new
process; `lost`: GPU samples the agents sent minus those stored, after they drained their outboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import make_fleet, setup_django, stored_samples, versions  # noqa: E402


class Browser:
    """A logged-in live-feed client that reconnects, noting when it last heard of each node."""

    def __init__(self, url: str, sessionid: str) -> None:
        self.url, self.sessionid = url, sessionid
        self.heard: dict[int, float] = {}  # node -> when a value of it last came
        self.online: set[int] = set()  # nodes announced online (before the agents send values)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        import websockets

        headers = {"Cookie": f"sessionid={self.sessionid}", "Origin": self.url}
        while not self.stop.is_set():
            try:
                async with websockets.connect(
                    self.url.replace("http", "ws", 1) + "/ws/fleet/",
                    additional_headers=headers,
                    max_size=None,
                ) as ws:
                    await self.listen(ws)
            except (OSError, websockets.WebSocketException):
                await asyncio.sleep(0.2)

    async def listen(self, ws) -> None:
        await ws.send(json.dumps({"type": "subscribe", "nodes": "all"}))  # every node's values
        while not self.stop.is_set():
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=0.5))
            except TimeoutError:
                continue
            self.note(message)

    def note(self, message: dict) -> None:
        if message["type"] == "fleet.update":
            for node in message["nodes"]:
                self.heard[node["node"]] = time.monotonic()
        elif message["type"] == "fleet.node" and message["status"] == "online":
            self.online.add(message["node"])

    def live_since(self, moment: float) -> int:
        return sum(1 for t in self.heard.values() if t > moment)


async def wait_for(check, timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.1)


async def storm(
    args: argparse.Namespace, server, restart, tokens: list[str], sessionid: str, log: Path
) -> dict:
    browser = Browser(server, sessionid)
    watcher = asyncio.create_task(browser.run())
    (log / "tokens").write_text("\n".join(tokens))
    ready = log / "ready"
    seconds = args.warmup + args.after
    argv = [sys.executable, str(ROOT / "bench" / "ingest.py"), "--role", "agents", "--server", server]
    argv += ["--tokens", str(log / "tokens"), "--ready-file", str(ready), "--agents", str(args.agents)]
    argv += ["--gpus", str(args.gpus), "--interval", str(args.interval), "--seconds", str(seconds)]
    agents = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        await wait_for(lambda: len(browser.online) >= len(tokens), 600, "every node online")
        ready.touch()
        await asyncio.sleep(args.warmup)
        stopped = time.monotonic()
        down = await asyncio.to_thread(restart)
        await wait_for(
            lambda: browser.live_since(stopped) >= len(tokens), args.after, "every node live again"
        )
        all_live = time.monotonic() - stopped
        out, _ = await agents.communicate()
    finally:
        if agents.returncode is None:
            agents.kill()
            await agents.wait()
        browser.stop.set()
        await watcher
    return {**json.loads(out), "all_live_s": round(all_live, 2), **down}


def run(args: argparse.Namespace) -> dict:
    from dashboard import stack

    with tempfile.TemporaryDirectory(prefix="lc-bench-storm-") as tmp:
        log = Path(tmp)
        setup_django(log / "bench.sqlite3")
        redis_port, port = stack.free_port(), stack.free_port()
        services = [stack.redis_service(redis_port, log).start()]
        try:
            stack.wait_for_port(redis_port)
            env = {
                "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "DATABASE_URL": os.environ["DATABASE_URL"],
            }
            services.append(stack.asgi_service(port, env, log).start())
            stack.wait_for_port(port)

            def restart() -> dict[str, float]:
                began = time.monotonic()
                services.pop().stop()
                stopped = time.monotonic()
                services.append(stack.asgi_service(port, env, log).start())
                stack.wait_for_port(port)
                return {
                    "stop_s": round(stopped - began, 2),
                    "server_down_s": round(time.monotonic() - began, 2),
                }

            tokens, sessionid = make_fleet(args.agents)
            outcome = asyncio.run(storm(args, f"http://127.0.0.1:{port}", restart, tokens, sessionid, log))
            stored = stored_samples()
        finally:
            for service in reversed(services):
                service.stop()
    sent = outcome["sent_gpu_samples"]
    return {
        "agents": args.agents,
        "gpus_per_agent": args.gpus,
        "all_live_s": outcome["all_live_s"],
        "stop_s": outcome["stop_s"],  # SIGTERM until the old process is gone
        "server_down_s": outcome["server_down_s"],  # until the new one listens: no agent can beat it
        "sent": sent,
        "stored": stored,
        "lost": sent - stored,
        "unacked_frames_at_end": outcome["unacked_frames"],
        "connect_s": outcome["connect_s"],
        "versions": versions(),
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8, choices=[2, 4, 8])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of steady state before the restart"
    )
    parser.add_argument(
        "--after", type=float, default=60.0, help="seconds allowed for every node to be live again"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.agents < 1:
        parser.error("--agents must be at least 1")
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

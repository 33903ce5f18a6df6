"""Restart the ASGI server under load and time the reconnect storm (issue #13, item 4).

    .venv/bin/python bench/storm.py --agents 1000 [--gpus 8] [--warmup 10] [--after 30] [--json]

The real stack (embedded Redis, uvicorn, SQLite) and N agents (the real agent code, in one helper process,
as bench/ingest.py runs them). Once every node is live in a logged-in browser client and `--warmup` seconds
have passed, the uvicorn process is stopped (SIGTERM) and started again on the same port. `stop_s`: until
the old process is gone; `server_down_s`: until the new one listens; `browser_back_s`: until the browser
client's socket is open again (it retries as static/js/live.js does); `all_live_s`: from the stop until the
browser client has had a value of every node sampled after the stop, on a socket opened after it (the page
then shows each node online; the value may be a replayed one); `all_fresh_s`: until it has had, of every node, a value
sampled after the new process listened (the backlog replayed); `*_spread_s`: when the nodes came back;
`lost`: GPU samples the agents sent minus those stored, after they drained their outboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import make_fleet, setup_django, stored_samples, versions  # noqa: E402

RECENT_S = 30.0  # static/js/live.js RECENT_MS


class Browser:
    """A logged-in live-feed client that reconnects as the page does (static/js/live.js: within 0.25-0.75 s
    for 30 s after an open socket closed, else a jittered delay from 0.5 s, doubling per failed try), noting
    what it heard of each node and when.

    A value counts for the restart only if it came on a socket opened after the stop: the old process can
    still send a tick in its last moments. `live`: the node's first value sampled after the stop (the page
    then shows it online; a page that subscribes also gets the values of the last 5 s from Redis, which are
    from before the stop and do not count); `fresh`: its first value sampled after the new process listened
    (not a replay of the backlog)."""

    def __init__(self, url: str, sessionid: str) -> None:
        self.url, self.sessionid = url, sessionid
        self.online: set[int] = set()  # nodes announced online (before the agents send values)
        self.stop = asyncio.Event()
        self.after = float("inf")  # monotonic time of the stop: only sockets opened later count
        self.stop_wall = float("inf")  # wall time of the stop: a value sampled before it is not "back"
        self.up_wall = float("inf")  # wall time when the new process listened
        self.live: dict[int, float] = {}  # node -> monotonic time of its first value sampled after the stop
        self.fresh: dict[int, float] = {}  # node -> monotonic time of its first value sampled after `up_wall`
        self.reopened: float | None = None  # when the first socket after the stop opened
        self.welcomed: dict[int, float] = {}  # node -> when the new process announced it online (hello done)

    async def run(self) -> None:
        import websockets

        headers = {"Cookie": f"sessionid={self.sessionid}", "Origin": self.url}
        retry, last_open = 0.5, float("-inf")
        while not self.stop.is_set():
            try:
                async with websockets.connect(
                    self.url.replace("http", "ws", 1) + "/ws/fleet/",
                    additional_headers=headers,
                    max_size=None,
                ) as ws:
                    retry = 0.5
                    try:
                        await self.listen(ws, counts=time.monotonic() > self.after)
                    finally:
                        last_open = time.monotonic()
            except (OSError, websockets.WebSocketException):
                pass
            await asyncio.sleep(self.next_delay(retry, last_open))
            if time.monotonic() - last_open >= RECENT_S:
                retry = min(retry * 2, 15.0)

    @staticmethod
    def next_delay(retry: float, last_open: float) -> float:
        if time.monotonic() - last_open < RECENT_S:  # live.js: a server that answered moments ago
            return 0.25 + random.random() * 0.5
        return retry + random.random() * retry

    async def listen(self, ws, counts: bool) -> None:
        if counts and self.reopened is None:
            self.reopened = time.monotonic()
        await ws.send(json.dumps({"type": "subscribe", "nodes": "all"}))  # every node's values
        while not self.stop.is_set():
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=0.5))
            except TimeoutError:
                continue
            self.note(message, counts)

    def note(self, message: dict, counts: bool) -> None:
        if message["type"] == "fleet.node":
            self.note_status(message, counts)
        elif message["type"] == "fleet.nodes":  # the nodes a hello batch welcomed, in one message
            for status in message["nodes"]:
                self.note_status(status, counts)
        elif message["type"] == "fleet.update" and counts:
            now = time.monotonic()
            for node in message["nodes"]:
                if node["t"] >= self.stop_wall:  # the hub's catch-up of a new page sends values up to 5 s old
                    self.live.setdefault(node["node"], now)
                if node["t"] >= self.up_wall:
                    self.fresh.setdefault(node["node"], now)

    def note_status(self, status: dict, counts: bool) -> None:
        if status["status"] == "online":
            self.online.add(status["node"])
            if counts:  # the new process welcomed this node's agent (its hello is done)
                self.welcomed.setdefault(status["node"], time.monotonic())


def spread(times: dict[int, float], since: float) -> dict[str, float]:
    """When the nodes came back, seconds after `since`: the first, the median, the 90th percentile, the last."""
    ordered = sorted(t - since for t in times.values())
    if not ordered:
        return {}
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)  # noqa: E731
    return {"first": round(ordered[0], 2), "p50": pick(0.5), "p90": pick(0.9), "last": round(ordered[-1], 2)}


async def wait_for(check, timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.1)


async def seconds_until(check, since: float, deadline: float) -> float | None:
    """Seconds from `since` until `check()` holds, or None if it did not by the (monotonic) deadline."""
    while not check():
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)
    return round(time.monotonic() - since, 2)


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
        stopped = browser.after = time.monotonic()
        browser.stop_wall = time.time()
        down = await asyncio.to_thread(restart)
        browser.up_wall = time.time()  # the new process listens: samples from now on are not backlog
        deadline = stopped + args.after
        all_live = await seconds_until(lambda: len(browser.live) >= len(tokens), stopped, deadline)
        all_fresh = await seconds_until(lambda: len(browser.fresh) >= len(tokens), stopped, deadline)
        out, _ = await agents.communicate()
    finally:
        if agents.returncode is None:
            agents.kill()
            await agents.wait()
        browser.stop.set()
        await watcher
    return {
        **json.loads(out),
        **down,
        "all_live_s": all_live,  # None: not every node within --after
        "all_fresh_s": all_fresh,
        "live_within_5s": sum(1 for t in browser.live.values() if t - stopped <= 5.0),
        "browser_back_s": round(browser.reopened - stopped, 2) if browser.reopened else None,
        "welcome_spread_s": spread(browser.welcomed, stopped),
        "live_spread_s": spread(browser.live, stopped),
        "fresh_spread_s": spread(browser.fresh, stopped),
    }


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
        "all_live_s": outcome["all_live_s"],  # every node's first value after the stop (the page: online)
        "all_fresh_s": outcome["all_fresh_s"],  # every node's first value sampled after the new one listened
        "browser_back_s": outcome["browser_back_s"],  # the browser's socket open again (live.js's backoff)
        "live_within_5s": outcome["live_within_5s"],  # nodes live again within the target's 5 s
        "welcome_spread_s": outcome["welcome_spread_s"],  # nodes announced online by the new process
        "live_spread_s": outcome["live_spread_s"],
        "fresh_spread_s": outcome["fresh_spread_s"],
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

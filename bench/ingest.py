"""Ingest benchmark: N simulated agents x G GPUs against the real stack (Redis, uvicorn, database).

    .venv/bin/python bench/ingest.py --agents 50 --gpus 8 --interval 1 --seconds 30 --json

Starts an embedded Redis and the ASGI server on a fresh database, runs N agents (the real agent code,
`agents.runner.Agent` with simulated GPUs, all in one helper process), and a logged-in browser feed
client. The clock starts once every agent is connected and the server has finished their hellos (the
browser client has seen every node announced online): this measures steady state, not the first
connection wave (which stores each node's inventory and topology once; connect_s and settle_s say how
long it took). Prints samples_per_s (GPU samples stored per second), lost (GPU samples sent minus stored),
p99_ingest_to_browser_ms (sample time to browser receipt), and the raw websocket echo capacity of
this machine measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=8, choices=[2, 4, 8])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--processes", type=int, default=1, help="ASGI processes; agent i uses process i mod N"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--log-dir", default="", help="keep the servers' logs here (default: a temp dir)")
    parser.add_argument("--role", default="main", choices=["main", "agents", "echo"], help=argparse.SUPPRESS)
    parser.add_argument("--server", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sample-in-wave", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


SPEC_BY_GPUS = {2: "sim:rtx4090x2", 4: "sim:a30x4", 8: "sim:h100x8"}
WAVE_TIMEOUT_S = 300.0  # the connection wave: how long to wait for every agent's welcome


# ---- role "agents": the simulated fleet, in its own process -------------------------------------------
async def run_agents(
    server: str,
    tokens: list[str],
    gpus: int,
    interval: float,
    seconds: float,
    ready: Path,
    sample_in_wave: bool = False,
) -> dict:
    """`sample_in_wave`: the agents sample from the start, as real agents do (frames wait in the outbox until
    their agent is connected); otherwise only the `seconds` after the ready file (the bare ingest figures)."""
    from agents.gpus import make_source
    from agents.runner import Agent

    servers = server.split(",")
    losses = ConnectionLosses.attach()
    fleet = [
        Agent(servers[i % len(servers)], t, make_source(f"{SPEC_BY_GPUS[gpus]},seed={i}"), interval)
        for i, t in enumerate(tokens)
    ]
    loop = asyncio.get_running_loop()
    began = loop.time()
    sampler = Sampler(fleet, interval)
    if sample_in_wave:
        sampler.start()
    tasks = [asyncio.create_task(a.connect_forever()) for a in fleet]
    with contextlib.suppress(TimeoutError):  # then the numbers say how many had their welcome
        await asyncio.wait_for(asyncio.gather(*(a.connected.wait() for a in fleet)), timeout=WAVE_TIMEOUT_S)
    connected, welcomed = loop.time(), sum(a.connected.is_set() for a in fleet)
    await wait_for_file(ready, timeout=300)
    wave_losses = losses.snapshot()
    start = loop.time()
    await sampler.run_for(seconds)
    await drain(fleet, timeout=30)
    for task in tasks:
        task.cancel()
    pending = sum(len(a.outbox.frames) for a in fleet)
    return {
        "sent_gpu_samples": sampler.ticks * len(fleet) * gpus,
        "unacked_frames": pending,
        "dropped_frames": sum(a.outbox.dropped for a in fleet),
        "connect_s": round(connected - began, 1) if welcomed == len(fleet) else None,
        "connected_after_wave": welcomed,
        "settle_s": round(start - connected, 1),
        "connection_losses_in_wave": wave_losses,  # until the ready file (every node online in the browser)
        "connection_losses": losses.since(wave_losses),  # while sampling, by cause
    }


class Sampler:
    """Every agent takes a sample each interval, in lock-step (the worst case for the server)."""

    def __init__(self, fleet: list, interval: float) -> None:
        self.fleet, self.interval, self.ticks = fleet, interval, 0
        self.task: asyncio.Task | None = None
        self.until: float | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.tick_until_told())

    async def run_for(self, seconds: float) -> None:
        """Sample (on, if started before) until `seconds` from now."""
        self.until = asyncio.get_running_loop().time() + seconds
        if self.task is None:
            self.start()
        await self.task

    async def tick_until_told(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while self.until is None or loop.time() < self.until:
            for agent in self.fleet:
                agent.collect()
            self.ticks += 1
            await asyncio.sleep(max(0.0, start + self.ticks * self.interval - loop.time()))


class ConnectionLosses(logging.Handler):
    """Counts the agents' "connection to ... lost: <why>" warnings by cause (handshake timeout, keepalive ping
    timeout, ...): what an operator would find in 1,000 agent logs, without printing them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    @classmethod
    def attach(cls) -> ConnectionLosses:
        from agents.runner import log as agent_log

        handler = cls()
        agent_log.addHandler(handler)
        return handler

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("connection to") and len(record.args or ()) == 2:
            self.counts[loss_cause(record.args[1])] += 1

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)

    def since(self, before: dict[str, int]) -> dict[str, int]:
        return {
            cause: n - before.get(cause, 0) for cause, n in self.counts.items() if n > before.get(cause, 0)
        }


def loss_cause(exc: object) -> str:
    text = str(exc).split(";")[0].strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def wait_for_file(path: Path, timeout: float) -> None:
    """The main process creates it once its browser client has seen every node announced online."""
    async with asyncio.timeout(timeout):
        while not path.exists():
            await asyncio.sleep(0.1)


async def drain(fleet: list, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while any(a.outbox.frames for a in fleet) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)


# ---- role "echo": a raw websocket echo server, for comparison -------------------------------------------
async def echo_server(port: int) -> None:
    import websockets

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with websockets.serve(echo, "127.0.0.1", port):
        await asyncio.Future()


async def echo_capacity(port: int, seconds: float = 3.0) -> float:
    """Messages per second one client gets echoed, pipelined 100 deep."""
    import websockets

    payload = json.dumps({"type": "samples", "gpus": [{"util_gpu": 50.0}] * 8})
    async with websockets.connect(f"ws://127.0.0.1:{port}") as ws:
        done, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            for _ in range(100):
                await ws.send(payload)
            for _ in range(100):
                await ws.recv()
            done += 100
    return done / (time.monotonic() - start)


# ---- role "main": the stack, the browser client, the numbers --------------------------------------------
async def watch_browser(
    url: str,
    sessionid: str,
    stop: asyncio.Event,
    latencies: list[float],
    transit: list[float],
    online: set[int],
) -> None:
    import websockets

    headers = {"Cookie": f"sessionid={sessionid}", "Origin": url}
    async with websockets.connect(
        url.replace("http", "ws", 1) + "/ws/fleet/", additional_headers=headers, max_size=None
    ) as ws:
        await ws.send(json.dumps({"type": "subscribe", "nodes": "all"}))  # every node's values
        while not stop.is_set():
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=0.5))
            except TimeoutError:
                continue
            now = time.time()
            if message["type"] == "fleet.update":
                latencies.extend((now - n["t"]) * 1000 for n in message["nodes"])
                transit.append((now - message["sent"]) * 1000)
            elif message["type"] in ("fleet.node", "fleet.nodes"):  # hellos' "online": a batch is one message
                online.update(n["node"] for n in message.get("nodes", [message]) if n["status"] == "online")


async def mark_ready(online: set[int], count: int, ready: Path, cpu: CpuClock) -> None:
    while len(online) < count:
        await asyncio.sleep(0.1)
    cpu.start()
    ready.touch()


class CpuClock:
    """CPU seconds of the server processes over the measured window (from /proc), per process."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.began, self.wall = pids, [0.0] * len(pids), 0.0

    def start(self) -> None:
        self.began, self.wall = [cpu_seconds(p) for p in self.pids], time.monotonic()

    def shares(self) -> list[float]:
        wall = max(1e-9, time.monotonic() - self.wall)
        return [
            round(100 * (cpu_seconds(p) - b) / wall, 1) for p, b in zip(self.pids, self.began, strict=True)
        ]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def setup_django(db_path: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{db_path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_fleet(n: int) -> tuple[list[str], str]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from dashboard.models import AgentToken, Node

    tokens = [AgentToken.issue(Node.objects.create(name=f"bench-{i:04d}"))[1] for i in range(n)]
    user = get_user_model().objects.create_user("bench", password="bench-pw")
    client = Client()
    client.force_login(user)
    return tokens, client.cookies["sessionid"].value


def stored_samples() -> int:
    from dashboard.models import GpuSample

    return GpuSample.objects.count()


async def measure(
    args: argparse.Namespace, urls: list[str], tokens: list[str], sessionid: str, log: Path, cpu: CpuClock
) -> dict:
    latencies: list[float] = []
    transit: list[float] = []
    online: set[int] = set()
    stop = asyncio.Event()
    # The browser client is on the first process: with several, the others' nodes reach it through Redis.
    watcher = asyncio.create_task(watch_browser(urls[0], sessionid, stop, latencies, transit, online))
    ready = log / "ready"
    ready.unlink(missing_ok=True)
    marker = asyncio.create_task(mark_ready(online, len(tokens), ready, cpu))
    with (log / "tokens").open("w") as fh:
        fh.write("\n".join(tokens))
    argv = agents_argv(",".join(urls), log / "tokens", ready, args.gpus, args.interval, args.seconds)
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        out, _ = await proc.communicate()
    finally:  # SIGTERM (bench/cleanup.py) cancels this: the agents go too
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    shares = cpu.shares()
    await asyncio.sleep(1.5)  # let the last fan-out tick reach the browser client
    stop.set()
    marker.cancel()
    await watcher
    return {**json.loads(out), "latencies": latencies, "transit": transit, "server_cpu_pct": shares}


def agents_argv(
    server: str,
    tokens: Path,
    ready: Path,
    gpus: int,
    interval: float,
    seconds: float,
    sample_in_wave: bool = False,
) -> list[str]:
    """The command of the agents process (role "agents"), for the benchmarks that run a simulated fleet: one
    agent per token in the file; they sample `seconds` long once `ready` exists, then drain and print JSON."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--role", "agents", "--server", server]
    argv += ["--tokens", str(tokens), "--ready-file", str(ready), "--gpus", str(gpus)]
    argv += ["--interval", str(interval), "--seconds", str(seconds)]
    return argv + (["--sample-in-wave"] if sample_in_wave else [])


def main(argv: list[str] | None = None) -> int:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    args = parse_args(argv)
    if args.processes < 1:
        raise SystemExit("--processes must be at least 1")
    if args.role == "agents":
        tokens = Path(args.tokens).read_text().split()
        fleet = run_agents(
            args.server,
            tokens,
            args.gpus,
            args.interval,
            args.seconds,
            Path(args.ready_file),
            args.sample_in_wave,
        )
        print(json.dumps(asyncio.run(fleet)))
        return 0
    if args.role == "echo":
        asyncio.run(echo_server(int(args.server)))
        return 0
    result = run_main(args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def run_main(args: argparse.Namespace) -> dict:
    from dashboard import stack

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(args.log_dir or tmp)
        log.mkdir(parents=True, exist_ok=True)
        setup_django(log / "bench.sqlite3")
        redis_port, echo_port = stack.free_port(), stack.free_port()
        ports = [stack.free_port() for _ in range(args.processes)]
        services = [stack.redis_service(redis_port, log).start()]
        try:
            stack.wait_for_port(redis_port)
            env = {
                "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "DATABASE_URL": os.environ["DATABASE_URL"],
            }
            asgi = [
                stack.asgi_service(port, env, asgi_log_dir(log, i)).start() for i, port in enumerate(ports)
            ]
            services += asgi
            echo_argv = [sys.executable, __file__, "--role", "echo", "--server", str(echo_port)]
            services.append(stack.Service("echo", echo_argv).start())
            for port in [*ports, echo_port]:
                stack.wait_for_port(port)
            echo = asyncio.run(echo_capacity(echo_port))
            tokens, sessionid = make_fleet(args.agents)
            started = time.monotonic()
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            cpu = CpuClock([service.proc.pid for service in asgi])
            outcome = asyncio.run(measure(args, urls, tokens, sessionid, log, cpu))
            elapsed = time.monotonic() - started
            stored = stored_samples()
        finally:
            for service in reversed(services):
                service.stop()
    return summarize(args, outcome, stored, elapsed, echo)


def asgi_log_dir(log: Path, index: int) -> Path:
    """One process logs where the benchmark always put its log; several get a directory each."""
    if index == 0:
        return log
    (log / f"asgi-{index}").mkdir(exist_ok=True)
    return log / f"asgi-{index}"


def versions() -> dict[str, str]:
    """The versions the figures depend on (issue #13: a fresh install did not reproduce unrecorded ones)."""
    from importlib.metadata import version

    names = ("django", "channels", "channels-redis", "redis", "uvicorn", "websockets")
    return {"python": sys.version.split()[0], **{name: version(name) for name in names}}


def summarize(args: argparse.Namespace, outcome: dict, stored: int, elapsed: float, echo: float) -> dict:
    latencies = outcome["latencies"]
    return {
        "agents": args.agents,
        "processes": args.processes,
        "server_cpu_pct": outcome["server_cpu_pct"],
        "versions": versions(),
        "gpus_per_agent": args.gpus,
        "interval_s": args.interval,
        "seconds": args.seconds,
        "offered_samples_per_s": round(args.agents * args.gpus / args.interval, 1),
        "samples_per_s": round(stored / args.seconds, 1),
        "sent": outcome["sent_gpu_samples"],
        "stored": stored,
        "lost": outcome["sent_gpu_samples"] - stored,
        "unacked_frames_at_end": outcome["unacked_frames"],
        "dropped_frames": outcome["dropped_frames"],
        "connect_s": outcome["connect_s"],
        "settle_s": outcome["settle_s"],
        "agent_connection_losses": outcome["connection_losses"],  # while sampling, by cause
        "p50_ingest_to_browser_ms": _round(percentile(latencies, 0.50)),
        "p99_ingest_to_browser_ms": _round(percentile(latencies, 0.99)),
        "browser_node_updates": len(latencies),
        "p99_fanout_to_browser_ms": _round(percentile(outcome["transit"], 0.99)),
        "raw_ws_echo_msgs_per_s": round(echo, 1),
        "wall_s": round(elapsed, 1),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


if __name__ == "__main__":
    sys.exit(main())

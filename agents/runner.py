"""The agent's main loop: sample the GPUs every interval, send over a websocket, replay what was missed.

Sampling never waits for the network: samples go into the outbox (a bounded ring, 10 minutes by
default) and a sender drains it whenever a connection is up. The server acks what it has stored;
after a reconnect everything not yet acked is sent again in order, and the server's sequence
watermark drops what it already had, so each sample is stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import websockets

from agents import __version__, ask, protocol
from agents.backends import LaunchRefused
from agents.canary import ProbeOutcome
from agents.engines import ENGINES
from agents.gpus.base import GpuSource, GpuSourceError, LoadAware
from agents.inventory import scan_model_dirs
from agents.ring import Outbox, outbox_owner
from agents.supervisor import Supervisor

log = logging.getLogger("agents")
# No permessage-deflate on the agent's socket: a samples frame is ~2 KB a second, and compressing every frame and
# every ack cost the server's event loop ~10 % of its work at 1,000 agents (bench/README.md, "Full stack").
COMPRESSION = None


class AgentRejected(RuntimeError):
    """The server refused this agent's token; retrying cannot help."""


class ServerBusy(RuntimeError):
    """The server asked this agent to connect again later (a reconnect wave it is still working through)."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class FullHelloRequired(RuntimeError):
    """The server does not hold the inventory a digest-only hello named: send the full hello."""


@dataclass
class Backoff:
    """Exponential backoff with full jitter, reset after a connection that worked.

    The window grows by half per refused attempt, not double: a fleet's nodes came back over many seconds
    when it doubled (bench/storm.py). A server that was reachable less than `recent_s` ago is most likely
    restarting: the window then stays at `recent_window`, so the agent is back within about a second of the
    server listening again, not after the several seconds a grown window spreads it over. A refused
    connection costs the server nothing while it is down; once it is up, it spreads the wave itself (busy
    replies with a delay it chooses, which `defer` obeys)."""

    base: float = 0.5
    cap: float = 30.0
    growth: float = 1.5
    attempt: int = 0
    recent_s: float = 30.0
    recent_window: float = 1.0
    reachable_at: float | None = None  # monotonic time a connection that worked last ended
    deferred: float | None = None  # the delay the server asked for, used once

    def next_delay(self) -> float:
        if self.deferred is not None:
            delay, self.deferred = self.deferred, None
            return delay * random.uniform(1.0, 1.2)  # a little jitter on top of the server's own spreading
        if self.reachable_at is not None and time.monotonic() - self.reachable_at < self.recent_s:
            return random.uniform(0, self.recent_window)
        self.attempt += 1
        return random.uniform(0, min(self.cap, self.base * self.growth**self.attempt))

    def reset(self) -> None:
        self.attempt = 0

    def lost(self) -> None:
        """A connection that worked (welcomed) has ended: the server was reachable just now."""
        self.reachable_at = time.monotonic()

    def defer(self, seconds: float) -> None:
        self.deferred = seconds


@dataclass
class LogTailer:
    """Follows one log file from its end and hands new lines to the agent."""

    source: str
    path: Path
    offset: int | None = None

    def read_new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if self.offset is None or size < self.offset:  # first look, or the file was rotated/truncated
            self.offset = size if self.offset is None else 0
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read(protocol.MAX_FRAME_BYTES // 2)
        end = data.rfind(b"\n") + 1
        self.offset += end
        text = data[:end].decode("utf-8", "replace")
        return [line[: protocol.MAX_LOG_LINE_CHARS] for line in text.splitlines()]


@dataclass
class Agent:
    server: str
    token: str
    source: GpuSource
    interval: float = 1.0
    buffer_seconds: float = 600.0
    tailers: list[LogTailer] = field(default_factory=list)
    model_dirs: list[Path] = field(default_factory=list)
    run_dir: Path | None = None
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    disk_outbox: bool = False  # keep unacked frames in run_dir, so that they survive a restart of the agent

    def __post_init__(self) -> None:
        # Room for samples, log tails and a few deployments' reports for the whole buffer window.
        capacity = max(1, int(self.buffer_seconds / self.interval)) * (4 + len(self.tailers))
        self.outbox = self.open_disk_outbox(capacity) if self.disk_outbox else Outbox(capacity=capacity)
        self.wake = asyncio.Event()
        self.connected = asyncio.Event()
        self.supervisor = (
            Supervisor(
                self.model_dirs,
                self.run_dir,
                self.emit_status,
                self.emit_metrics,
                self.emit_logs,
                emit_probe=self.emit_probe,
            )
            if self.run_dir is not None
            else None
        )
        self.commands: set[asyncio.Task] = set()
        self.ws = None  # the open connection: answers to `ask` go straight on it, never through the outbox
        self.launches: dict[str, protocol.Launch] = {}
        self.generated: dict[str, float] = {}
        self.engines: list[protocol.EngineVersion] = []  # what `refresh_engines` found, for the hello
        # The inventory the server last welcomed, with the digest it gave: the next hello may be digest-only.
        self.welcomed_inventory: tuple[tuple, str] | None = None

    def open_disk_outbox(self, capacity: int) -> Outbox:
        if self.run_dir is None:
            raise ValueError("a disk outbox needs a run dir")
        path = self.run_dir / "outbox.sqlite3"
        outbox = Outbox.on_disk(path, capacity, outbox_owner(self.server, self.token))
        # The server keeps its replay watermark per stream: the carried-over frames continue the old one.
        self.boot_id = outbox.stream_id
        if outbox.discarded:
            log.warning(
                "outbox %s held %d unsent frames for another server or token: dropped", path, outbox.discarded
            )
        elif outbox.frames:
            log.info("outbox %s: %d unsent frames from the last run", path, len(outbox.frames))
        return outbox

    def ws_url(self) -> str:
        base = self.server.rstrip("/")
        base = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        return base + "/ws/agent/"

    def hello(self) -> str:
        return protocol.dump_hello(self.hello_message())

    def hello_message(self) -> protocol.Hello:
        return protocol.Hello(
            type="hello",
            v=protocol.VERSION,
            agent_version=__version__,
            hostname=socket.gethostname(),
            boot_id=self.boot_id,
            interval_s=self.interval,
            gpu_source=self.source.kind,
            simulated=self.source.simulated,
            driver_version=self.source.driver_version(),
            cuda_version=self.source.cuda_version(),
            gpus=self.source.inventory(),
            topology=self.source.topology(),
            models=scan_model_dirs(self.model_dirs),
            engines=self.engines,
        )

    async def refresh_engines(self) -> None:
        """The installed engines' versions for the next hello, probed at most every RECHECK_S per process (in a
        thread: a probe may take seconds)."""
        found = ENGINES.fresh()
        if found is None:
            found = await asyncio.to_thread(ENGINES.read)
        if found != self.engines:
            log.info(
                "engines: %s", ", ".join(f"{e.backend} {e.version or 'unknown'}" for e in found) or "none"
            )
        self.engines = found

    def queue(self, message: type[protocol.Sequenced], kind: str, t: float, **fields) -> None:
        """Add one sequenced message to the outbox; its sequence number is given when it is first sent."""
        self.outbox.add(
            lambda seq: protocol.dump(message(type=kind, v=protocol.VERSION, seq=seq, t=t, **fields))
        )

    def collect(self) -> None:
        """Take one sample of every GPU, and any new log lines, into the outbox."""
        now = time.time()
        try:
            gpus = self.source.sample()
        except GpuSourceError as exc:  # e.g. a GPU fell off the bus: keep the agent and its logs alive
            log.error("sampling failed: %s", exc)
        else:
            self.queue(protocol.Samples, "samples", now, gpus=gpus)
        for tailer in self.tailers:
            for chunk in _chunks(tailer.read_new_lines(), protocol.MAX_LOG_LINES):
                self.queue(protocol.LogTail, "logs", now, source=tailer.source, lines=chunk)
        self.wake.set()

    def emit_status(self, deployment: str, state: str, **fields) -> None:
        self.reflect_on_simulated_gpus(deployment, state)
        fields = {k: v for k, v in fields.items() if v is not None}
        self.queue(
            protocol.DeploymentStatus, "deployment", time.time(), deployment=deployment, state=state, **fields
        )
        self.wake.set()

    def emit_metrics(self, deployment: str, counters: protocol.ServerCounters) -> None:
        self.reflect_generation(deployment, counters.generation_tokens_total)
        self.queue(protocol.Metrics, "metrics", time.time(), deployment=deployment, counters=counters)
        self.wake.set()

    def emit_probe(self, deployment: str, outcome: ProbeOutcome) -> None:
        self.queue(protocol.Probe, "probe", time.time(), deployment=deployment, **outcome.reported)
        self.wake.set()

    # A simulated node has no real GPUs for the server to fill: show what the real ones would (memory held
    # by the server's KV pool, utilization while it generates), so downstream sees what it would see.
    def reflect_on_simulated_gpus(self, deployment: str, state: str) -> None:
        launch = self.launch_of(deployment)
        if launch is None or not isinstance(self.source, LoadAware):
            return
        totals = {g.index: g.memory_total_mib for g in self.source.inventory()}
        fraction = launch.options.gpu_memory_utilization or 0.9
        pid = self.server_pid(deployment)
        for index in (i for i in launch.gpus if i in totals):
            if state in ("stopped", "failed"):
                self.source.clear_load(index)
            elif state in ("loading", "ready"):
                self.source.set_load(index, util=5.0, mem_used_mib=fraction * totals[index], pid=pid)
            elif state == "serving":  # re-attached after an agent restart: the KV pool is still held
                self.source.set_load(index, mem_used_mib=fraction * totals[index], pid=pid)

    def server_pid(self, deployment: str) -> int | None:
        running = self.supervisor.deployments.get(deployment) if self.supervisor is not None else None
        return running.child.pid if running is not None else None

    def launch_of(self, deployment: str) -> protocol.Launch | None:
        """The launch a deployment runs: as received, or as re-attached from the supervisor's state file."""
        running = self.supervisor.deployments.get(deployment) if self.supervisor is not None else None
        return running.launch if running is not None else self.launches.get(deployment)

    def reflect_generation(self, deployment: str, generated: float | None) -> None:
        launch = self.launch_of(deployment)
        if launch is None or generated is None or not isinstance(self.source, LoadAware):
            return
        moving = generated > self.generated.get(deployment, generated)
        self.generated[deployment] = generated
        for index in launch.gpus:
            self.source.set_load(index, util=88.0 if moving else 0.0)

    def emit_logs(self, source: str, lines: list[str]) -> None:
        now = time.time()
        for chunk in _chunks(lines, protocol.MAX_LOG_LINES):
            self.queue(protocol.LogTail, "logs", now, source=source, lines=chunk)
        self.wake.set()

    async def sample_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            self.collect()
            if self.supervisor is not None:
                await self.supervisor.poll()
            next_at += self.interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def run(self) -> None:
        if self.supervisor is not None:
            adopted = await self.supervisor.adopt()
            if adopted:
                log.info("re-attached to running inference servers: %s", ", ".join(adopted))
        sampler = asyncio.create_task(self.sample_forever())
        try:
            await self.connect_forever()
        finally:
            sampler.cancel()

    async def connect_forever(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self.refresh_engines()
                await self.session(backoff)
            except AgentRejected:
                raise
            except ServerBusy as exc:
                log.info("server busy: %s", exc)
                if exc.retry_after is not None:
                    backoff.defer(exc.retry_after)
            except (TimeoutError, OSError, websockets.WebSocketException) as exc:
                log.warning("connection to %s lost: %s", self.server, exc)
            delay = backoff.next_delay()
            log.info("reconnecting in %.1f s (%d samples waiting)", delay, len(self.outbox.frames))
            await asyncio.sleep(delay)

    async def session(self, backoff: Backoff) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with websockets.connect(
            self.ws_url(),
            additional_headers=headers,
            open_timeout=10,
            max_size=protocol.MAX_FRAME_BYTES,
            compression=COMPRESSION,
        ) as ws:
            welcome = await self.say_hello(ws)
            backoff.reset()
            self.outbox.ack(welcome["last_seq"])
            log.info("connected as %s; replaying %d frames", welcome["node"], len(self.outbox.frames))
            self.connected.set()
            self.ws = ws
            try:
                await self.exchange(ws)
            finally:
                self.connected.clear()
                self.ws = None
                backoff.lost()

    async def say_hello(self, ws) -> dict:
        """Hello and its welcome. Digest-only when the inventory is the one a welcome gave a digest for (a
        reconnect: the server skips parsing and storing it); the full hello if the server asks for it."""
        hello = self.hello_message()
        known = self.welcomed_inventory
        if known is not None and known[0] == hello.inventory():
            try:
                return self.welcomed(hello, await self.send_hello(ws, hello.without_inventory(known[1])))
            except FullHelloRequired as exc:
                log.info("the server asks for the full hello: %s", exc)
        return self.welcomed(hello, await self.send_hello(ws, hello))

    async def send_hello(self, ws, hello: protocol.Hello) -> dict:
        # A server that turned us away at once (busy) said why first: the reply is still there to read.
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(protocol.dump_hello(hello))
        return await self.expect_welcome(ws)

    def welcomed(self, hello: protocol.Hello, welcome: dict) -> dict:
        """Remember the inventory the server now holds, with its digest, for the next connection's hello."""
        digest = protocol.welcomed_digest(welcome)
        self.welcomed_inventory = (hello.inventory(), digest) if digest else None
        return welcome

    async def expect_welcome(self, ws) -> dict:
        reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
        if reply.get("type") == "error" and reply.get("code") == "full_hello_required":
            raise FullHelloRequired(str(reply.get("message")))
        if reply.get("type") == "error" and reply.get("code") == "unauthorized":
            raise AgentRejected(f"server refused the token: {reply.get('message')}")
        if reply.get("type") == "error" and reply.get("code") == "busy":
            raise ServerBusy(str(reply.get("message")), self.asked_delay(reply))
        if reply.get("type") != "welcome":
            raise websockets.WebSocketException(f"expected welcome, got {reply}")
        return reply

    @staticmethod
    def asked_delay(reply: dict) -> float | None:
        try:
            return protocol.retry_after(reply)
        except protocol.ProtocolError as exc:  # our own backoff instead
            log.warning("ignored the server's busy reply: %s", exc.message)
            return None

    async def exchange(self, ws) -> None:
        sender = asyncio.create_task(self.send_forever(ws))
        try:
            async for raw in ws:
                self.on_server_message(json.loads(raw))
        finally:
            sender.cancel()
        if ws.close_code == protocol.CLOSE_UNAUTHORIZED:
            raise AgentRejected("server closed the connection: token revoked")
        if ws.close_code == protocol.CLOSE_REPLACED:  # two agents with one token would take turns forever
            raise AgentRejected(
                "server closed the connection: another agent connected with this node's token"
            )

    def on_server_message(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "ack":
            self.outbox.ack(int(message["seq"]))
        elif kind == "error":
            log.error("server rejected a frame: %s: %s", message.get("code"), message.get("message"))
            self.forget_refused(message)
        elif kind in protocol.COMMAND_TYPES:
            self.on_command(message)

    def forget_refused(self, error: dict) -> None:
        """A frame the server refused to store will be refused on every replay: drop it from the outbox."""
        seq = error.get("seq")
        if error.get("code") == "store_refused" and type(seq) is int:
            self.outbox.drop(seq)

    def on_command(self, message: dict) -> None:
        """Validate a server command here too (never trust the wire) and hand it to the supervisor."""
        try:
            command = protocol.parse_server_command(json.dumps(message))
        except protocol.ProtocolError as exc:
            log.error("refused a command from the server: %s", exc.message)
            if isinstance(message.get("deployment"), str) and message.get("type") != "ask":
                self.emit_status_safely(message["deployment"], f"refused: {exc.message}")
            return
        if isinstance(command, protocol.Ask):
            self.start(self.answer(command))
        elif self.supervisor is None and isinstance(command, protocol.Canary):
            return  # settings for servers this agent does not run
        elif self.supervisor is None:
            self.emit_status(
                command.deployment, "failed", detail="this agent runs no inference servers (--run-dir)"
            )
        else:
            if isinstance(command, protocol.Launch):
                self.launches[command.deployment] = command
            elif isinstance(command, protocol.Restart) and command.launch is not None:
                self.launches[command.deployment] = command.launch
            self.start(self.run_command(command))

    def start(self, work) -> None:
        task = asyncio.create_task(work)
        self.commands.add(task)
        task.add_done_callback(self.commands.discard)

    def emit_status_safely(self, deployment: str, detail: str) -> None:
        try:
            self.emit_status(deployment, "failed", detail=detail[:4000])
        except ValueError:
            log.error("cannot even report on deployment id %r", deployment[:80])

    async def answer(self, command: protocol.Ask) -> None:
        supervisor = self.supervisor
        endpoint = supervisor.api_endpoint(command.deployment) if supervisor is not None else None
        port, model = endpoint if endpoint is not None else (None, "")
        host = supervisor.host if supervisor is not None else ""
        await ask.answer(command, port, host, model, self.send_now)

    async def send_now(self, frame: str) -> None:
        """Send a frame that is not worth replaying (an answer): dropped while disconnected."""
        ws = self.ws
        if ws is None:
            return
        try:
            await ws.send(frame)
        except websockets.WebSocketException as exc:
            log.warning("an answer was not sent: %s", exc)

    async def run_command(self, command) -> None:
        try:
            await self.supervisor.handle(command)
        except LaunchRefused as exc:  # already reported as failed by the supervisor
            log.error("refused to launch %s: %s", command.deployment, exc)

    async def send_forever(self, ws) -> None:
        sent = 0
        while True:
            for seq, frame in self.outbox.after(sent):
                await ws.send(frame)
                sent = seq
            self.wake.clear()
            await self.wake.wait()


def default_run_dir() -> Path:
    return Path.home() / ".local" / "state" / "layercake-agent"


def _chunks(lines: list[str], size: int) -> list[list[str]]:
    return [lines[i : i + size] for i in range(0, len(lines), size)]

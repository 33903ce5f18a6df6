"""Two real uvicorn processes on one database and one Redis (issue #13, item 2).

Agents speak the wire protocol themselves (`WireAgent`: an outbox of numbered frames, dropped only when
acked, replayed after each reconnect), so every frame sent is counted: their connections are cut and moved
between the processes mid-stream, and one process is killed with SIGKILL while it holds unflushed rows
(its flush period is 3 s). Then every sample must be stored once, every report applied once (a report
applied twice rolls the deployment's counters back), and each node's watermark must be its last frame.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
import websockets
from channels.db import database_sync_to_async
from django.utils import timezone

from dashboard import stack
from dashboard.models import Deployment, GpuSample, Node
from tests.conftest import point_celery_at
from tests.harness import node_with_token, session_cookie

pytestmark = pytest.mark.slow
GPUS = 2
T0 = time.time() - 900


class WireAgent:
    """One node's agent at the frame level: odd seqs are samples, even ones metrics reports."""

    def __init__(self, name: str, token: str) -> None:
        self.name, self.token = name, token
        self.outbox: dict[int, str] = {}
        self.sent = 0
        self.ws = None
        self.commands: list[dict] = []

    def frame(self, seq: int) -> str:
        if seq % 2:
            reading = {
                "util_gpu": 10,
                "util_mem": 1,
                "mem_used_mib": 1,
                "mem_free_mib": 1,
                "temp_c": 30,
                "power_w": 50,
            }
            gpus = [{"index": i, **reading} for i in range(GPUS)]
            return json.dumps({"type": "samples", "v": 1, "seq": seq, "t": T0 + seq, "gpus": gpus})
        counters = {"generation_tokens_total": 10.0 * seq, "requests_running": 1}
        message = {
            "type": "metrics",
            "v": 1,
            "seq": seq,
            "t": T0 + seq,
            "deployment": self.name,
            "counters": counters,
        }
        return json.dumps(message)

    async def connect(self, url: str) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        self.ws = await websockets.connect(
            url.replace("http", "ws") + "/ws/agent/", additional_headers=headers
        )
        await self.ws.send(json.dumps(hello(self.name)))
        welcome = await self.until("welcome")
        self.drop(welcome["last_seq"])
        for seq in sorted(self.outbox):
            await self.ws.send(self.outbox[seq])

    async def send(self, count: int) -> None:
        for _ in range(count):
            self.sent += 1
            self.outbox[self.sent] = self.frame(self.sent)
            await self.ws.send(self.outbox[self.sent])
            await asyncio.sleep(0.02)

    async def until(self, kind: str, timeout: float = 20.0) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                message = json.loads(await self.ws.recv())
                if message["type"] == "ack":
                    self.drop(message["seq"])
                elif message["type"] == "error":
                    raise AssertionError(f"{self.name}: {message}")
                elif message["type"] != kind:
                    self.commands.append(message)
                if message["type"] == kind:
                    return message

    async def drain(self, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while self.outbox:
                await self.until("ack")

    def drop(self, acked: int) -> None:
        self.outbox = {seq: frame for seq, frame in self.outbox.items() if seq > acked}

    async def cut(self) -> None:
        """Gone without a goodbye: the socket is closed whatever the server still holds for it."""
        self.ws.transport.abort()
        await asyncio.sleep(0)


def hello(name: str) -> dict:
    return {
        "type": "hello",
        "v": 1,
        "agent_version": "test",
        "hostname": name,
        "boot_id": f"boot-{name}",
        "interval_s": 1.0,
        "gpu_source": "sim",
        "simulated": True,
        "gpus": [
            {"index": i, "uuid": f"GPU-{name}-{i}", "name": "NVIDIA A30", "memory_total_mib": 24576}
            for i in range(GPUS)
        ],
    }


@pytest.fixture
def two_servers(server_env, log_dir):
    """Process A flushes every 3 s (it holds rows when it is cut off or killed), B at the default 0.25 s."""
    servers = []
    for name, flush in (("a", "3"), ("b", "0.25")):
        port = stack.free_port()
        env = {**server_env, "INGEST_FLUSH_SECONDS": flush}
        (log_dir / f"asgi-{name}").mkdir(exist_ok=True)
        service = stack.asgi_service(port, env, log_dir / f"asgi-{name}").start()
        servers.append((f"http://127.0.0.1:{port}", service))
    for url, service in servers:
        stack.wait_for_port(int(url.rsplit(":", 1)[1]), proc=service.proc)
    yield servers
    for _, service in servers:
        service.stop()


def agents(count: int) -> list[WireAgent]:
    made = []
    for i in range(count):
        node, token = node_with_token(f"moving-{i}")
        Deployment.objects.create(id=node.name, name=node.name, node=node, plan={}, launch={})
        made.append(WireAgent(node.name, token))
    return made


def assert_each_frame_stored_once(agent: WireAgent) -> None:
    node = Node.objects.get(name=agent.name)
    seqs = sorted(GpuSample.objects.filter(gpu__node=node).values_list("seq", flat=True))
    assert seqs == sorted(s for s in range(1, agent.sent + 1, 2) for _ in range(GPUS)), agent.name
    last_report = agent.sent if agent.sent % 2 == 0 else agent.sent - 1
    deployment = Deployment.objects.get(pk=agent.name)
    assert deployment.last_counters_t == T0 + last_report, f"{agent.name}: a report was applied again late"
    assert node.last_seq == agent.sent


async def move_around(fleet: list[WireAgent], urls: list[str], rounds: int) -> None:
    for r in range(rounds):
        for i, agent in enumerate(fleet):
            await agent.connect(urls[(r + i) % 2])
        await asyncio.gather(*(agent.send(9) for agent in fleet))
        for agent in fleet:
            await agent.cut()  # right after sending: A still holds these frames unflushed


def test_it_stores_every_frame_once_while_agents_move_between_processes(two_servers):
    fleet = agents(3)
    urls = [url for url, _ in two_servers]

    async def scenario() -> None:
        await move_around(fleet, urls, rounds=6)
        for agent in fleet:  # B stores the replay and more, while A still holds the last round's frames
            await agent.connect(urls[1])
            await agent.send(5)
        await asyncio.gather(*(agent.drain() for agent in fleet))
        await asyncio.sleep(4)  # A's late flush of what it held lands now: it must change nothing

    asyncio.run(scenario())
    for agent in fleet:
        assert_each_frame_stored_once(agent)


def test_it_loses_nothing_when_a_process_is_killed_holding_unflushed_rows(two_servers):
    fleet = agents(2)
    (a_url, a_service), (b_url, _) = two_servers

    async def scenario() -> None:
        for agent in fleet:
            await agent.connect(a_url)
        await asyncio.gather(*(agent.send(15) for agent in fleet))
        a_service.proc.send_signal(signal.SIGKILL)
        a_service.proc.wait(10)
        for agent in fleet:
            await agent.connect(b_url)
            await agent.send(5)
        await asyncio.gather(*(agent.drain() for agent in fleet))

    asyncio.run(scenario())
    for agent in fleet:
        assert agent.sent == 20
        assert_each_frame_stored_once(agent)


def test_it_shows_every_node_to_browsers_on_either_process_and_reaches_agents_on_either(
    two_servers, alice, settings, server_env
):
    fleet = agents(2)
    urls = [url for url, _ in two_servers]
    cookie = session_cookie(alice)
    point_celery_at(server_env["REDIS_URL"], settings)
    from dashboard.tasks import send_to_node

    async def browser(url: str, seen: set[str], names: dict[int, str]) -> None:
        headers = {"Cookie": f"sessionid={cookie}", "Origin": url}
        async with websockets.connect(
            url.replace("http", "ws") + "/ws/fleet/", additional_headers=headers
        ) as ws:  # a page showing these two nodes, whichever process their agents are on
            await ws.send(json.dumps({"type": "subscribe", "nodes": sorted(names)}))
            async with asyncio.timeout(20):
                while len(seen) < len(fleet):
                    message = json.loads(await ws.recv())
                    if message["type"] == "fleet.update":
                        seen.update(names[n["node"]] for n in message["nodes"] if n["node"] in names)

    async def scenario() -> list[set[str]]:
        names = dict(await database_sync_to_async(lambda: list(Node.objects.values_list("pk", "name")))())
        seen: list[set[str]] = [set(), set()]
        watchers = [asyncio.create_task(browser(url, s, names)) for url, s in zip(urls, seen, strict=True)]
        await asyncio.sleep(1)
        for i, agent in enumerate(fleet):  # one agent on each process
            await agent.connect(urls[i])
        await asyncio.gather(*(agent.send(30) for agent in fleet), *watchers)
        for agent in fleet:
            node_id = next(pk for pk, name in names.items() if name == agent.name)
            frame = json.dumps(
                {"type": "stop", "v": 1, "deployment": agent.name, "sent": timezone.now().isoformat()}
            )
            await database_sync_to_async(send_to_node)(node_id, frame)
        await asyncio.gather(*(agent.until("stop") for agent in fleet))
        return seen

    seen = asyncio.run(scenario())
    assert seen == [{"moving-0", "moving-1"}, {"moving-0", "moving-1"}]

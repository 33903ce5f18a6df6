"""Agents talking to the real agent endpoint in-process (in-memory channel layer): frames, connections, and
a healthy agent that counts what it sent against what was stored and acked."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.testing.websocket import WebsocketCommunicator
from django.db import connections

from dashboard import agent_db
from dashboard.models import AgentToken, GpuSample, LogChunk, Node
from layercake.asgi import application

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
T0 = time.time() - 3600  # samples are from the last hour: the server refuses times far from its clock


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = IN_MEMORY
    settings.INGEST_FLUSH_SECONDS = 0.01


@pytest_asyncio.fixture(autouse=True)
async def close_the_consumers_connection():
    """The consumers' queries run in asgiref's one sync thread and the agents' database thread (agent_db);
    their connections would outlive the test and keep PostgreSQL from dropping the test database at the end
    of the session."""
    yield
    await database_sync_to_async(connections.close_all)()
    await agent_db.close_connections()


def hello(boot="boot-0001", gpus=2):
    return {
        "type": "hello",
        "v": 1,
        "agent_version": "test",
        "hostname": "a30-seed",
        "boot_id": boot,
        "interval_s": 1.0,
        "gpu_source": "sim",
        "simulated": True,
        "gpus": [
            {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA A30", "memory_total_mib": 24576}
            for i in range(gpus)
        ],
        "topology": {
            "gpus": [{"name": "GPU0"}, {"name": "GPU1"}],
            "links": [{"a": "GPU0", "b": "GPU1", "link": "SYS"}],
            "p2p": {"r": [{"a": "GPU0", "b": "GPU1", "link": "NS"}]},
        },
    }


def samples(seq, gpus=2):
    return {
        "type": "samples",
        "v": 1,
        "seq": seq,
        "t": T0 + seq,
        "gpus": [
            {
                "index": i,
                "util_gpu": 10,
                "util_mem": 5,
                "mem_used_mib": 100,
                "mem_free_mib": 24000,
                "temp_c": 35,
                "power_w": 60,
            }
            for i in range(gpus)
        ],
    }


def logs(seq, lines=("INFO ready",), source="agent"):
    return {"type": "logs", "v": 1, "seq": seq, "t": T0 + seq, "source": source, "lines": list(lines)}


@database_sync_to_async
def make_node(name="a30-seed") -> str:
    node = Node.objects.create(name=name)
    return AgentToken.issue(node)[1]


async def connect(token: str) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await comm.connect()
    assert connected
    return comm


async def say(comm, message) -> dict:
    await comm.send_to(text_data=json.dumps(message))
    return json.loads(await comm.receive_from(timeout=5))


@database_sync_to_async
def counts():
    return GpuSample.objects.count(), LogChunk.objects.count()


@database_sync_to_async
def stored_seqs(node_name: str) -> list[int]:
    """The sequence numbers of the node's stored samples, one per GPU row."""
    return sorted(GpuSample.objects.filter(gpu__node__name=node_name).values_list("seq", flat=True))


class HealthyAgent:
    """A well-behaved agent (node "healthy", 2 GPUs) sending samples while another agent misbehaves.

    Every ack it gets is checked against the database at once: everything up to the acked sequence number
    must already be stored (an ack means stored)."""

    gpus = 2

    def __init__(self) -> None:
        self.comm: WebsocketCommunicator | None = None
        self.sent = 0
        self.acked = 0

    async def start(self) -> HealthyAgent:
        self.comm = await connect(await make_node("healthy"))
        assert (await say(self.comm, hello(boot="boot-healthy")))["type"] == "welcome"
        return self

    async def send(self, count: int = 1) -> None:
        for _ in range(count):
            self.sent += 1
            await self.comm.send_to(text_data=json.dumps(samples(self.sent, gpus=self.gpus)))

    async def drain(self, timeout: float = 5.0) -> None:
        """Read acks until the last sample sent is acked, checking each one against the database."""
        async with asyncio.timeout(timeout):
            while self.acked < self.sent:
                reply = json.loads(await self.comm.receive_from(timeout=timeout))
                assert reply["type"] == "ack", reply
                stored = await stored_seqs("healthy")
                missing = [s for s in range(1, reply["seq"] + 1) if stored.count(s) != self.gpus]
                assert not missing, f"ack {reply['seq']} but samples {missing} are not stored"
                self.acked = reply["seq"]

    async def stored(self) -> int:
        """How many of the samples it sent (one per GPU each) are in the database."""
        return len(await stored_seqs("healthy")) // self.gpus

    async def stop(self) -> None:
        await self.comm.disconnect()

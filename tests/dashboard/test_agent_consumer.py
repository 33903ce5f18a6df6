"""The agent endpoint: tokens, validation, storage, acks and replay dedupe (in-process, in-memory layer)."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async

from agents.protocol import Hello, inventory_digest
from dashboard.models import AgentToken, LogChunk, Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    T0,
    close_the_consumers_connection,
    connect,
    counts,
    hello,
    in_memory_layer,
    make_node,
    samples,
    say,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_it_refuses_a_wrong_token_with_an_error_frame():
    await make_node()
    comm = await connect("lc_wrong")
    reply = json.loads(await comm.receive_from())
    assert reply["code"] == "unauthorized"
    assert (await comm.receive_output())["code"] == 4401
    assert await counts() == (0, 0)


async def test_it_refuses_a_revoked_token():
    token = await make_node()
    await database_sync_to_async(lambda: AgentToken.objects.get().revoke())()
    comm = await connect(token)
    assert json.loads(await comm.receive_from())["code"] == "unauthorized"


async def test_it_stores_samples_after_hello_and_acks_them():
    comm = await connect(await make_node())
    welcome = await say(comm, hello())
    digest = inventory_digest(Hello(**hello()))  # what a digest-only hello may name from now on
    assert welcome == {
        "type": "welcome",
        "v": 1,
        "node": "a30-seed",
        "last_seq": 0,
        "inventory_digest": digest,
    }
    assert await say(comm, samples(1)) == {"type": "ack", "v": 1, "seq": 1}
    assert await counts() == (2, 0)
    node = await database_sync_to_async(Node.objects.get)()
    assert (node.simulated, node.last_seq, node.topology["links"][0]["link"]) == (True, 1, "SYS")
    await comm.disconnect()


async def test_it_records_links_with_their_p2p_status():
    comm = await connect(await make_node())
    await say(comm, hello())
    link = await database_sync_to_async(lambda: Node.objects.get().links.get())()
    assert (link.a, link.b, link.link, link.p2p_read) == ("GPU0", "GPU1", "SYS", "NS")
    await comm.disconnect()


async def test_it_stores_a_replayed_sample_once():
    token = await make_node()
    comm = await connect(token)
    await say(comm, hello())
    await say(comm, samples(1))
    await say(comm, samples(2))
    await comm.disconnect()
    comm = await connect(token)
    assert (await say(comm, hello()))["last_seq"] == 2
    assert await say(comm, samples(2)) == {"type": "ack", "v": 1, "seq": 2}
    assert (await say(comm, samples(3)))["seq"] == 3
    assert await counts() == (6, 0)
    await comm.disconnect()


async def test_it_starts_a_new_sequence_when_the_agent_restarts():
    token = await make_node()
    comm = await connect(token)
    await say(comm, hello(boot="boot-0001"))
    await say(comm, samples(5))
    await comm.disconnect()
    comm = await connect(token)
    assert (await say(comm, hello(boot="boot-0002")))["last_seq"] == 0
    await comm.disconnect()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"type": "samples", "v": 1, "seq": 1, "t": 1.0, "gpus": [{"index": 0}]}, "invalid"),
        ({"type": "shell", "v": 1, "cmd": "rm -rf /"}, "unknown_type"),
        (samples(1, gpus=3), "unknown_gpu"),
    ],
)
async def test_it_rejects_malformed_frames_and_stores_nothing(frame, code):
    comm = await connect(await make_node())
    await say(comm, hello())
    reply = await say(comm, frame)
    assert (reply["type"], reply["code"]) == ("error", code)
    assert await counts() == (0, 0)
    await comm.disconnect()


def with_gpu_value(**values) -> dict:
    frame = samples(1)
    frame["gpus"][0].update(values)
    return frame


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        pytest.param({**samples(1), "seq": True}, "seq: Input should be a valid integer", id="seq=true"),
        pytest.param({**samples(1), "seq": "1"}, "seq: Input should be a valid integer", id='seq="1"'),
        pytest.param({**samples(1), "seq": 1.0}, "seq: Input should be a valid integer", id="seq=1.0"),
        pytest.param({**samples(1), "t": str(T0 + 1)}, "t: Input should be a valid number", id="t=string"),
        pytest.param(with_gpu_value(index=False), "gpus.0.index: Input should be", id="index=false"),
        pytest.param(with_gpu_value(power_w="60"), "gpus.0.power_w: Input should be", id='power_w="60"'),
        pytest.param(with_gpu_value(util_gpu=True), "gpus.0.util_gpu: Input should be", id="util_gpu=true"),
    ],
)
async def test_it_rejects_a_value_of_the_wrong_json_type_and_stores_nothing(frame, words):
    comm = await connect(await make_node())
    await say(comm, hello())
    reply = await say(comm, frame)
    assert (reply["type"], reply["code"]) == ("error", "invalid") and words in reply["message"]
    assert await say(comm, samples(1)) == {"type": "ack", "v": 1, "seq": 1}  # the watermark did not move
    assert await counts() == (2, 0)
    await comm.disconnect()


async def test_it_rejects_a_version_of_true():
    comm = await connect(await make_node())
    reply = await say(comm, {**hello(), "v": True})
    assert (reply["type"], reply["code"]) == ("error", "bad_version") and "True" in reply["message"]
    await comm.disconnect()


async def test_it_requires_hello_before_samples():
    comm = await connect(await make_node())
    reply = await say(comm, samples(1))
    assert reply["code"] == "hello_required"
    assert await counts() == (0, 0)


async def test_it_stores_log_tails():
    comm = await connect(await make_node())
    await say(comm, hello())
    ack = await say(comm, {"type": "logs", "v": 1, "seq": 1, "t": T0, "source": "agent", "lines": ["a", "b"]})
    assert ack["seq"] == 1
    chunk = await database_sync_to_async(LogChunk.objects.get)()
    assert chunk.lines == ["a", "b"]
    await comm.disconnect()


class UnreachableLayer:
    """A channel layer whose Redis is gone: every group call fails as channels_redis fails then."""

    extensions: list[str] = []

    async def new_channel(self, prefix="specific."):
        return prefix + "unreachable"

    async def receive(self, channel):
        await asyncio.Event().wait()  # nothing ever arrives

    async def group_send(self, group, message):
        raise ConnectionRefusedError(111, "Connection refused")

    async def group_add(self, group, channel):
        raise ConnectionRefusedError(111, "Connection refused")

    async def group_discard(self, group, channel):
        raise ConnectionRefusedError(111, "Connection refused")


async def test_it_tells_an_agent_to_reconnect_while_the_message_bus_is_down(monkeypatch):
    monkeypatch.setattr("channels.consumer.get_channel_layer", lambda alias="default": UnreachableLayer())
    comm = await connect(await make_node())
    reply = json.loads(await comm.receive_from())
    assert reply["code"] == "busy"
    assert (await comm.receive_output())["code"] == 1013  # try again later: the agent reconnects with backoff
    assert await counts() == (0, 0)

"""A bad item fails alone, and an ack means stored: each bad frame or event from one agent, with a second,
healthy agent sending alongside in the same flushes; every sample the healthy agent sent is stored and acked."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from django.db import OperationalError

from dashboard import ingest
from dashboard.models import AgentToken, Gpu, GpuSample, LogChunk, Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    HealthyAgent,
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    logs,
    make_node,
    samples,
    say,
    stored_seqs,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
def one_flush_for_both(settings, request):
    """Long enough that the bad agent's frame and the healthy agent's land in the same flush."""
    request.getfixturevalue("in_memory_layer")  # which sets a shorter one
    settings.INGEST_FLUSH_SECONDS = 0.2


@pytest_asyncio.fixture
async def healthy():
    agent = await HealthyAgent().start()
    yield agent
    await agent.stop()


async def bad_agent(name="bad", boot="boot-bad-1"):
    comm = await connect(await make_node(name))
    assert (await say(comm, hello(boot=boot)))["type"] == "welcome"
    return comm


async def reply(comm) -> dict:
    return json.loads(await comm.receive_from(timeout=5))


async def healthy_sends_around(healthy, send_bad) -> None:
    """Healthy samples before and after the bad frame, all within one flush."""
    await healthy.send(3)
    await send_bad()
    await healthy.send(3)


async def assert_healthy_lost_nothing(healthy) -> None:
    await healthy.drain()
    assert await healthy.stored() == healthy.sent == 6


def with_gpu(**values):
    frame = samples(1)
    frame["gpus"][0].update(values)
    return frame


def with_frame(**values):
    return {**samples(1), **values}


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        pytest.param(with_frame(seq=2**63), "invalid", id="seq=2**63"),
        pytest.param(with_gpu(throttle_reasons=2**64), "invalid", id="throttle_reasons=2**64"),
        pytest.param(with_gpu(ecc_corrected=2**63), "invalid", id="ecc_corrected=2**63"),
        pytest.param(with_gpu(xids=[2**64]), "invalid", id="xid=2**64"),
        pytest.param(with_frame(t=1e12), "invalid", id="t=1e12"),
        pytest.param(with_frame(t=float("inf")), "invalid", id="t=Infinity"),
        pytest.param(with_gpu(power_w=float("inf")), "invalid", id="power_w=Infinity"),
        pytest.param(with_frame(t=time.time() + 30 * 86400), "bad_time", id="t=in-30-days"),
        pytest.param(with_frame(t=1000.0), "bad_time", id="t=1970"),
        pytest.param(
            json.dumps(logs(1, lines=["€" * 4000] * 30), ensure_ascii=False),
            "too_large",
            id="120-K-characters-of-3-byte-UTF-8",
        ),
    ],
)
async def test_it_refuses_a_bad_samples_frame_alone(healthy, frame, code):
    bad = await bad_agent()
    text = frame if isinstance(frame, str) else json.dumps(frame)
    await healthy_sends_around(healthy, lambda: bad.send_to(text_data=text))
    answer = await reply(bad)
    assert (answer["type"], answer["code"]) == ("error", code)
    await assert_healthy_lost_nothing(healthy)
    assert await stored_seqs("bad") == [] and await database_sync_to_async(LogChunk.objects.count)() == 0
    assert await say(bad, samples(2)) == {"type": "ack", "v": 1, "seq": 2}  # and the bad agent goes on
    await bad.disconnect()


def hello_with(**values):
    frame = hello(boot="boot-bad-1")
    frame["gpus"][0].update(values)
    return frame


def hello_linking_twice():
    frame = hello(boot="boot-bad-1")
    frame["topology"]["links"] *= 2  # valid to the protocol; the database holds one row per pair
    return frame


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        pytest.param(hello_with(memory_total_mib=2**63), "invalid", id="memory_total_mib=2**63"),
        pytest.param(hello_with(memory_total_mib=2**40), "invalid", id="memory_total_mib=2**40"),
        pytest.param(hello_with(numa_node=2**63), "invalid", id="numa_node=2**63"),
        pytest.param(hello_with(power_limit_w=float("inf")), "invalid", id="power_limit_w=Infinity"),
        pytest.param(hello_linking_twice(), "hello_refused", id="one-link-twice"),
    ],
)
async def test_it_refuses_a_bad_hello_alone(healthy, frame, code):
    bad = await connect(await make_node("bad"))
    await healthy_sends_around(healthy, lambda: bad.send_to(text_data=json.dumps(frame)))
    answer = await reply(bad)
    assert (answer["type"], answer["code"]) == ("error", code)
    await assert_healthy_lost_nothing(healthy)
    assert await database_sync_to_async(Gpu.objects.filter(node__name="bad").count)() == 0
    await bad.disconnect()


async def test_it_refuses_a_jump_in_seq_and_keeps_the_watermark(healthy):
    bad = await bad_agent()
    assert (await say(bad, samples(1)))["seq"] == 1
    await healthy_sends_around(
        healthy, lambda: bad.send_to(text_data=json.dumps({**samples(2), "seq": 10**15}))
    )
    answer = await reply(bad)
    assert (answer["type"], answer["code"]) == ("error", "seq_jump")
    assert await say(bad, samples(2)) == {"type": "ack", "v": 1, "seq": 2}
    await assert_healthy_lost_nothing(healthy)
    assert await stored_seqs("bad") == [1, 1, 2, 2]
    assert (await database_sync_to_async(Node.objects.get)(name="bad")).last_seq == 2
    await bad.disconnect()


async def test_it_stores_the_log_tail_of_a_restarted_agent_whose_seq_starts_again(healthy):
    bad = await bad_agent(boot="boot-first-run")
    for seq in (1, 2, 3):
        assert (await say(bad, logs(seq, lines=[f"first run {seq}"])))["seq"] == seq
    await bad.disconnect()
    restarted = await connect(
        await database_sync_to_async(lambda: AgentToken.issue(Node.objects.get(name="bad"))[1])()
    )
    assert (await say(restarted, hello(boot="boot-second-run")))["last_seq"] == 0

    async def second_run_logs():
        for seq in (1, 2, 3):
            await restarted.send_to(text_data=json.dumps(logs(seq, lines=[f"second run {seq}"])))

    await healthy_sends_around(healthy, second_run_logs)
    assert [(await reply(restarted))["seq"] for _ in range(3)] == [1, 2, 3]
    await assert_healthy_lost_nothing(healthy)
    lines = await database_sync_to_async(lambda: sorted(c.lines[0] for c in LogChunk.objects.all()))()
    assert lines == [f"{run} run {seq}" for run in ("first", "second") for seq in (1, 2, 3)]
    await restarted.disconnect()


async def test_it_refuses_only_the_item_the_database_refuses(healthy):
    bad = await bad_agent()
    # The bad node's GPUs go away while its agent still samples them: its rows break a foreign key.
    await database_sync_to_async(lambda: Gpu.objects.filter(node__name="bad").delete())()
    await healthy_sends_around(healthy, lambda: bad.send_to(text_data=json.dumps(samples(1))))
    answer = await reply(bad)
    assert (answer["type"], answer["code"]) == ("error", "store_refused") and "seq 1" in answer["message"]
    await assert_healthy_lost_nothing(healthy)
    assert await database_sync_to_async(GpuSample.objects.filter(gpu__node__name="bad").count)() == 0
    await bad.disconnect()


async def test_it_acks_nothing_after_a_failed_flush_and_the_agent_replays_it(healthy, monkeypatch):
    real_insert, calls = ingest.insert_samples, []

    def unreachable_once(rows):
        calls.append(len(rows))
        if len(calls) == 1:
            raise OperationalError("database is locked")
        real_insert(rows)

    monkeypatch.setattr(ingest, "insert_samples", unreachable_once)
    await healthy.send(3)
    answer = await reply(healthy.comm)
    assert (answer["type"], answer["code"]) == ("error", "store_failed")
    assert (await healthy.comm.receive_output(timeout=5))["code"] == 1013  # reconnect and send it again
    assert await healthy.stored() == 0
    healthy.comm = await connect(
        await database_sync_to_async(lambda: AgentToken.issue(Node.objects.get(name="healthy"))[1])()
    )
    assert (await say(healthy.comm, hello(boot="boot-healthy")))["last_seq"] == 0
    healthy.sent = 0
    await healthy.send(6)  # the three it still holds, then three new ones
    await assert_healthy_lost_nothing(healthy)


async def test_it_closes_the_socket_of_a_revoked_token_within_a_second(healthy):
    bad = await bad_agent()
    assert (await say(bad, samples(1)))["seq"] == 1
    await healthy.send(3)
    began = time.monotonic()
    await database_sync_to_async(lambda: AgentToken.objects.get(node__name="bad").revoke())()
    answer = await reply(bad)
    assert (answer["type"], answer["code"]) == ("error", "unauthorized")
    assert (await bad.receive_output(timeout=1))["code"] == 4401
    assert time.monotonic() - began < 1.0
    await bad.send_to(text_data=json.dumps(samples(2)))
    await healthy.send(3)
    await assert_healthy_lost_nothing(healthy)
    assert await stored_seqs("bad") == [1, 1]


async def test_it_refuses_binary_frames(healthy):
    bad = await bad_agent()
    await healthy_sends_around(healthy, lambda: bad.send_to(bytes_data=json.dumps(samples(1)).encode()))
    answer = await reply(bad)
    assert (answer["type"], answer["code"]) == ("error", "binary")
    await assert_healthy_lost_nothing(healthy)
    assert await stored_seqs("bad") == []
    await bad.disconnect()


async def test_it_closes_the_older_of_two_sockets_with_one_token(healthy):
    token = await make_node("twice")
    older = await connect(token)
    assert (await say(older, hello(boot="boot-older")))["type"] == "welcome"
    newer = await connect(token)
    answer = await reply(older)
    assert (answer["type"], answer["code"]) == ("error", "replaced")
    assert (await older.receive_output(timeout=1))["code"] == 4409
    assert (await say(newer, hello(boot="boot-newer")))["type"] == "welcome"
    await healthy_sends_around(healthy, lambda: newer.send_to(text_data=json.dumps(samples(1))))
    assert (await reply(newer))["seq"] == 1
    await assert_healthy_lost_nothing(healthy)
    await asyncio.sleep(0.1)  # the older socket's disconnect has run: it must not mark the node disconnected
    assert (await database_sync_to_async(Node.objects.get)(name="twice")).connected
    await newer.disconnect()


def at_time_of(seq: int, of: int) -> dict:
    """A samples frame with sequence number `seq` whose time is that of the frame numbered `of`."""
    return {**samples(seq), "t": samples(of)["t"]}


async def test_it_refuses_a_new_seq_whose_sample_time_is_taken_and_says_why(healthy):
    bad = await bad_agent()
    assert (await say(bad, samples(1)))["seq"] == 1
    await healthy_sends_around(healthy, lambda: bad.send_to(text_data=json.dumps(at_time_of(2, of=1))))
    answer = await reply(bad)
    assert (answer["type"], answer["code"], answer["seq"]) == ("error", "store_refused", 2)
    assert "GPU 0 already has a sample at" in answer["message"] and "(seq 1)" in answer["message"]
    assert await say(bad, samples(3)) == {"type": "ack", "v": 1, "seq": 3}
    assert await stored_seqs("bad") == [1, 1, 3, 3]
    await assert_healthy_lost_nothing(healthy)
    await bad.disconnect()


async def test_it_refuses_the_second_of_two_frames_with_one_time_in_the_same_flush(healthy):
    bad = await bad_agent()

    async def two_frames_one_time() -> None:
        await bad.send_to(text_data=json.dumps(samples(1)))
        await bad.send_to(text_data=json.dumps(at_time_of(2, of=1)))

    await healthy_sends_around(healthy, two_frames_one_time)
    ack, refusal = sorted([await reply(bad), await reply(bad)], key=lambda a: a["type"])
    assert ack == {"type": "ack", "v": 1, "seq": 1}
    assert (refusal["code"], refusal["seq"]) == ("store_refused", 2)
    assert await stored_seqs("bad") == [1, 1]
    await assert_healthy_lost_nothing(healthy)
    await bad.disconnect()

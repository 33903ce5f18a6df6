"""Seeded fuzzing of the agent endpoint: mutated valid frames, with a healthy agent sending alongside.

Every frame gets exactly one answer (an ack, a welcome, or an error frame for a refusal), the server logs
no error (no traceback), a refused frame creates no row, and the healthy agent loses nothing.
"""

from __future__ import annotations

import json
import logging
import random
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async

from dashboard.models import Deployment, Gpu, GpuSample, LogChunk, Node
from tests.agent_socket import (  # noqa: F401 (autouse fixtures)
    T0,
    HealthyAgent,
    close_the_consumers_connection,
    connect,
    hello,
    in_memory_layer,
    make_node,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SEED = 20261201
FRAMES = 3000
DEEP = "__deep__"  # replaced in the JSON text by nesting too deep for any decoder's recursion
NASTY: list[Any] = [
    2**63,
    2**64,
    -(2**63) - 1,
    10**15,
    -1,
    0,
    1,
    1e12,
    1e308,
    -1e308,
    float("inf"),
    float("-inf"),
    float("nan"),
    4_102_444_801,
    "",
    "x" * 5000,
    "€" * 300,
    "\u0000",
    None,
    True,
    [],
    {},
    [[[[[[[[1]]]]]]]],
    {"a": {"b": {}}},
    DEEP,
]


@pytest.fixture(autouse=True)
def fast_flushes(settings, request):
    request.getfixturevalue("in_memory_layer")
    settings.INGEST_FLUSH_SECONDS = 0.002


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_errors():
    """Every error the server logs (a traceback logged, an exception nobody retrieved) while the test runs."""
    handler = Collect()
    logging.getLogger().addHandler(handler)
    yield handler.records
    logging.getLogger().removeHandler(handler)


@pytest_asyncio.fixture
async def healthy():
    agent = await HealthyAgent().start()
    yield agent
    await agent.stop()


def full_samples(seq: int, gpus: int = 2) -> dict:
    gpu = {
        "util_gpu": 87.5,
        "util_mem": 40,
        "mem_used_mib": 7000,
        "mem_free_mib": 17000,
        "temp_c": 71.25,
        "power_w": 160.5,
        "power_limit_w": 165,
        "sm_clock_mhz": 1440,
        "mem_clock_mhz": 1215,
        "throttle_reasons": 4,
        "ecc_corrected": 2,
        "ecc_uncorrected": 0,
        "xids": [79],
        "processes": [{"pid": 4242, "name": "vllm", "used_mib": 6900}],
    }
    return {
        "type": "samples",
        "v": 1,
        "seq": seq,
        "t": T0 + seq / 10,
        "gpus": [{"index": i, **gpu} for i in range(gpus)],
    }


def valid_frame(rng: random.Random, seq: int) -> dict:
    t = T0 + seq / 10
    return rng.choice(
        [
            full_samples(seq),
            full_samples(seq),
            full_samples(seq),
            {"type": "logs", "v": 1, "seq": seq, "t": t, "source": "vllm", "lines": ["INFO a", "ERROR b"]},
            {
                "type": "deployment",
                "v": 1,
                "seq": seq,
                "t": t,
                "deployment": "fuzz-d",
                "state": "loading",
                "port": 8000,
                "pid": 77,
                "progress": 0.5,
                "detail": "loading weights",
            },
            {
                "type": "metrics",
                "v": 1,
                "seq": seq,
                "t": t,
                "deployment": "fuzz-d",
                "counters": {
                    "generation_tokens_total": 10.0 * seq,
                    "requests_running": 1,
                    "requests_waiting": 0,
                    "kv_cache_usage": 0.5,
                },
            },
            hello(boot=f"boot-fuzz-{rng.randrange(3)}"),
        ]
    )


def places(value: Any, into: list) -> list[tuple[Any, Any]]:
    """Every (container, key) in a frame, depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, inner in items:
        into.append((value, key))
        places(inner, into)
    return into


def mutate(rng: random.Random, frame: dict) -> dict:
    for _ in range(rng.choice([1, 1, 2, 3])):
        container, key = rng.choice(places(frame, []))
        roll = rng.random()
        if roll < 0.7:
            container[key] = rng.choice(NASTY)
        elif roll < 0.85 and isinstance(container, dict):
            del container[key]
        else:
            frame[rng.choice(["extra", "cmd", "__proto__"])] = rng.choice(NASTY)
    return frame


def as_text(rng: random.Random, frame: dict) -> str | bytes:
    text = json.dumps(frame).replace(json.dumps(DEEP), "[" * 50_000 + "]" * 50_000)
    roll = rng.random()
    if roll < 0.05:
        return text[: rng.randrange(len(text))]
    if roll < 0.08:
        return text.encode()  # a binary frame
    if roll < 0.1:
        return text[:-1] + ', "pad": "' + "€" * 90_000 + '"}'  # under the limit in characters, not in bytes
    return text


class Tally:
    def __init__(self) -> None:
        self.frames = self.refused = self.silent = 0
        self.samples: set[tuple[int, datetime]] = set()  # (GPU index, time) of every sample acked as stored
        self.log_seqs: set[int] = set()
        self.hello: dict | None = None  # the last hello the server welcomed
        self.acked = 0


async def send_and_read(comm, raw: str | bytes, frame: dict, tally: Tally) -> None:
    await comm.send_input({"type": "websocket.receive", "bytes" if isinstance(raw, bytes) else "text": raw})
    tally.frames += 1
    try:
        answer = json.loads(await comm.receive_from(timeout=2))
        while answer["type"] in ("launch", "canary"):  # after a welcome: what should run there, not answers
            answer = json.loads(await comm.receive_from(timeout=2))
    except TimeoutError:
        tally.silent += 1
        return
    if answer["type"] == "error":
        tally.refused += 1
    elif answer["type"] == "welcome":
        tally.hello, tally.acked = frame, answer["last_seq"]
    elif answer["type"] == "ack" and answer["seq"] == frame.get("seq") and answer["seq"] > tally.acked:
        tally.acked = answer["seq"]
        record_stored(frame, tally)


def record_stored(frame: dict, tally: Tally) -> None:
    if frame["type"] == "samples":
        t = datetime.fromtimestamp(frame["t"], tz=UTC)
        tally.samples |= {(g["index"], t) for g in frame["gpus"]}
    elif frame["type"] == "logs":
        tally.log_seqs.add(frame["seq"])


@database_sync_to_async
def fuzz_deployment() -> None:
    launch = {
        "type": "launch",
        "v": 1,
        "deployment": "fuzz-d",
        "backend": "simulated",
        "model": "m",
        "gpus": [0],
    }
    Deployment.objects.create(
        id="fuzz-d", name="fuzz", node=Node.objects.get(name="fuzz"), plan={}, launch=launch
    )


@database_sync_to_async
def rows_of_fuzz_node() -> tuple[set, set, set]:
    samples = {
        (index, t)
        for index, t in GpuSample.objects.filter(gpu__node__name="fuzz").values_list("gpu__index", "t")
    }
    logs = set(LogChunk.objects.filter(node__name="fuzz").values_list("seq", flat=True))
    gpus = set(Gpu.objects.filter(node__name="fuzz").values_list("index", "uuid", "memory_total_mib"))
    return samples, logs, gpus


@pytest.mark.slow
async def test_it_answers_every_fuzzed_frame_without_a_traceback_or_a_row_from_a_refusal(
    healthy, server_errors
):
    rng, tally = random.Random(SEED), Tally()
    comm = await connect(await make_node("fuzz"))
    await send_and_read(comm, json.dumps(hello(boot="boot-fuzz-0")), hello(boot="boot-fuzz-0"), tally)
    await fuzz_deployment()
    for seq in range(1, FRAMES + 1):
        frame = valid_frame(rng, seq)
        if rng.random() < 0.9:
            frame = mutate(rng, frame)
        await send_and_read(comm, as_text(rng, frame), frame, tally)
        if seq % 20 == 0:
            await healthy.send()
    await healthy.drain()
    await comm.disconnect()

    tracebacks = [f"{r.name}: {r.getMessage()}" for r in server_errors]
    samples, log_seqs, gpus = await rows_of_fuzz_node()
    welcomed = {(g["index"], g["uuid"], g["memory_total_mib"]) for g in tally.hello["gpus"]}
    print(
        f"fuzzed {tally.frames} frames: {tally.refused} refused, {tally.silent} unanswered, "
        f"{len(tracebacks)} tracebacks; healthy agent sent {healthy.sent}, stored {await healthy.stored()}"
    )
    assert tracebacks == [] and tally.silent == 0
    assert tally.refused > FRAMES // 2  # the fuzzing reached the refusals
    assert samples <= tally.samples and log_seqs <= tally.log_seqs and gpus == welcomed
    assert await healthy.stored() == healthy.sent == FRAMES // 20

"""The agent's side of "Try it" and "Measure": prompts to a real (simulated) server, streamed and timed."""

# ruff: noqa: F811 (start_sim is a fixture, imported from the simulated backend's tests)
from __future__ import annotations

import asyncio
import json
import time

import pytest

from agents import ask, protocol
from agents.sim.gpus import SimSource
from tests.agents.test_simbackend import MODEL, start_sim  # noqa: F401

REQUEST = "0123456789abcdef0123456789abcdef"


def an_ask(**fields) -> protocol.Ask:
    return protocol.Ask(type="ask", v=1, deployment="dep-1", request=REQUEST, prompt="Say hello", **fields)


def answers(command: protocol.Ask, port: int | None) -> list[dict]:
    sent: list[str] = []

    async def send(frame: str) -> None:
        sent.append(frame)

    asyncio.run(ask.answer(command, port, "127.0.0.1", MODEL, send))
    return [protocol.parse_agent_message(frame).model_dump() for frame in sent]


def test_it_streams_the_answer_text_and_ends_with_its_timing(start_sim):
    sim = start_sim(tokens_per_s=40)
    frames = answers(an_ask(max_tokens=12), sim.port)
    text = "".join(f["text"] for f in frames)
    assert len(frames) >= 3, "text arrives in several frames while it streams"
    assert frames[-1]["done"] and not frames[-1]["error"]
    m = frames[-1]["measurement"]
    assert m["tokens"] == 12 and len(text.split()) == 12  # the simulated server sends one word per token
    assert (
        25 < m["tok_s_per_stream"] < 45
        and 0 < m["ttft_s"] < 1
        and m["itl_s"] == pytest.approx(1 / m["tok_s_per_stream"])
    )


def test_it_measures_concurrent_streams_per_stream_and_in_total(start_sim):
    sim = start_sim(tokens_per_s=30)
    frames = answers(an_ask(max_tokens=15, streams=4, measure=True), sim.port)
    assert len(frames) == 1 and frames[0]["done"] and not frames[0]["error"]
    m = frames[0]["measurement"]
    assert (m["streams"], m["completed"], m["tokens"]) == (4, 4, 60)
    assert 20 < m["tok_s_per_stream"] < 35  # continuous batching: each stream keeps the engine's rate
    assert 3 * m["tok_s_per_stream"] < m["tok_s_total"] < 5 * m["tok_s_per_stream"]


def test_it_says_when_the_deployment_is_not_serving_or_the_server_refuses(start_sim):
    [frame] = answers(an_ask(), None)
    assert frame["done"] and "not serving on this node" in frame["error"]
    sim = start_sim("--max-model-len", "64")
    [frame] = answers(an_ask(max_tokens=200), sim.port)  # more than the server's context
    assert frame["done"] and "the server answered 400" in frame["error"]
    assert frame["measurement"]["completed"] == 0


def test_it_refuses_asks_out_of_bounds():
    with pytest.raises(protocol.ProtocolError, match="streams"):
        protocol.parse_server_command(json.dumps({**an_ask().model_dump(), "streams": 65}))
    with pytest.raises(protocol.ProtocolError, match="request"):
        protocol.parse_server_command(json.dumps({**an_ask().model_dump(), "request": "../x"}))
    with pytest.raises(protocol.ProtocolError, match="prompt"):
        protocol.parse_server_command(json.dumps({**an_ask().model_dump(), "prompt": "x" * 4001}))


def test_it_lists_the_server_pid_for_memory_a_simulated_gpu_holds_for_it():
    source = SimSource("a30x4,workload=idle")
    source.set_load(1, util=5, mem_used_mib=20000, pid=4321)
    assert [(p.pid, p.used_mib) for p in source.sample()[1].processes] == [(4321, 19999)]
    source.clear_load(1)
    assert all(p.pid != 4321 for s in [source.sample()[1]] for p in s.processes)


def test_it_bounds_prompts_to_a_stalled_server_and_keeps_the_probes_pool_free(start_sim, monkeypatch):
    monkeypatch.setattr(ask, "REQUEST_TIMEOUT_S", 2.0)
    sim = start_sim("--fault", "stall")
    sent: list[str] = []

    async def send(frame: str) -> None:
        sent.append(frame)

    async def scenario() -> float:
        tries = [
            asyncio.create_task(ask.answer(an_ask(), sim.port, "127.0.0.1", MODEL, send)) for _ in range(5)
        ]
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.to_thread(lambda: None)  # what the supervisor's health and metrics probes use
        probe_wait = time.monotonic() - started
        await asyncio.gather(*tries)
        return probe_wait

    probe_wait = asyncio.run(scenario())
    errors = [json.loads(f)["error"] for f in sent if json.loads(f)["done"]]
    assert sorted(errors)[0].startswith("4 prompt(s) already running on this node")
    assert sum("timed out" in e for e in errors) == 4, errors
    assert probe_wait < 0.5 and ask.in_flight == {"try": 0, "measure": 0}

"""Canary probes in the agent (agents/canary.py, agents/supervisor.py): a server that hangs while idle is
found by a tiny completion, against the simulated backend's idle-hang fault and the real llama.cpp engine
frozen with SIGSTOP; probes stay out of the counters."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from agents import protocol
from agents.canary import CanaryClock, ProbeOutcome, usage_of
from agents.protocol import CanarySettings, ServerCounters
from agents.sim.testmodel import smollm2_path
from agents.supervisor import RunningServer, Supervisor, start_ticks

FAST = CanarySettings(idle_s=0.3, interval_s=1.5, timeout_s=1.0, max_tokens=2)


class Seen:
    def __init__(self) -> None:
        self.statuses: list[tuple[str, str]] = []
        self.metrics: list[ServerCounters] = []
        self.probes: list[ProbeOutcome] = []


def supervisor_for(run_dir: Path, seen: Seen, model_dirs: list[Path] | None = None) -> Supervisor:
    return Supervisor(
        model_dirs or [],
        run_dir,
        lambda dep, state, **f: seen.statuses.append((dep, state)),
        lambda dep, counters: seen.metrics.append(counters),
        lambda source, lines: None,
        emit_probe=lambda dep, outcome: seen.probes.append(outcome),
    )


@pytest.fixture
def run_dir(tmp_path: Path):
    path = tmp_path / "run"
    yield path
    for state in path.glob("*.json"):  # never leave a server behind (nor a stopped one)
        saved = json.loads(state.read_text())
        if start_ticks(saved["pid"]) == saved["start_ticks"]:
            os.killpg(saved["pid"], signal.SIGCONT)
            os.killpg(saved["pid"], signal.SIGKILL)


async def poll_until(supervisor: Supervisor, check, timeout: float, what: str) -> float:
    """Poll every 0.1 s until check() holds; return the seconds it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not check():
        assert loop.time() - start < timeout, f"timed out after {timeout} s waiting for {what}"
        await supervisor.poll()
        await asyncio.sleep(0.1)
    return loop.time() - start


async def launch(supervisor: Supervisor, command: dict, settings: CanarySettings) -> RunningServer:
    launch = protocol.parse_server_command(json.dumps({"type": "launch", "v": 1, **command}))
    canary = protocol.Canary(type="canary", v=1, deployment=launch.deployment, canary=settings)
    await supervisor.handle(canary)
    await supervisor.handle(launch)
    server = supervisor.deployments[launch.deployment]
    await poll_until(supervisor, lambda: server.state == "ready", 60, "ready")
    return server


def sim_command(deployment: str = "canary-1") -> dict:
    return {
        "deployment": deployment,
        "backend": "simulated",
        "model": "Qwen/Qwen2.5-7B",
        "gpus": [0],
        "options": {"sim_tokens_per_s": 200},
    }


def set_fault(server: RunningServer, fault: str) -> None:
    body = json.dumps({"fault": fault}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/sim/fault", data=body, headers={"Content-Type": "application/json"}
    )
    assert json.loads(urllib.request.urlopen(request, timeout=5).read())["fault"] == fault


# ---- the clock, without servers -------------------------------------------------------------------------
def test_it_takes_answered_probes_out_of_the_counters_and_hanging_ones_out_of_the_gauges() -> None:
    clock = CanaryClock(FAST, active_at=0.0)
    clock.record(ProbeOutcome(True, 0.1, 1.0, 5.0, tokens=2, prompt_tokens=4, answered=True), now=1.0)
    raw = ServerCounters(generation_tokens_total=2, prompt_tokens_total=4, requests_finished_total=1)
    seen = clock.adjusted(raw, now=1.1)
    assert (seen.generation_tokens_total, seen.prompt_tokens_total, seen.requests_finished_total) == (0, 0, 0)
    clock.record(ProbeOutcome(False, 1.0, 1.0, 6.0, error="no answer within 1 s"), now=3.0)
    seen = clock.adjusted(raw.model_copy(update={"requests_running": 1.0}), now=3.1)
    assert seen.requests_running == 0
    assert clock.active_at == 0.0  # probes are not use
    real = clock.adjusted(raw.model_copy(update={"generation_tokens_total": 12.0}), now=4.0)
    assert real.generation_tokens_total == 10 and clock.active_at == 4.0
    late = ProbeOutcome(
        False, 1.4, 1.0, 0.0, tokens=2, prompt_tokens=4, answered=True, error="answered after"
    )
    clock.record(late, now=5.0)  # too late is a failure, but its tokens are in the counters all the same
    assert (
        clock.adjusted(
            raw.model_copy(update={"generation_tokens_total": 14.0}), now=5.1
        ).generation_tokens_total
        == 10
    )


def test_it_is_due_only_when_enabled_idle_long_enough_and_after_the_interval() -> None:
    clock = CanaryClock(FAST, active_at=10.0)
    assert not clock.due(10.2) and clock.due(10.3)
    clock.record(ProbeOutcome(True, 0.1, 1.0, 0.3, tokens=1, answered=True), now=10.4)
    assert not clock.due(11.8) and clock.due(11.9)
    clock.settings = FAST.model_copy(update={"enabled": False})
    assert not clock.due(100.0)


def test_it_reads_only_a_completion_with_choices_as_an_answer() -> None:
    assert usage_of(
        '{"choices": [{"text": "OK"}], "usage": {"completion_tokens": 2, "prompt_tokens": 5}}'
    ) == (
        2,
        5,
    )
    assert usage_of('{"error": "model not loaded", "usage": {"completion_tokens": 0}}') is None
    assert usage_of("<html>502</html>") is None


# ---- the simulated backend -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.asyncio
async def test_it_finds_an_idle_hang_within_interval_plus_timeout_and_sees_it_end(run_dir) -> None:
    pytest.importorskip("agents.sim.backend")
    seen = Seen()
    supervisor = supervisor_for(run_dir, seen)
    server = await launch(supervisor, sim_command(), FAST)
    await poll_until(supervisor, lambda: seen.probes, 5, "the first probe")
    assert seen.probes[0].ok and seen.probes[0].tokens == 2
    await poll_until(supervisor, lambda: len(seen.metrics) >= 2, 5, "counters after the probe")
    assert seen.metrics[-1].generation_tokens_total == 0  # the probe's tokens are not the deployment's
    assert server.state == "ready"  # and a probe does not make it "serving"

    set_fault(server, "idle-hang")
    before = len(seen.probes)
    took = await poll_until(supervisor, lambda: any(not p.ok for p in seen.probes[before:]), 10, "a failure")
    failed = next(p for p in seen.probes[before:] if not p.ok)
    assert took <= FAST.interval_s + FAST.timeout_s + 0.5  # plus at most a poll's delay
    assert failed.error == "no answer within 1 s" and failed.health_status == 200
    assert seen.metrics[-1].requests_running == 0  # the hanging probe is not a user's request

    set_fault(server, "none")
    after = len(seen.probes)
    await poll_until(supervisor, lambda: len(seen.probes) > after, 10, "the next probe")
    assert seen.probes[-1].ok
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="canary-1"))


@pytest.mark.slow
@pytest.mark.asyncio
async def test_it_sends_no_probe_when_the_operator_turned_them_off(run_dir) -> None:
    pytest.importorskip("agents.sim.backend")
    seen = Seen()
    supervisor = supervisor_for(run_dir, seen)
    off = FAST.model_copy(update={"enabled": False})
    server = await launch(supervisor, sim_command("canary-off"), off)
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    until = loop.time() + 2.5
    while loop.time() < until:
        await supervisor.poll()
        await asyncio.sleep(0.1)
    assert seen.probes == [] and server.canary.settings.enabled is False
    saved = json.loads((run_dir / "canary-off.json").read_text())
    assert saved["canary"]["enabled"] is False  # an agent restart keeps the operator's choice
    await supervisor.handle(protocol.Canary(type="canary", v=1, deployment="canary-off", canary=FAST))
    await poll_until(supervisor, lambda: seen.probes, 5, "a probe once turned on")
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="canary-off"))


# ---- the real llama.cpp engine ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.asyncio
async def test_it_finds_the_real_llama_cpp_engine_frozen_with_sigstop_while_idle(run_dir) -> None:
    model = smollm2_path()
    if model is None:
        pytest.skip("the llama.cpp engine and SmolLM2 are not installed (scripts/install-inference.sh)")
    seen = Seen()
    supervisor = supervisor_for(run_dir, seen, [model.parent])
    settings = CanarySettings(idle_s=0.3, interval_s=2.0, timeout_s=3.0, max_tokens=1)
    command = {"deployment": "llama-1", "backend": "llama-cpp-python", "model": str(model), "gpus": []}
    server = await launch(supervisor, command, settings)
    await poll_until(supervisor, lambda: seen.probes, 30, "the first probe")
    assert seen.probes[0].ok, seen.probes[0]

    os.killpg(server.child.pid, signal.SIGSTOP)
    before = len(seen.probes)
    took = await poll_until(supervisor, lambda: any(not p.ok for p in seen.probes[before:]), 15, "a failure")
    failed = next(p for p in seen.probes[before:] if not p.ok)
    assert took <= settings.interval_s + settings.timeout_s + 2.5  # a poll may wait on a frozen scrape (2 s)
    assert failed.error == "no answer within 3 s" and failed.health_status is None  # frozen: nothing answers

    os.killpg(server.child.pid, signal.SIGCONT)
    after = len(seen.probes)
    await poll_until(supervisor, lambda: len(seen.probes) > after and seen.probes[-1].ok, 30, "recovery")
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="llama-1"))


def test_it_refuses_canary_settings_and_probe_reports_out_of_bounds_naming_the_field() -> None:
    def canary(**settings) -> str:
        return json.dumps({"type": "canary", "v": 1, "deployment": "d-1", "canary": settings})

    with pytest.raises(protocol.ProtocolError, match=r"canary\.timeout_s"):
        protocol.parse_server_command(canary(timeout_s=0))
    with pytest.raises(protocol.ProtocolError, match=r"canary\.max_tokens"):
        protocol.parse_server_command(canary(max_tokens=5))
    assert protocol.parse_server_command(canary()).canary == CanarySettings()  # old peers: the defaults
    report = {
        "type": "probe",
        "v": 1,
        "seq": 1,
        "t": 1.7e9,
        "deployment": "d-1",
        "ok": False,
        "timeout_s": 10,
    }
    with pytest.raises(protocol.ProtocolError, match="elapsed_s"):
        protocol.parse_agent_message(json.dumps({**report, "elapsed_s": -1}))
    with pytest.raises(protocol.ProtocolError, match="health_status"):
        protocol.parse_agent_message(json.dumps({**report, "elapsed_s": 10, "health_status": 999}))
    assert protocol.parse_agent_message(json.dumps({**report, "elapsed_s": 10})).health_status is None

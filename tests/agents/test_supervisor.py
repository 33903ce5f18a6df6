"""The supervisor with real child processes: a tiny stub server (tests/stub_inference_server.py) stands in
for an inference backend through a test-only adapter, never through the production registry."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from agents import protocol
from agents.backends import ADAPTERS, LOOPBACK, Adapter, LaunchRefused
from agents.backends.progress import vllm_progress
from agents.supervisor import LogFile, Supervisor, child_environment, start_ticks

REPO = Path(__file__).resolve().parents[2]
INTERVAL = 0.1


class StubAdapter(Adapter):
    """Runs tests/stub_inference_server.py; `load_path` makes it load its model over HTTP, like Ollama."""

    name = "simulated"
    executable_name = ""
    model_is_path = False

    def __init__(self, *extra: str, load_path: str | None = None, executable: str | None = None) -> None:
        self.extra = list(extra)
        self.load_path = load_path
        self.forced_executable = executable

    def executable(self) -> str:
        return self.forced_executable or super().executable()

    def argv(self, launch: protocol.Launch, port: int, host: str = LOOPBACK) -> list[str]:
        return [
            self.executable(),
            "-m",
            "tests.stub_inference_server",
            "--port",
            str(port),
            "--model",
            launch.model,
            *self.extra,
        ]

    def env(self, launch: protocol.Launch, port: int, host: str = LOOPBACK) -> dict[str, str]:
        return {**super().env(launch, port, host), "PYTHONPATH": str(REPO)}

    def loading_progress(self, line: str) -> float | None:
        return vllm_progress(line)

    def load_request(
        self, launch: protocol.Launch, port: int, host: str = LOOPBACK
    ) -> tuple[str, dict] | None:
        return (f"http://{host}:{port}{self.load_path}", {"model": launch.model}) if self.load_path else None


class Recorder:
    """Collects what the supervisor emits, in order."""

    def __init__(self) -> None:
        self.statuses: list[tuple[str, str, dict]] = []
        self.metrics: list[tuple[str, protocol.ServerCounters]] = []
        self.logs: list[tuple[str, list[str]]] = []

    def status(self, deployment: str, state: str, **fields) -> None:
        self.statuses.append((deployment, state, fields))

    def states(self, deployment: str) -> list[str]:
        return [state for dep, state, _ in self.statuses if dep == deployment]

    def last(self, deployment: str) -> tuple[str, dict]:
        return [(state, fields) for dep, state, fields in self.statuses if dep == deployment][-1]

    def log_lines(self, source: str) -> list[str]:
        return [line for src, lines in self.logs if src == source for line in lines]


def make_supervisor(
    run_dir: Path, recorder: Recorder, adapter: Adapter | None = None, **options
) -> Supervisor:
    adapters = {**ADAPTERS, "simulated": adapter or StubAdapter()}
    return Supervisor(
        [run_dir.parent / "models"],
        run_dir,
        recorder.status,
        lambda dep, counters: recorder.metrics.append((dep, counters)),
        lambda source, lines: recorder.logs.append((source, lines)),
        adapters=adapters,
        **options,
    )


def stub_launch(deployment: str = "dep-1", model: str | None = None) -> protocol.Launch:
    command = {
        "type": "launch",
        "v": 1,
        "deployment": deployment,
        "backend": "simulated",
        "model": model or f"stub-{uuid.uuid4().hex[:12]}",
        "gpus": [0],
    }
    return protocol.parse_server_command(json.dumps(command))


def processes_running(token: str) -> list[int]:
    """Live processes whose command line mentions `token` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cmdline = command_line(int(entry.name))
            if token in cmdline and start_ticks(int(entry.name)) is not None:
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    """/proc/PID/cmdline, waited for when it is our own child's and still empty: Popen returns once the exec
    closed its error pipe, which is before the kernel has set the new program's arguments (a CI run read an
    empty command line there and counted the server as not running)."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            cmdline = (Path(f"/proc/{pid}") / "cmdline").read_bytes()
        except OSError:
            return ""
        if cmdline or not is_our_child(pid) or time.monotonic() > deadline:
            return cmdline.replace(b"\0", b" ").decode()
        time.sleep(0.01)


def is_our_child(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat[stat.rindex(")") + 2 :].split()[1]) == os.getpid()


async def poll_until(supervisor: Supervisor, check, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out waiting for the supervisor"
        await supervisor.poll()
        await asyncio.sleep(INTERVAL)


async def launch_until_ready(supervisor: Supervisor, launch: protocol.Launch | None = None):
    """Launch a stub server and poll until it reports ready; return its deployment record."""
    launch = launch or stub_launch()
    await supervisor.handle(launch)
    deployment = supervisor.deployments[launch.deployment]
    await poll_until(supervisor, lambda: deployment.state == "ready")
    return deployment


async def complete(port: int) -> None:
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=b"{}", method="POST")
    await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=5).read())


@pytest.fixture
def run_dir(tmp_path: Path):
    (tmp_path / "models").mkdir()
    path = tmp_path / "run"
    yield path
    for state in path.glob("*.json"):  # never leave a stub server behind
        saved = json.loads(state.read_text())
        if start_ticks(saved["pid"]) == saved["start_ticks"]:
            os.killpg(saved["pid"], signal.SIGKILL)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


# ---- the lifecycle ---------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_it_walks_a_server_through_launching_loading_ready_serving(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    deployment = await launch_until_ready(supervisor)
    assert recorder.metrics == [] or all(c.generation_tokens_total == 0 for _, c in recorder.metrics)
    await complete(deployment.port)
    await poll_until(supervisor, lambda: deployment.state == "serving")

    states = recorder.states("dep-1")
    assert states[0] == "launching" and states[-2:] == ["ready", "serving"]
    assert set(states[1:-2]) == {"loading"}
    progress = [f["progress"] for dep, s, f in recorder.statuses if s == "loading"]
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert recorder.last("dep-1")[1]["port"] == deployment.port
    assert recorder.metrics[-1][1].generation_tokens_total == 5
    lines = recorder.log_lines("dep-1")
    assert lines[0].startswith("[layercake agent] starting: ") and "tests.stub_inference_server" in lines[0]
    assert any("Loading safetensors checkpoint shards: 100% Completed | 4/4" in line for line in lines)
    saved = json.loads((run_dir / "dep-1.json").read_text())
    assert (saved["pid"], saved["port"], saved["state"]) == (deployment.child.pid, deployment.port, "serving")
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


@pytest.mark.asyncio
async def test_it_reports_a_killed_server_as_failed_with_exit_code_and_last_lines_within_two_polls(
    run_dir, recorder
):
    supervisor = make_supervisor(run_dir, recorder)
    deployment = await launch_until_ready(supervisor)
    os.kill(deployment.child.pid, signal.SIGKILL)
    for _ in range(2):
        await asyncio.sleep(INTERVAL)
        await supervisor.poll()
        if recorder.states("dep-1")[-1] == "failed":
            break
    state, fields = recorder.last("dep-1")
    assert state == "failed" and fields["exit_code"] == -signal.SIGKILL
    assert "killed by SIGKILL" in fields["detail"]
    assert "Loading safetensors checkpoint shards: 100% Completed" in fields["detail"]
    assert not (run_dir / "dep-1.json").exists()


@pytest.mark.asyncio
async def test_it_stops_the_server_and_every_process_in_its_group(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder, StubAdapter("--worker"))
    launch = stub_launch()
    await launch_until_ready(supervisor, launch)
    assert len(processes_running(launch.model)) == 1
    worker = [line for line in recorder.log_lines("dep-1") if "worker pid=" in line]
    worker_pid = int(worker[0].rsplit("=", 1)[1])

    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))
    state, fields = recorder.last("dep-1")
    assert state == "stopped" and fields["exit_code"] == -signal.SIGTERM
    assert processes_running(launch.model) == []
    assert await gone(worker_pid), "the worker in the server's process group survived the stop"
    assert not (run_dir / "dep-1.json").exists()


async def gone(pid: int, timeout: float = 3.0) -> bool:
    """The worker got SIGTERM with its group; on a loaded machine it may take a moment to exit."""
    for _ in range(int(timeout / 0.05)):
        if start_ticks(pid) is None:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.asyncio
async def test_it_kills_a_server_that_ignores_sigterm_after_the_grace_period(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder, StubAdapter("--ignore-sigterm"), grace_s=0.3)
    await launch_until_ready(supervisor)
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))
    state, fields = recorder.last("dep-1")
    assert state == "stopped" and fields["exit_code"] == -signal.SIGKILL


@pytest.mark.asyncio
async def test_it_restarts_a_server_as_a_new_process_and_keeps_the_old_log(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    launch = stub_launch()
    first = await launch_until_ready(supervisor, launch)

    await supervisor.handle(protocol.Restart(type="restart", v=1, deployment="dep-1"))
    second = supervisor.deployments["dep-1"]
    assert second.child.pid != first.child.pid and start_ticks(first.child.pid) is None
    assert recorder.states("dep-1")[-2:] == ["stopped", "launching"]
    await poll_until(supervisor, lambda: second.state == "ready")
    assert processes_running(launch.model) == [second.child.pid]
    assert "[layercake agent] starting" in (run_dir / "dep-1.log.1").read_text()
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


# ---- idempotency and agent restarts ----------------------------------------------------------------------
@pytest.mark.asyncio
async def test_it_starts_one_process_per_deployment_however_often_launch_arrives(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    launch = stub_launch()
    await asyncio.gather(supervisor.handle(launch), supervisor.handle(launch))
    await supervisor.handle(launch)
    assert len(processes_running(launch.model)) == 1
    assert recorder.states("dep-1") == ["launching", "launching", "launching"]
    assert [f.get("detail") for _, _, f in recorder.statuses[1:]] == ["already running"] * 2
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


@pytest.mark.asyncio
async def test_it_says_so_when_a_different_launch_arrives_for_a_running_deployment(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    launch = stub_launch()
    await supervisor.handle(launch)
    await supervisor.handle(stub_launch())  # same id, another model
    assert len(processes_running(launch.model)) == 1
    assert "different launch" in recorder.last("dep-1")[1]["detail"]
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


@pytest.mark.asyncio
async def test_it_reattaches_to_a_running_server_after_an_agent_restart(run_dir, recorder):
    launch = stub_launch()
    before = make_supervisor(run_dir, recorder)
    pid = (await launch_until_ready(before, launch)).child.pid

    after_recorder = Recorder()
    after = make_supervisor(run_dir, after_recorder)
    assert await after.adopt() == ["dep-1"]
    state, fields = after_recorder.last("dep-1")
    assert (state, fields["pid"], fields["detail"]) == ("ready", pid, "re-attached after an agent restart")
    await after.handle(launch)
    assert processes_running(launch.model) == [pid]
    await complete(after.deployments["dep-1"].port)
    await poll_until(after, lambda: after.deployments["dep-1"].state == "serving")
    assert after_recorder.metrics[-1][1].requests_finished_total == 1

    await after.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))
    assert after_recorder.last("dep-1")[0] == "stopped" and processes_running(launch.model) == []
    before.deployments["dep-1"].child.popen.wait(timeout=5)


@pytest.mark.asyncio
async def test_it_reports_a_server_that_died_while_the_agent_was_down(run_dir, recorder):
    before = make_supervisor(run_dir, recorder)
    popen = (await launch_until_ready(before)).child.popen
    popen.kill()
    await asyncio.sleep(0.2)  # left unreaped on purpose: a zombie is no server

    after_recorder = Recorder()
    assert await make_supervisor(run_dir, after_recorder).adopt() == []
    state, fields = after_recorder.last("dep-1")
    assert state == "failed" and fields["exit_code"] is None
    assert "exited while the agent was not running" in fields["detail"]
    assert not (run_dir / "dep-1.json").exists()
    popen.wait(timeout=5)


@pytest.mark.asyncio
async def test_it_ignores_an_unreadable_state_file(run_dir, recorder):
    run_dir.mkdir(parents=True)
    (run_dir / "broken.json").write_text("{not json")
    assert await make_supervisor(run_dir, recorder).adopt() == []
    assert recorder.statuses == [] and not (run_dir / "broken.json").exists()


# ---- logs ------------------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_it_rotates_the_server_log_and_bounds_the_lines_sent_per_poll(run_dir, recorder):
    supervisor = make_supervisor(
        run_dir, recorder, StubAdapter("--spam", "2000"), log_max_bytes=8192, log_backups=2, max_log_lines=20
    )
    await supervisor.handle(stub_launch())
    await poll_until(supervisor, lambda: (run_dir / "dep-1.log.2").exists())
    for _ in range(5):  # more rotations than backups
        await asyncio.sleep(INTERVAL)
        await supervisor.poll()
    assert (run_dir / "dep-1.log.1").exists()
    assert not (run_dir / "dep-1.log.3").exists()
    assert max(len(lines) for _, lines in recorder.logs) == 20
    assert "filler line" in (run_dir / "dep-1.log.1").read_text()
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


def test_it_reads_carriage_return_progress_and_holds_back_an_unfinished_line(tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(b"first\r\nbar  50%\rbar 100%\n\npartial")
    logfile = LogFile(path, max_bytes=1024, backups=1)
    assert logfile.read_new(max_lines=10) == (["first", "bar  50%", "bar 100%"], "partial")
    with path.open("ab") as fh:
        fh.write(b" line\nnext\n")
    assert logfile.read_new(max_lines=1) == (["partial line"], "")
    assert logfile.read_new(max_lines=10) == (["next"], "")
    assert logfile.tail(2) == ["partial line", "next"]


# ---- refusals and failures to start ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_it_refuses_a_model_outside_the_model_dirs_and_starts_nothing(run_dir, recorder, tmp_path):
    (tmp_path / "elsewhere.gguf").write_bytes(b"GGUF")
    supervisor = make_supervisor(run_dir, recorder)
    command = {
        "type": "launch",
        "v": 1,
        "deployment": "dep-9",
        "backend": "llama.cpp",
        "model": "../elsewhere.gguf",
        "gpus": [0],
    }
    with pytest.raises(LaunchRefused, match="outside the allowed model directories"):
        await supervisor.handle(protocol.parse_server_command(json.dumps(command)))
    state, fields = recorder.last("dep-9")
    assert state == "failed" and fields["detail"].startswith(
        "refused: llama.cpp: model path '../elsewhere.gguf'"
    )
    assert supervisor.deployments == {} and list(run_dir.iterdir()) == []


@pytest.mark.asyncio
async def test_it_refuses_a_backend_this_agent_does_not_offer(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    del supervisor.adapters["ollama"]
    command = {
        "type": "launch",
        "v": 1,
        "deployment": "dep-2",
        "backend": "ollama",
        "model": "llama3",
        "gpus": [],
    }
    with pytest.raises(LaunchRefused, match="backend 'ollama' is not supported"):
        await supervisor.handle(protocol.parse_server_command(json.dumps(command)))


@pytest.mark.asyncio
async def test_it_reports_a_server_whose_executable_cannot_run(run_dir, recorder, tmp_path):
    broken = tmp_path / "not-executable"
    broken.write_text("data")
    supervisor = make_supervisor(run_dir, recorder, StubAdapter(executable=str(broken)))
    await supervisor.handle(stub_launch())
    state, fields = recorder.last("dep-1")
    assert (
        state == "failed"
        and "could not start" in fields["detail"]
        and "Permission denied" in fields["detail"]
    )
    assert "dep-1" not in supervisor.deployments


@pytest.mark.asyncio
async def test_it_answers_stop_and_restart_for_deployments_it_does_not_run(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="ghost"))
    assert recorder.last("ghost") == ("stopped", {"detail": "not running on this node"})
    with pytest.raises(LaunchRefused, match="not known on this node"):
        await supervisor.handle(protocol.Restart(type="restart", v=1, deployment="ghost"))


# ---- servers that load their model over HTTP (Ollama) ----------------------------------------------------
@pytest.mark.asyncio
async def test_it_is_ready_only_once_the_model_load_request_succeeded(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder, StubAdapter(load_path="/v1/completions"))
    await supervisor.handle(stub_launch())
    deployment = supervisor.deployments["dep-1"]
    await poll_until(supervisor, lambda: deployment.state == "serving")  # the load request counts as served
    assert recorder.states("dep-1")[-2:] == ["ready", "serving"]
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


@pytest.mark.asyncio
async def test_it_fails_and_stops_a_server_that_cannot_load_its_model(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder, StubAdapter(load_path="/api/missing"), grace_s=2)
    launch = stub_launch()
    await supervisor.handle(launch)
    await poll_until(supervisor, lambda: recorder.states("dep-1")[-1] == "failed")
    detail = recorder.last("dep-1")[1]["detail"]
    assert f"could not load model {launch.model} (HTTP 404: not found)" in detail
    assert processes_running(launch.model) == []


def test_it_keeps_the_agent_token_out_of_the_server_environment(monkeypatch):
    monkeypatch.setenv("LAYERCAKE_TOKEN", "secret")
    monkeypatch.setenv("HF_HOME", "/data/hf")
    env = child_environment({"CUDA_VISIBLE_DEVICES": "0"})
    assert "LAYERCAKE_TOKEN" not in env
    assert (env["HF_HOME"], env["CUDA_VISIBLE_DEVICES"], env["PYTHONUNBUFFERED"]) == ("/data/hf", "0", "1")
    assert sys.executable  # the stub runs on this interpreter


@pytest.mark.asyncio
async def test_it_runs_the_real_simulated_backend_through_the_production_adapter(run_dir, recorder):
    pytest.importorskip("agents.sim.backend")
    import urllib.request

    supervisor = Supervisor(
        [],
        run_dir,
        recorder.status,
        lambda dep, c: recorder.metrics.append((dep, c)),
        lambda source, lines: recorder.logs.append((source, lines)),
    )
    command = {
        "type": "launch",
        "v": 1,
        "deployment": "sim-1",
        "backend": "simulated",
        "model": "Qwen/Qwen2.5-7B",
        "gpus": [0, 1],
        "options": {"tp": 2, "sim_tokens_per_s": 400},
    }
    deployment = await launch_until_ready(supervisor, protocol.parse_server_command(json.dumps(command)))
    body = json.dumps({"model": "Qwen/Qwen2.5-7B", "prompt": "hi", "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{deployment.port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=10).read())
    await poll_until(supervisor, lambda: deployment.state == "serving")
    assert recorder.metrics[-1][1].generation_tokens_total == 8
    progress = [f["progress"] for _, s, f in recorder.statuses if s == "loading"]
    assert progress[0] == 0.0 and progress[-1] == 1.0 and any(0 < p < 1 for p in progress)
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="sim-1"))
    assert recorder.last("sim-1")[0] == "stopped"


# ---- one launch per node ----------------------------------------------------------------------------------
class MultiNodeStub(StubAdapter):
    multi_node = True


def node_launch(rank: int, master_port: int | None = None) -> protocol.Launch:
    options = {"nnodes": 2, "node_rank": rank, "master_addr": "127.0.0.1", "master_port": master_port}
    command = {**stub_launch().model_dump(), "options": options}
    return protocol.parse_server_command(json.dumps(command))


@pytest.mark.asyncio
async def test_it_picks_and_reports_the_heads_rendezvous_port_and_keeps_it_across_agent_restarts(
    run_dir, recorder
):
    before = make_supervisor(run_dir, recorder, MultiNodeStub())
    head = await launch_until_ready(before, node_launch(0))
    dist_port = head.dist_port
    assert dist_port and dist_port != head.port
    assert all(fields.get("dist_port") == dist_port for _, _, fields in recorder.statuses)

    after_recorder = Recorder()
    assert await make_supervisor(run_dir, after_recorder, MultiNodeStub()).adopt() == ["dep-1"]
    assert after_recorder.last("dep-1")[1]["dist_port"] == dist_port
    await before.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))


@pytest.mark.asyncio
async def test_it_does_not_probe_a_rank_that_serves_no_api(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder, MultiNodeStub())
    await supervisor.handle(node_launch(1, master_port=29555))
    other = supervisor.deployments["dep-1"]
    for _ in range(10):  # the stub answers /health, but a headless rank's is not its to give
        await supervisor.poll()
        await asyncio.sleep(INTERVAL)
    assert other.state in ("launching", "loading") and "ready" not in recorder.states("dep-1")
    assert "dist_port" not in recorder.last("dep-1")[1]
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))
    assert recorder.last("dep-1")[0] == "stopped"


@pytest.mark.asyncio
async def test_it_reports_a_server_that_died_before_the_stop_arrived_as_failed(run_dir, recorder):
    supervisor = make_supervisor(run_dir, recorder)
    popen = (await launch_until_ready(supervisor)).child.popen
    popen.kill()
    popen.wait(timeout=5)
    await supervisor.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))
    state, fields = recorder.last("dep-1")
    assert (state, fields["exit_code"]) == ("failed", -9)


@pytest.mark.asyncio
async def test_it_shows_a_reattached_servers_memory_on_the_simulated_gpus(run_dir, recorder):
    from agents.gpus import make_source
    from agents.runner import Agent

    launch = stub_launch()
    before = make_supervisor(run_dir, recorder)
    await launch_until_ready(before, launch)
    agent = Agent(
        "http://127.0.0.1:9",
        "token",
        make_source("sim:a30x4,workload=idle,seed=1"),
        run_dir=run_dir,
        model_dirs=[run_dir.parent / "models"],
    )
    agent.supervisor.adapters["simulated"] = StubAdapter()
    total = agent.source.inventory()[0].memory_total_mib
    assert agent.source.sample()[0].mem_used_mib < 0.5 * total  # idle before the agent knows of the server
    assert await agent.supervisor.adopt() == ["dep-1"]
    assert agent.source.sample()[0].mem_used_mib == pytest.approx(0.9 * total, rel=0.01)
    await before.handle(protocol.Stop(type="stop", v=1, deployment="dep-1"))

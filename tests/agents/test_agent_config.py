"""The agent's settings from flags, an --env-file and LAYERCAKE_* variables, and what it says when one is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents import protocol
from agents.__main__ import SETTINGS, build_parser, configure, main
from agents.backends import ADAPTERS, LaunchRefused, simulation_adapters
from agents.config import ConfigError, read_env_file
from agents.gpus import make_source
from agents.gpus.base import GpuSource, GpuSourceError
from agents.runner import Agent, default_run_dir
from agents.sim.gpus import SimSource
from agents.supervisor import Supervisor
from dashboard.stack import BASE_DIR


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for key in [key for key in os.environ if key.startswith("LAYERCAKE_")]:
        monkeypatch.delenv(key)


def settings(*argv: str):
    args = build_parser().parse_args(["run", *argv])
    configure(args)
    return args


def env_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.env"
    path.write_text(text)
    return path


def test_it_takes_every_setting_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LAYERCAKE_SERVER", "https://dash.example:8443")
    monkeypatch.setenv("LAYERCAKE_TOKEN", "lc_env")
    monkeypatch.setenv("LAYERCAKE_INTERVAL", "2.5")
    monkeypatch.setenv("LAYERCAKE_GPU_SOURCE", "sim:a30x4")
    monkeypatch.setenv("LAYERCAKE_BUFFER_SECONDS", "60")
    monkeypatch.setenv("LAYERCAKE_MODEL_DIRS", f"/models,/data/gguf{os.pathsep}/srv/hf")
    monkeypatch.setenv("LAYERCAKE_LOG", "vllm=/var/log/vllm.log,ollama=/var/log/ollama.log")
    monkeypatch.setenv("LAYERCAKE_RUN_DIR", str(tmp_path))
    args = settings()
    assert (args.server, args.token, args.interval, args.gpu_source) == (
        "https://dash.example:8443",
        "lc_env",
        2.5,
        "sim:a30x4",
    )
    assert args.buffer_seconds == 60.0 and args.run_dir == tmp_path
    assert args.model_dir == [Path("/models"), Path("/data/gguf"), Path("/srv/hf")]
    assert [(t.source, t.path) for t in args.log] == [
        ("vllm", Path("/var/log/vllm.log")),
        ("ollama", Path("/var/log/ollama.log")),
    ]


def test_it_lets_flags_win_over_the_env_file_and_the_file_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LAYERCAKE_TOKEN", "lc_environment")
    monkeypatch.setenv("LAYERCAKE_INTERVAL", "7")
    monkeypatch.setenv("LAYERCAKE_MODEL_DIRS", "/from-environment")
    path = env_file(
        tmp_path, "LAYERCAKE_SERVER=http://file:8000\nLAYERCAKE_TOKEN=lc_file\nLAYERCAKE_INTERVAL=3\n"
    )
    args = settings("--env-file", str(path), "--interval", "0.5", "--model-dir", "/a", "--model-dir", "/b")
    assert (args.server, args.token, args.interval) == ("http://file:8000", "lc_file", 0.5)
    assert args.model_dir == [Path("/a"), Path("/b")]


def test_it_uses_the_defaults_for_what_nobody_set():
    args = settings("--server", "http://s:8000", "--token", "lc_x")
    assert (args.interval, args.gpu_source, args.buffer_seconds) == (1.0, "nvml", 600.0)
    assert (args.log, args.model_dir, args.run_dir) == ([], [], default_run_dir())


def test_it_reads_the_env_file_without_shell_evaluation(monkeypatch, tmp_path):
    path = env_file(
        tmp_path,
        "# the node's settings\n; a systemd-style comment\n\n"
        "LAYERCAKE_SERVER = 'http://dash:8000'\n"
        'LAYERCAKE_TOKEN="lc_$HOME`id`\\n"\n'
        "LAYERCAKE_RUN_DIR=$HOME/run\n"
        "HF_HOME=/srv/hf-cache\n",
    )
    monkeypatch.setenv("HF_HOME", "/before")
    args = settings("--env-file", str(path))
    assert args.server == "http://dash:8000"
    assert args.token == "lc_$HOME`id`\\n"
    assert args.run_dir == Path("$HOME/run")
    assert os.environ["HF_HOME"] == "/srv/hf-cache"  # passed on to the inference servers, as systemd would


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "LAYERCAKE_SERVER=http://s\nLAYERCAKE_TOKEN=x\nLAYERCAKE_INTERVALL=2\n",
            "agent.env line 3: unknown setting LAYERCAKE_INTERVALL (known: ",
        ),
        (
            "LAYERCAKE_TOKEN=x\njust some words\n",
            "agent.env line 2: expected KEY=VALUE, got 'just some words'",
        ),
        ("LAYERCAKE_TOKEN=x\nexport LAYERCAKE_SERVER=http://s\n", "agent.env line 2: expected KEY=VALUE"),
        (
            "LAYERCAKE_SERVER=http://s\nLAYERCAKE_TOKEN=x\nLAYERCAKE_INTERVAL=soon\n",
            "LAYERCAKE_INTERVAL (from {path} line 3): expected a number of seconds, got 'soon'",
        ),
        (
            "LAYERCAKE_SERVER=http://s\nLAYERCAKE_TOKEN=x\nLAYERCAKE_INTERVAL=0.01\n",
            "LAYERCAKE_INTERVAL (from {path} line 3) must be between 0.05 and 3600 seconds, got 0.01",
        ),
        (
            "LAYERCAKE_SERVER=dash:8000\nLAYERCAKE_TOKEN=x\n",
            "LAYERCAKE_SERVER (from {path} line 1): expected the dashboard's http:// or https:// URL, got 'dash:8000'",
        ),
        (
            "LAYERCAKE_SERVER=http://s\nLAYERCAKE_TOKEN=x\nLAYERCAKE_LOG=vllm:/var/log/vllm.log\n",
            "LAYERCAKE_LOG (from {path} line 3): expected SOURCE=PATH, got 'vllm'",
        ),
        ("LAYERCAKE_SERVER=http://s\nLAYERCAKE_TOKEN=\n", "--token is required (or set LAYERCAKE_TOKEN)"),
        ("LAYERCAKE_TOKEN=x\n", "--server is required (or set LAYERCAKE_SERVER)"),
    ],
)
def test_it_names_the_bad_setting_and_where_it_came_from(text, message, tmp_path):
    path = env_file(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        settings("--env-file", str(path))
    assert message.format(path=path) in str(caught.value)


def test_it_names_an_env_file_it_cannot_read(tmp_path):
    with pytest.raises(ConfigError, match=r"--env-file .*nope\.env: cannot read it"):
        settings("--env-file", str(tmp_path / "nope.env"))


def test_it_exits_1_with_one_line_for_a_bad_environment_value(monkeypatch, capsys):
    monkeypatch.setenv("LAYERCAKE_BUFFER_SECONDS", "-5")
    assert (
        main(["run", "--server", "http://127.0.0.1:9", "--token", "lc_x", "--gpu-source", "sim:a30x4"]) == 1
    )
    assert capsys.readouterr().err == (
        "error: LAYERCAKE_BUFFER_SECONDS (from the environment) must be between 0 "
        "and 604800 seconds, got -5\n"
    )


def test_it_says_in_one_line_that_the_simulation_is_not_installed(monkeypatch, capsys):
    monkeypatch.setitem(os.sys.modules, "agents.sim.gpus", None)
    with pytest.raises(GpuSourceError, match="needs the simulation, which is not installed here"):
        make_source("sim:a30x4")
    assert (
        main(["run", "--server", "http://127.0.0.1:9", "--token", "lc_x", "--gpu-source", "sim:a30x4"]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: --gpu-source sim:... needs the simulation") and err.count("\n") == 1


@pytest.mark.parametrize("backend", ["simulated", "llama-cpp-python"])
def test_it_refuses_simulated_servers_when_the_simulation_is_not_installed(backend, monkeypatch, tmp_path):
    monkeypatch.setitem(os.sys.modules, "agents.sim", None)  # what a node with only layercake-agent has
    monkeypatch.delitem(os.sys.modules, "agents.sim.adapters", raising=False)
    adapters = {adapter.name: adapter for adapter in node_adapters()}
    assert set(adapters) == {"vllm", "sglang", "llama.cpp", "ollama"}
    supervisor = Supervisor([tmp_path], tmp_path / "run", print, print, print, adapters=adapters)
    with pytest.raises(
        LaunchRefused, match=f"{backend}: this agent has no simulation installed; it ships in "
    ):
        supervisor._adapter(backend)


def node_adapters() -> list:
    """The registry as `agents.backends` builds it, here without the simulation."""
    return [ADAPTERS[name] for name in ("vllm", "sglang", "llama.cpp", "ollama")] + list(
        simulation_adapters()
    )


class LookalikeSource(GpuSource):
    """Real GPUs that happen to have a `set_load` method: the agent must not pin anything on them."""

    kind, simulated = "nvml", False

    def __init__(self) -> None:
        self.gpus = SimSource("sim:a30x4")
        self.pinned: list[int] = []

    def driver_version(self) -> str:
        return self.gpus.driver_version()

    def cuda_version(self) -> str:
        return self.gpus.cuda_version()

    def inventory(self):
        return self.gpus.inventory()

    def topology(self):
        return self.gpus.topology()

    def sample(self):
        return self.gpus.sample()

    def set_load(self, index: int, util: float | None = None, mem_used_mib: float | None = None) -> None:
        self.pinned.append(index)


def test_it_tells_only_a_load_aware_source_what_its_servers_use():
    launch = protocol.Launch(type="launch", v=1, deployment="dep-1", backend="simulated", model="m", gpus=[2])
    simulated, lookalike = SimSource("sim:a30x4,workload=idle"), LookalikeSource()
    for source in (simulated, lookalike):
        agent = Agent("http://127.0.0.1:9", "lc_x", source)
        agent.launches["dep-1"] = launch
        agent.emit_status("dep-1", "loading")
    assert simulated.sample()[2].mem_used_mib == pytest.approx(
        0.9 * simulated.inventory()[2].memory_total_mib, rel=0.01
    )
    assert lookalike.pinned == []


def test_it_documents_every_setting_in_the_example_env_file(tmp_path):
    example = (BASE_DIR / "deploy" / "agent.env.example").read_text()
    uncommented = env_file(tmp_path, example.replace("\n#LAYERCAKE_", "\nLAYERCAKE_"))
    keys = {key for key in read_env_file(uncommented) if key.startswith("LAYERCAKE_")}
    assert keys == {setting.env for setting in SETTINGS}
    args = settings("--env-file", str(uncommented))  # every example value is valid
    assert args.gpu_source == "nvml" and args.model_dir == [Path("/srv/models"), Path("/data/gguf")]

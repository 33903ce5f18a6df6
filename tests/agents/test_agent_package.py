"""The agent as operators install it: the two wheels built from agents/, installed into an empty virtualenv.

The node wheel (layercake-agent) alone must hold no Django and no simulation; with layercake-agent-sim added,
its `layercake-agent` command, configured by an env file, sends samples that reach the test server's database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import agents
from dashboard.models import GpuSample, Node
from dashboard.stack import BASE_DIR
from tests.harness import node_with_token, wait_until

pytestmark = pytest.mark.slow


@dataclass
class Venv:
    root: Path
    wheels: dict[str, Path]  # distribution name -> wheel file

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """A program of this virtualenv, outside the repository, without the repository on its path."""
        clean = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "DJANGO"))}
        return subprocess.run(
            argv, cwd=self.root, env=env or clean, capture_output=True, text=True, timeout=timeout
        )

    def python(self, code: str) -> subprocess.CompletedProcess:
        return self.run(str(self.bin / "python"), "-c", code)

    def pip(self, *args: str) -> None:
        """This test's pip, installing into the virtualenv (which gets no pip of its own: ensurepip is slow)."""
        result = self.run(sys.executable, "-m", "pip", "--python", str(self.bin / "python"), *args)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def build_wheels(out: Path) -> dict[str, Path]:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--disable-pip-version-check",
        "-w",
        str(out),
        str(BASE_DIR / "agents"),
        str(BASE_DIR / "agents" / "sim"),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {wheel.name.split("-")[0].replace("_", "-"): wheel for wheel in out.glob("*.whl")}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    """An empty virtualenv with only the node wheel installed (and what it depends on)."""
    root = tmp_path_factory.mktemp("agent-node")
    wheels = build_wheels(root / "dist")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120
    )
    env = Venv(root / "venv", wheels)
    env.pip("install", str(wheels["layercake-agent"]))
    return env


def test_it_installs_the_node_agent_alone_without_django_or_the_simulation(venv):
    assert sorted(venv.wheels) == ["layercake-agent", "layercake-agent-sim"]
    assert f"layercake_agent-{agents.__version__}-" in venv.wheels["layercake-agent"].name
    assert f"layercake_agent_sim-{agents.__version__}-" in venv.wheels["layercake-agent-sim"].name
    installed = venv.python("import agents.runner, agents.gpus.nvml; print(agents.__file__)")
    assert installed.returncode == 0, installed.stderr
    assert Path(installed.stdout.strip()).is_relative_to(venv.root)  # the wheel's copy, not the repository's
    for module in ("django", "agents.sim"):
        missing = venv.python(f"import {module}")
        assert f"ModuleNotFoundError: No module named '{module}'" in missing.stderr
    refused = venv.run(
        str(venv.bin / "layercake-agent"),
        "run",
        "--server",
        "http://127.0.0.1:9",
        "--token",
        "lc_x",
        "--gpu-source",
        "sim:a30x4",
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "error: --gpu-source sim:... needs the simulation, which is not installed"
    )
    assert refused.stderr.count("\n") == 1


def test_it_runs_from_an_env_file_with_the_simulation_and_its_samples_arrive(venv, live_stack, tmp_path):
    venv.pip("install", "--no-index", str(venv.wheels["layercake-agent-sim"]))
    try:
        node, output = run_installed_agent(venv, live_stack.url, tmp_path)
    finally:  # pytest-django runs database tests first: leave the virtualenv as the other test expects it
        venv.pip("uninstall", "--yes", "layercake-agent-sim")
    assert GpuSample.objects.filter(gpu__node=node).count() >= 4, output[-2000:]
    node.refresh_from_db()
    assert node.simulated and node.gpus.count() == 2


def run_installed_agent(venv: Venv, server: str, tmp_path: Path) -> tuple[Node, str]:
    """`layercake-agent run --env-file F` until the server has stored 4 samples; the node and the agent's output."""
    node, token = node_with_token("packaged-node")
    env_file = tmp_path / "agent.env"
    env_file.write_text(
        f"LAYERCAKE_SERVER={server}\nLAYERCAKE_TOKEN={token}\nLAYERCAKE_INTERVAL=0.5\n"
        f"LAYERCAKE_GPU_SOURCE=sim:rtx4090x2\nLAYERCAKE_RUN_DIR={tmp_path / 'run'}\n"
    )
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(
            [str(venv.bin / "layercake-agent"), "run", "--env-file", str(env_file)],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(
                lambda: GpuSample.objects.filter(gpu__node=node).count() >= 4 or agent.poll() is not None,
                timeout=60,
                what="samples from the installed agent",
            )
        finally:
            agent.terminate()
            agent.wait(timeout=10)
    return node, (tmp_path / "agent.log").read_text()

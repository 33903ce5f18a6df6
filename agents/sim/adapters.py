"""Adapters for the servers that only simulated nodes run: the simulated vLLM-like backend
(`python -m agents.sim.backend`) and llama-cpp-python's server through the wrapper in this package. They ship
with layercake-agent-sim; `agents.backends` adds them to its registry when this package is installed."""

from __future__ import annotations

import os
from pathlib import Path

from agents.backends.base import LOOPBACK, Adapter, LaunchRefused, number, valued_options
from agents.backends.llamacpp import ALL_LAYERS, gpu_layers
from agents.backends.progress import llamacpp_python_progress, vllm_progress
from agents.protocol import Launch

AGENT_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds the `agents` package


class LlamaCppPythonAdapter(Adapter):
    """`python -m agents.sim.llamacpp_server`: llama-cpp-python's server app, with /metrics in vLLM names."""

    name = "llama-cpp-python"
    executable_name = ""
    module = "agents.sim.llamacpp_server"
    model_must_be_file = True

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        o = launch.options
        layers = gpu_layers(launch)
        argv = [
            self.executable(),
            "-m",
            self.module,
            "--model",
            launch.model,
            "--host",
            host,
            "--port",
            str(port),
            "--n_gpu_layers",
            "-1" if layers == ALL_LAYERS else layers,
            "--verbose",
        ]  # llama.cpp's own loading lines, for the log view and the log scanner
        return argv + valued_options(
            {"--n_ctx": o.max_model_len, "--n_threads": o.threads, "--served_model_name": o.served_model_name}
        )

    def env(self, launch: Launch, port: int, host: str = LOOPBACK) -> dict[str, str]:
        return {**super().env(launch, port, host), "PYTHONPATH": agent_pythonpath()}

    def loading_progress(self, line: str) -> float | None:
        return llamacpp_python_progress(line)


def agent_pythonpath() -> str:
    """PYTHONPATH that lets `python -m agents.<module>` import this agent whatever the working directory."""
    inherited = os.environ.get("PYTHONPATH", "")
    return AGENT_ROOT + (os.pathsep + inherited if inherited else "")


class SimulatedAdapter(Adapter):
    name = "simulated"
    executable_name = ""
    module = "agents.sim.backend"
    model_is_path = False
    multi_node = True

    def check(self, launch: Launch) -> None:
        o = launch.options
        if o.sim_tokens_per_s is None:
            raise LaunchRefused(
                "simulated: options.sim_tokens_per_s is required (the generation rate to simulate, "
                "normally the plan's predicted tokens/s)"
            )
        if o.sim_fault == "nccl-init-hang" and o.tp < 2 and o.nnodes < 2:
            raise LaunchRefused(
                "simulated: fault nccl-init-hang needs tp >= 2 or several nodes (one rank sets up no "
                "NCCL communicator)"
            )
        super().check(launch)

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        o = launch.options
        argv = [
            self.executable(),
            "-m",
            self.module,
            "--host",
            host,
            "--port",
            str(port),
            "--model",
            launch.model,
            "--tokens-per-s",
            number(o.sim_tokens_per_s or 0),
            "--fault",
            o.sim_fault,
            "--tp",
            str(o.tp),
        ]
        argv += valued_options(
            {"--max-model-len": o.max_model_len, "--served-model-name": o.served_model_name}
        )
        if o.nnodes > 1:
            argv += [
                "--nnodes",
                str(o.nnodes),
                "--node-rank",
                str(o.node_rank),
                "--master-addr",
                str(o.master_addr),
                "--master-port",
                str(o.master_port),
            ]
        return argv

    def env(self, launch: Launch, port: int, host: str = LOOPBACK) -> dict[str, str]:
        return {**super().env(launch, port, host), "PYTHONPATH": agent_pythonpath()}

    def loading_progress(self, line: str) -> float | None:
        return vllm_progress(line)

"""llama.cpp's `llama-server`, and llama-cpp-python's server through the agent's wrapper module."""

from __future__ import annotations

import os
from pathlib import Path

from agents.backends.base import LOOPBACK, Adapter, number, valued_options
from agents.backends.progress import llamacpp_progress, llamacpp_python_progress
from agents.protocol import Launch

ALL_LAYERS = "999"  # llama.cpp's idiom for "offload every layer"
AGENT_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds the `agents` package


class LlamaCppAdapter(Adapter):
    name = "llama.cpp"
    executable_name = "llama-server"
    model_must_be_file = True

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        o = launch.options
        argv = [self.executable(), "-m", launch.model, "--host", host, "--port", str(port), "--metrics"]
        if len(launch.gpus) > 1:
            argv += ["--split-mode", "layer"]
            if o.tensor_split is not None:
                argv += ["--tensor-split", ",".join(number(share) for share in o.tensor_split)]
        argv += ["--n-gpu-layers", gpu_layers(launch)]
        argv += valued_options(
            {
                "--ctx-size": o.max_model_len,
                "--parallel": o.parallel,
                "--threads": o.threads,
                "--alias": o.served_model_name,
            }
        )
        return argv

    def loading_progress(self, line: str) -> float | None:
        return llamacpp_progress(line)


def gpu_layers(launch: Launch) -> str:
    layers = launch.options.n_gpu_layers
    if not launch.gpus:
        return "0"
    if layers is None or layers < 0:
        return ALL_LAYERS
    return str(layers)


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

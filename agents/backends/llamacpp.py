"""llama.cpp's `llama-server` (llama-cpp-python's server, for simulated nodes, is in agents/sim/adapters.py)."""

from __future__ import annotations

from agents.backends.base import LOOPBACK, Adapter, number, valued_options
from agents.backends.progress import llamacpp_progress
from agents.protocol import Launch

ALL_LAYERS = "999"  # llama.cpp's idiom for "offload every layer"


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

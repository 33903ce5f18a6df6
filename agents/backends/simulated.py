"""The simulated backend (`python -m agents.sim.backend`): no GPU, vLLM-style API, metrics and log lines."""

from __future__ import annotations

from agents.backends.base import LOOPBACK, Adapter, LaunchRefused, number, valued_options
from agents.backends.llamacpp import agent_pythonpath
from agents.backends.progress import vllm_progress
from agents.protocol import Launch


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

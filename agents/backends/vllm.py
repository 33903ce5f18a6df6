"""vLLM: `vllm serve MODEL ...`, one GPU per tensor/pipeline rank, /health and /metrics built in."""

from __future__ import annotations

from agents.backends.base import LOOPBACK, Adapter, flag_options, valued_options
from agents.backends.progress import vllm_progress
from agents.protocol import Launch


class VllmAdapter(Adapter):
    name = "vllm"
    executable_name = "vllm"
    needs_gpu_per_rank = True
    multi_node = True

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        o = launch.options
        argv = [self.executable(), "serve", launch.model, "--host", host, "--port", str(port),
                "--tensor-parallel-size", str(o.tp), "--pipeline-parallel-size", str(o.pp)]
        argv += valued_options({
            "--max-model-len": o.max_model_len, "--gpu-memory-utilization": o.gpu_memory_utilization,
            "--kv-cache-dtype": o.kv_cache_dtype, "--dtype": o.dtype, "--served-model-name": o.served_model_name,
        })
        argv += flag_options({"--disable-custom-all-reduce": o.disable_custom_all_reduce, "--enforce-eager": o.enforce_eager})
        return argv + self.node_flags(launch)

    @staticmethod
    def node_flags(launch: Launch) -> list[str]:
        """vLLM's multiprocessing multi-node mode: every node runs `vllm serve`, the others --headless."""
        o = launch.options
        if o.nnodes == 1:
            return []
        flags = ["--nnodes", str(o.nnodes), "--node-rank", str(o.node_rank), "--master-addr", str(o.master_addr)]
        flags += ["--master-port", str(o.master_port)] if o.master_port is not None else []
        return flags + ([] if o.is_head else ["--headless"])

    def loading_progress(self, line: str) -> float | None:
        return vllm_progress(line)


"""vLLM: `vllm serve MODEL ...`, one GPU per tensor/pipeline rank, /health and /metrics built in."""

from __future__ import annotations

from agents.backends.base import RankedServerAdapter
from agents.backends.progress import vllm_progress
from agents.protocol import LaunchOptions


class VllmAdapter(RankedServerAdapter):
    name = "vllm"
    executable_name = "vllm"
    command = ("serve",)
    parallel_flags = ("--tensor-parallel-size", "--pipeline-parallel-size")
    valued_flags = {
        "max_model_len": "--max-model-len",
        "gpu_memory_utilization": "--gpu-memory-utilization",
        "kv_cache_dtype": "--kv-cache-dtype",
        "dtype": "--dtype",
        "served_model_name": "--served-model-name",
    }
    switch_flags = {
        "disable_custom_all_reduce": "--disable-custom-all-reduce",
        "enforce_eager": "--enforce-eager",
    }

    def rendezvous_flags(self, options: LaunchOptions) -> list[str]:
        """vLLM's multiprocessing multi-node mode: every node runs `vllm serve`, the others --headless."""
        flags = ["--master-addr", str(options.master_addr)]
        flags += ["--master-port", str(options.master_port)] if options.master_port is not None else []
        return flags + ([] if options.is_head else ["--headless"])

    def loading_progress(self, line: str) -> float | None:
        return vllm_progress(line)

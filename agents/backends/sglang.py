"""SGLang: `python -m sglang.launch_server ...` (the Python on PATH, where SGLang is installed)."""

from __future__ import annotations

from agents.backends.base import RankedServerAdapter
from agents.backends.progress import sglang_progress
from agents.protocol import LaunchOptions


class SglangAdapter(RankedServerAdapter):
    name = "sglang"
    executable_name = "python3"
    command = ("-m", "sglang.launch_server", "--model-path")
    parallel_flags = ("--tp-size", "--pp-size")
    always = ("--enable-metrics",)
    valued_flags = {
        "max_model_len": "--context-length",
        "gpu_memory_utilization": "--mem-fraction-static",
        "kv_cache_dtype": "--kv-cache-dtype",
        "dtype": "--dtype",
        "served_model_name": "--served-model-name",
    }
    # SGLang's counterpart of vLLM's --enforce-eager is turning CUDA graphs off.
    switch_flags = {
        "disable_custom_all_reduce": "--disable-custom-all-reduce",
        "enforce_eager": "--disable-cuda-graph",
    }

    def rendezvous_flags(self, options: LaunchOptions) -> list[str]:
        return ["--dist-init-addr", f"{options.master_addr}:{options.master_port}"]

    def loading_progress(self, line: str) -> float | None:
        return sglang_progress(line)

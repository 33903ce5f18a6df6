"""SGLang: `python -m sglang.launch_server ...` (the Python on PATH, where SGLang is installed)."""

from __future__ import annotations

from agents.backends.base import LOOPBACK, Adapter, flag_options, valued_options
from agents.backends.progress import sglang_progress
from agents.protocol import Launch


class SglangAdapter(Adapter):
    name = "sglang"
    executable_name = "python3"
    needs_gpu_per_rank = True
    multi_node = True

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        o = launch.options
        argv = [self.executable(), "-m", "sglang.launch_server", "--model-path", launch.model,
                "--host", host, "--port", str(port), "--tp-size", str(o.tp), "--pp-size", str(o.pp),
                "--enable-metrics"]
        argv += valued_options({
            "--context-length": o.max_model_len, "--mem-fraction-static": o.gpu_memory_utilization,
            "--kv-cache-dtype": o.kv_cache_dtype, "--dtype": o.dtype, "--served-model-name": o.served_model_name,
        })
        # SGLang's counterpart of vLLM's --enforce-eager is turning CUDA graphs off.
        argv += flag_options({"--disable-custom-all-reduce": o.disable_custom_all_reduce,
                        "--disable-cuda-graph": o.enforce_eager})
        return argv + self.node_flags(launch)

    @staticmethod
    def node_flags(launch: Launch) -> list[str]:
        o = launch.options
        if o.nnodes == 1:
            return []
        return ["--nnodes", str(o.nnodes), "--node-rank", str(o.node_rank),
                "--dist-init-addr", f"{o.master_addr}:{o.master_port}"]

    def loading_progress(self, line: str) -> float | None:
        return sglang_progress(line)

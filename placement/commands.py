"""Command lines and environment for a plan: vLLM, SGLang, llama-server (+ rpc-server), Ollama."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from placement.cluster import Cluster
from placement.evaluate import Candidate
from placement.layout import even_layers
from placement.links import NVLINK
from placement.request import LLAMA_CPP, SGLANG, VLLM
from placement.spec import ModelSpec, split_quant_suffix

RPC_PORT = 50052
DIST_PORT = 5000
RAY_PORT = 6379
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass
class Launch:
    env: dict[str, str]
    command: str  # the exact line to run on the head node, environment included
    node_commands: dict[str, str] = field(default_factory=dict)  # the other nodes of a multi-node plan


def shell_line(env: dict[str, str], argv: list[str]) -> str:
    return " ".join([f"{key}={shlex.quote(value)}" for key, value in env.items()] + [shlex.join(argv)])


def _visible(c: Candidate, node: str) -> dict[str, str]:
    gpus = ",".join(str(g.index) for g in c.layout.gpus if g.node == node)
    # CUDA numbers devices fastest-first unless told to follow PCI order, which nvidia-smi uses.
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpus}


def _node_env(c: Candidate, cluster: Cluster, node: str, extra: dict[str, str]) -> dict[str, str]:
    env = _visible(c, node)
    interface = cluster.node(node).interface
    if c.layout.multi_node and interface:
        env.update(NCCL_SOCKET_IFNAME=interface, GLOO_SOCKET_IFNAME=interface)
    return {**env, **extra}


def _address(cluster: Cluster, node: str) -> str:
    return cluster.node(node).address or node


def _tp_env(c: Candidate) -> dict[str, str]:
    weak = any(link is not None and link.without_p2p for link in c.layout.tp_links)
    return {"NCCL_P2P_DISABLE": "1"} if weak else {}


def _needs_plain_allreduce(c: Candidate) -> bool:
    """vLLM's custom all-reduce wants P2P (and NVLink for more than two GPUs)."""
    return c.layout.tp > 1 and any(link is None or link.kind != NVLINK for link in c.layout.tp_links)


def _dtype_flags(model: ModelSpec, c: Candidate) -> list[str]:
    fmt = c.settings.fmt.name
    if fmt == model.native_format:
        return []
    if fmt in TORCH_DTYPE:
        return ["--dtype", TORCH_DTYPE[fmt]]
    return ["--quantization", "fp8"] if fmt == "fp8" else []


def _vllm_argv(model: ModelSpec, c: Candidate) -> list[str]:
    lay, s = c.layout, c.settings
    knobs = c.memory.knobs if c.memory else {}
    argv = [
        "vllm",
        "serve",
        model.serve_ref,
        "--tensor-parallel-size",
        str(lay.tp),
        "--pipeline-parallel-size",
        str(lay.pp),
        "--max-model-len",
        str(s.max_model_len),
        "--gpu-memory-utilization",
        f"{knobs.get('gpu_memory_utilization', 0.9):g}",
    ]
    argv += _dtype_flags(model, c)
    argv += ["--kv-cache-dtype", s.kv_dtype] if s.kv_dtype != "auto" else []
    if model.vision and lay.tp > 1 and model.vision.num_heads % lay.tp:
        argv += ["--mm-encoder-tp-mode", "data"]
    argv += ["--disable-custom-all-reduce"] if _needs_plain_allreduce(c) else []
    argv += ["--enforce-eager"] if s.request.enforce_eager else []
    return argv + (["--distributed-executor-backend", "ray"] if lay.multi_node else [])


def vllm_launch(model: ModelSpec, c: Candidate, cluster: Cluster) -> Launch:
    lay = c.layout
    extra = _tp_env(c)
    if list(lay.layers) != even_layers(sum(lay.layers), lay.pp):
        extra["VLLM_PP_LAYER_PARTITION"] = ",".join(str(n) for n in lay.layers)
    head, *others = lay.node_names
    env = _node_env(c, cluster, head, extra)
    if not others:
        return Launch(env, shell_line(env, _vllm_argv(model, c)))
    ray_head = f"{_address(cluster, head)}:{RAY_PORT}"
    workers = {
        n: shell_line(_node_env(c, cluster, n, extra), ["ray", "start", "--address", ray_head, "--block"])
        for n in others
    }
    start = shell_line(env, ["ray", "start", "--head", "--port", str(RAY_PORT)])
    return Launch(env, f"{start} && {shell_line(env, _vllm_argv(model, c))}", workers)


def sglang_launch(model: ModelSpec, c: Candidate, cluster: Cluster) -> Launch:
    lay, s = c.layout, c.settings
    knobs = c.memory.knobs if c.memory else {}
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model.serve_ref, "--tp-size", str(lay.tp)]
    argv += ["--pp-size", str(lay.pp)] if lay.pp > 1 else []
    argv += [
        "--context-length",
        str(s.max_model_len),
        "--mem-fraction-static",
        f"{knobs.get('mem_fraction_static', 0.88):g}",
    ]
    argv += _dtype_flags(model, c)
    argv += ["--kv-cache-dtype", "fp8_e5m2"] if s.kv_dtype == "fp8" else []
    argv += ["--disable-custom-all-reduce"] if _needs_plain_allreduce(c) else []
    argv += ["--host", "0.0.0.0", "--port", "30000"]
    nodes = lay.node_names
    lines = {}
    for rank, node in enumerate(nodes):
        multi = (
            [
                "--nnodes",
                str(len(nodes)),
                "--node-rank",
                str(rank),
                "--dist-init-addr",
                f"{_address(cluster, nodes[0])}:{DIST_PORT}",
            ]
            if len(nodes) > 1
            else []
        )
        lines[node] = shell_line(_node_env(c, cluster, node, _tp_env(c)), argv + multi)
    head = lines.pop(nodes[0])
    return Launch(_node_env(c, cluster, nodes[0], _tp_env(c)), head, lines)


def gguf_file(model: ModelSpec, c: Candidate) -> str:
    if model.gguf is not None:
        return model.gguf.paths[0]
    return f"{model.name}-{c.settings.fmt.name}.gguf"


def llama_launch(model: ModelSpec, c: Candidate, cluster: Cluster) -> Launch:
    lay, s = c.layout, c.settings
    argv = ["llama-server", "-m", gguf_file(model, c)]
    if model.vision or (model.gguf and model.gguf.projector_bytes):
        argv += ["--mmproj", f"mmproj-{model.name}-F16.gguf"]
    mode = s.request.split_mode
    argv += ["-ngl", "999", "--split-mode", mode]
    argv += ["--tensor-split", ",".join(str(n) for n in lay.layers)] if mode == "layer" else []
    argv += ["-c", str(s.max_model_len * s.concurrency), "-np", str(s.concurrency), "-fa", "on"]
    argv += ["-ctk", s.kv_dtype, "-ctv", s.kv_dtype] if s.kv_dtype not in ("f16", "auto") else []
    argv += ["--host", "0.0.0.0", "--port", "8080"]
    head, *others = lay.node_names
    if others:
        argv += ["--rpc", ",".join(f"{_address(cluster, n)}:{RPC_PORT}" for n in others)]
    rpc = {
        n: shell_line(_visible(c, n), ["rpc-server", "-H", "0.0.0.0", "-p", str(RPC_PORT)]) for n in others
    }
    env = _visible(c, head)
    return Launch(env, shell_line(env, argv), rpc)


def ollama_tag(model: ModelSpec, c: Candidate) -> str:
    """The operator's own tag when it names these weights, else name-quant (qwen3-vl-32b-instruct-bf16)."""
    fmt = c.settings.fmt.name.lower()
    if model.gguf is None and "/" not in model.ref and model.ref == model.ref.lower():
        _, suffix = split_quant_suffix(model.ref.split(":")[0])
        if (suffix or "q4_k_m").lower() == fmt:
            return model.ref
    stem, _ = split_quant_suffix(model.name.lower())
    return f"{stem}-{fmt}"


def ollama_launch(model: ModelSpec, c: Candidate) -> Launch:
    s = c.settings
    env = {
        **_visible(c, c.layout.node_names[0]),
        "OLLAMA_NUM_PARALLEL": str(s.concurrency),
        "OLLAMA_CONTEXT_LENGTH": str(s.max_model_len),
        "OLLAMA_FLASH_ATTENTION": "1",
    }
    if s.kv_dtype not in ("f16", "auto"):
        env["OLLAMA_KV_CACHE_TYPE"] = s.kv_dtype
    if len(c.layout.gpus) > 1:
        env["OLLAMA_SCHED_SPREAD"] = "1"
    # These variables configure the server: they belong on `ollama serve`, not on `ollama run`.
    run = shlex.join(["ollama", "run", ollama_tag(model, c)])
    return Launch(env, f"{shell_line(env, ['ollama', 'serve'])} & sleep 5 && {run}")


def launch(model: ModelSpec, c: Candidate, cluster: Cluster) -> Launch:
    if c.backend == VLLM:
        return vllm_launch(model, c, cluster)
    if c.backend == SGLANG:
        return sglang_launch(model, c, cluster)
    if c.backend == LLAMA_CPP:
        return llama_launch(model, c, cluster)
    return ollama_launch(model, c)

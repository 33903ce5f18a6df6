"""What the operator asks for, and the per-backend settings it resolves to."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from placement.dtypes import GGUF, HF, KV_BYTES, WeightFormat, format_for_family, kv_dtype, weight_format
from placement.errors import PlacementError
from placement.spec import ModelSpec

VLLM, SGLANG, LLAMA_CPP, OLLAMA = "vllm", "sglang", "llama.cpp", "ollama"
BACKENDS = (VLLM, SGLANG, LLAMA_CPP, OLLAMA)
BACKEND_ALIASES = {
    "vllm": VLLM,
    "sglang": SGLANG,
    "llama.cpp": LLAMA_CPP,
    "llamacpp": LLAMA_CPP,
    "llama-server": LLAMA_CPP,
    "llama_cpp": LLAMA_CPP,
    "ollama": OLLAMA,
}
FAMILY = {VLLM: HF, SGLANG: HF, LLAMA_CPP: GGUF, OLLAMA: GGUF}
DEFAULT_CONTEXT = 8192  # when neither the request nor a command says, plan for 8k tokens
OLLAMA_DEFAULT_CTX = 4096  # Ollama's default num_ctx


@dataclass(frozen=True)
class Request:
    max_model_len: int | None = None
    concurrency: int = 1
    dtype: str | None = None
    kv_cache_dtype: str = "auto"
    backend: str | None = None
    tp: int | None = None
    pp: int | None = None
    gpus: tuple[int, ...] | None = None
    node: str | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    decode_context: int | None = None  # tokens in context while decoding; default half of max_model_len
    enforce_eager: bool = False
    flash_attention: bool = True
    split_mode: str = "layer"
    # The fleet's own calibration: (GPU table row, backend, TP link class, factor) per key that has enough
    # measured deployments (placement.calibration.fleet_factor); decode predictions are multiplied by it.
    decode_factors: tuple[tuple[str, str, str, float], ...] = ()
    # The vLLM release that will serve (e.g. "0.7.3"): selects the non-torch memory its profiler counts
    # (placement.memory.VLLM_NON_TORCH); None keeps the pessimistic default.
    backend_version: str | None = None
    # Where backend_version came from, for the plan's assumptions ("" : given with the request), e.g. the
    # node whose agent reported it; with no version, why none was taken.
    backend_version_source: str = ""


@dataclass(frozen=True)
class Settings:
    """A request resolved for one backend and model."""

    backend: str
    fmt: WeightFormat
    kv_dtype: str
    kv_bytes: float
    max_model_len: int
    concurrency: int
    decode_context: int
    request: Request


def normalize_backend(name: str) -> str:
    backend = BACKEND_ALIASES.get(name.lower())
    if backend is None:
        raise PlacementError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})")
    return backend


def validate(request: Request) -> Request:
    """Reject impossible or malformed constraints with a message naming them."""
    checks = [
        (request.concurrency < 1, f"concurrency must be at least 1, got {request.concurrency}"),
        (
            request.max_model_len is not None and request.max_model_len < 1,
            f"max model length must be positive, got {request.max_model_len}",
        ),
        (request.tp is not None and request.tp < 1, f"--tp must be at least 1, got {request.tp}"),
        (request.pp is not None and request.pp < 1, f"--pp must be at least 1, got {request.pp}"),
        (
            request.gpu_memory_utilization is not None and not 0 < request.gpu_memory_utilization <= 1,
            f"--gpu-memory-utilization must be in (0, 1], got {request.gpu_memory_utilization}",
        ),
        (
            request.gpus is not None and len(set(request.gpus)) != len(request.gpus or ()),
            f"--gpus repeats a GPU: {request.gpus}",
        ),
        (request.split_mode not in ("layer", "row", "tensor"), f"unknown split mode '{request.split_mode}'"),
        (
            request.decode_context is not None and request.decode_context < 1,
            f"decode context must be positive, got {request.decode_context}",
        ),
        (
            any(not 0.25 <= f[3] <= 4.0 for f in request.decode_factors),
            f"a fleet decode factor must lie in [0.25, 4], got {[f[3] for f in request.decode_factors]}",
        ),
    ]
    for failed, message in checks:
        if failed:
            raise PlacementError(message)
    _check_shape(request)
    if request.backend_version is not None:
        parse_version(request.backend_version)
    if request.backend:
        return replace(request, backend=normalize_backend(request.backend))
    return request


def parse_version(text: str) -> tuple[int, ...]:
    """(0, 8, 3) from '0.8.3', 'v0.8.3rc2.dev224+g49c0d11ec' or '0.8'."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise PlacementError(f"backend version must look like 0.8.3, got '{text}'")
    return tuple(int(part) for part in match.groups(default="0"))


def _check_shape(request: Request) -> None:
    if request.gpus is None:
        return
    width = (request.tp or 1) * (request.pp or 1)
    if request.tp and request.pp and width != len(request.gpus):
        raise PlacementError(
            f"--tp {request.tp} x --pp {request.pp} = {width} GPUs, but --gpus lists {len(request.gpus)}"
        )
    for part, name in ((request.tp, "--tp"), (request.pp, "--pp")):
        if part and part > len(request.gpus):
            raise PlacementError(f"{name} {part} needs more GPUs than --gpus lists ({len(request.gpus)})")


def backends_for(model: ModelSpec, request: Request) -> list[str]:
    """Backends that can load this model in the requested dtype."""
    wanted = [request.backend] if request.backend else list(BACKENDS)
    return [b for b in wanted if requested_format(model, request, b) is not None]


def default_format(model: ModelSpec, backend: str) -> str:
    """What the backend loads when no dtype is asked for. vLLM's `--dtype auto` (and SGLang's) loads an
    fp32 checkpoint in 16-bit ("auto will use FP16 precision for FP32 and FP16 models", vLLM engine args);
    llama.cpp and Ollama run the GGUF types as they are."""
    if model.native_format == "fp32" and FAMILY[backend] == HF:
        return "fp16"
    return model.native_format


def requested_format(model: ModelSpec, request: Request, backend: str) -> WeightFormat | None:
    fmt = weight_format(request.dtype or default_format(model, backend))
    if model.gguf is not None and FAMILY[backend] != GGUF:
        return None  # a GGUF file runs on llama.cpp/Ollama; vLLM's GGUF loader is experimental
    return format_for_family(fmt, FAMILY[backend])


def resolve(model: ModelSpec, request: Request, backend: str) -> Settings:
    fmt = requested_format(model, request, backend)
    if fmt is None:
        raise PlacementError(f"{backend} cannot load {model.name} as {request.dtype or model.native_format}")
    kv = kv_dtype(request.kv_cache_dtype, FAMILY[backend])
    default_len = OLLAMA_DEFAULT_CTX if backend == OLLAMA else DEFAULT_CONTEXT
    length = request.max_model_len or min(model.max_position_embeddings, default_len)
    context = request.decode_context or max(1, length // 2)
    return Settings(
        backend, fmt, kv, KV_BYTES[kv], length, request.concurrency, min(context, length), request
    )

"""Check an operator's own command against the cluster: feasible, problems, risks, memory, suggestion."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from placement.cluster import GPU, Cluster, Node
from placement.command_parse import ParsedCommand, parse_command, parse_visible
from placement.errors import PlacementError
from placement.evaluate import Candidate, Evaluator
from placement.layout import even_layers, make_layout
from placement.memory import Issue, default_fraction
from placement.memory_gguf import counts_from_fractions
from placement.plans import plan
from placement.request import LLAMA_CPP, OLLAMA, SGLANG, VLLM, Request
from placement.result import PlanResult, candidate_json, plan_json, why_text
from placement.spec import ModelSpec, load_model, load_model_within, split_quant_suffix

HF_DTYPES = {
    "auto": None,
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
}
GGUF_DEFAULT = "Q4_K_M"  # what Ollama library tags without a quantization suffix ship
TRUE = ("1", "true", "yes", "on")


@dataclass
class CheckResult:
    command: ParsedCommand
    node: Node
    candidate: Candidate
    model: ModelSpec
    cluster: Cluster
    notes: list[str]
    suggestions: PlanResult | None = None
    problems: list[Issue] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def suggestion(self) -> Candidate | None:
        return self.suggestions.best if self.suggestions else None

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        data: dict[str, Any] = {
            "feasible": self.feasible,
            "backend": c.backend,
            "tp": c.layout.tp,
            "pp": c.layout.pp,
            "node": self.node.name,
            "gpus": [g.index for g in c.layout.gpus],
        }
        data["problems"] = [p.to_json() for p in self.problems]
        data["risks"] = [r.to_json() for r in c.risks]
        details = candidate_json(c, self.model, self.cluster)
        data["memory_gib_per_gpu"] = details.get("memory_gib_per_gpu")
        data["breakdown"] = details.get("breakdown")
        data["kv_cache_tokens"] = details.get("kv_cache_tokens")
        for key in ("weights_gib_per_gpu", "decode_tok_s", "decode_tok_s_total", "prefill_tok_s"):
            data[key] = details.get(key)
        data["why"] = why_text(c, self.model) if c.memory and c.perf else None
        data["notes"] = self.notes
        data["assumes"] = c.perf.assumes if c.perf else []
        best = self.suggestion
        data["suggestion"] = plan_json(best, self.model, self.cluster) if best else None
        same = self._same_backend()
        if same is not None and same is not best:
            data["suggestion_same_backend"] = plan_json(same, self.model, self.cluster)
        return data

    def _same_backend(self) -> Candidate | None:
        if not self.suggestions:
            return None
        return next((p for p in self.suggestions.plans if p.backend == self.candidate.backend), None)


def _node(cluster: Cluster, name: str | None) -> Node:
    if name:
        return cluster.node(name)
    if len(cluster.nodes) != 1:
        raise PlacementError(
            f"the cluster has {len(cluster.nodes)} nodes; say which one the command runs on (--node)"
        )
    return cluster.nodes[0]


def _model(
    cmd: ParsedCommand, model_dirs: list[Path] | None = None, spec: ModelSpec | None = None
) -> tuple[ModelSpec, str | None]:
    """The model (`spec` when the caller has it, e.g. from the config an agent reported) and the dtype the
    command implies (None: the model's own). With `model_dirs`, a model path is read only under those
    directories (a command sent to the server by someone who may not read its files)."""
    if spec is not None:
        model = spec
    elif model_dirs is None:
        model = load_model(cmd.model_ref)
    else:
        model = load_model_within(cmd.model_ref, model_dirs)
    if cmd.backend in (VLLM, SGLANG):
        quant = cmd.get("--quantization")
        dtype = quant if quant in ("fp8", "awq", "gptq") else HF_DTYPES.get(str(cmd.get("--dtype", "auto")))
        return model, dtype
    if model.gguf is not None:
        return model, None
    _, suffix = split_quant_suffix(cmd.model_ref.removesuffix(":latest").removesuffix(".gguf"))
    return model, (suffix.upper() if suffix else GGUF_DEFAULT)


def _request(cmd: ParsedCommand, model: ModelSpec, dtype: str | None, concurrency: int | None) -> Request:
    env = cmd.env
    if cmd.backend in (VLLM, SGLANG):
        return Request(
            max_model_len=cmd.integer("--max-model-len", model.max_position_embeddings),
            concurrency=concurrency or 1,
            dtype=dtype,
            kv_cache_dtype=cmd.get("--kv-cache-dtype", "auto") or "auto",
            backend=cmd.backend,
            gpu_memory_utilization=_fraction(cmd),
            max_num_batched_tokens=cmd.integer("--max-num-batched-tokens"),
            max_num_seqs=cmd.integer("--max-num-seqs"),
            enforce_eager=cmd.flag("--enforce-eager") or cmd.flag("--disable-cuda-graph"),
        )
    if cmd.backend == LLAMA_CPP:
        slots = cmd.integer("--parallel", 1) or 1
        total = cmd.integer("--ctx-size", 4096) or model.max_position_embeddings
        return Request(
            max_model_len=max(1, total // slots),
            concurrency=slots,
            dtype=dtype,
            kv_cache_dtype=cmd.get("--cache-type-k", "f16") or "f16",
            backend=LLAMA_CPP,
            flash_attention=str(cmd.get("--flash-attn", "on")).lower() not in ("off", "0", "false"),
            split_mode=cmd.get("--split-mode", "layer") or "layer",
        )
    flash = env.get("OLLAMA_FLASH_ATTENTION", "0").lower() in TRUE
    return Request(
        max_model_len=_env_int(env, "OLLAMA_CONTEXT_LENGTH", 4096),
        concurrency=_env_int(env, "OLLAMA_NUM_PARALLEL", 1),
        dtype=dtype,
        kv_cache_dtype=env.get("OLLAMA_KV_CACHE_TYPE", "f16") if flash else "f16",  # quantized KV needs FA
        backend=OLLAMA,
        flash_attention=flash,
    )


def _env_int(env: dict[str, str], key: str, default: int) -> int:
    try:
        return int(env.get(key, default))
    except ValueError as exc:
        raise PlacementError(f"{key} must be an integer, got '{env[key]}'") from exc


def _fraction(cmd: ParsedCommand) -> float:
    """The fraction the server will really use: the flag, else its fixed default (no lowering for busy GPUs)."""
    explicit = cmd.number("--gpu-memory-utilization")
    if explicit is not None:
        return explicit
    return default_fraction(cmd.backend, cmd.integer("--tensor-parallel-size", 1) or 1)


def _visible_gpus(
    cmd: ParsedCommand, node: Node, visible: list[int] | str | None, env: dict[str, str] | None
) -> tuple[list[GPU], list[str]]:
    text = visible if isinstance(visible, str) else ",".join(map(str, visible)) if visible else None
    text = text or cmd.env.get("CUDA_VISIBLE_DEVICES") or (env or {}).get("CUDA_VISIBLE_DEVICES")
    indices = [g.index for g in node.gpus]
    if not text:
        return list(node.gpus), []
    chosen, notes = parse_visible(text, indices)
    gpus = [node.gpu(i) for i in chosen]
    if len({g.model for g in gpus}) > 1 and cmd.env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        notes.append(
            "mixed GPU models without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers the fastest GPU "
            "first, so CUDA_VISIBLE_DEVICES indices may not match nvidia-smi's"
        )
    return [g for g in gpus if g is not None], notes


def _hf_layout(ev: Evaluator, cmd: ParsedCommand, gpus: list[GPU]) -> tuple[Any, list[Issue]]:
    tp = cmd.integer("--tensor-parallel-size", 1) or 1
    pp = cmd.integer("--pipeline-parallel-size", 1) or 1
    problems = []
    if tp * pp > len(gpus):
        problems.append(
            Issue(
                "divisibility",
                f"TP={tp} x PP={pp} needs {tp * pp} GPUs but only {len(gpus)} are "
                "visible; the server stops with a world-size error",
            )
        )
        tp, pp = min(tp, len(gpus)), 1
    stages = [tuple(gpus[i * tp : (i + 1) * tp]) for i in range(pp)]
    layers = _partition(cmd.env.get("VLLM_PP_LAYER_PARTITION"), ev.model.num_layers, pp)
    return make_layout(ev.cluster, cmd.backend, stages, layers), problems


def _partition(text: str | None, layers: int, pp: int) -> list[int]:
    if not text:
        return even_layers(layers, pp)
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError as exc:
        raise PlacementError(f"VLLM_PP_LAYER_PARTITION must list integers, got '{text}'") from exc
    if len(counts) != pp or sum(counts) != layers:
        raise PlacementError(
            f"VLLM_PP_LAYER_PARTITION={text} must give {pp} stages summing to {layers} layers"
        )
    return counts


def _gguf_layout(ev: Evaluator, cmd: ParsedCommand, gpus: list[GPU]) -> Any:
    split = cmd.get("--tensor-split")
    if cmd.backend == LLAMA_CPP and (cmd.get("--split-mode") or "layer") != "layer":
        return make_layout(ev.cluster, LLAMA_CPP, [tuple(gpus)], [ev.model.num_layers])
    if split:
        fractions = _fractions(split)
        counts = counts_from_fractions(fractions + [0.0] * (len(gpus) - len(fractions)), ev.model.num_layers)
        return make_layout(ev.cluster, cmd.backend, [(g,) for g in gpus], counts)
    if cmd.backend == OLLAMA and cmd.env.get("OLLAMA_SCHED_SPREAD", "0").lower() not in TRUE:
        single = ev.evaluate(ev.layer_split(OLLAMA, [max(gpus, key=lambda g: g.memory_free_mib)]))
        if single.feasible:
            return single.layout  # Ollama keeps a model on one GPU when it fits there
    return ev.layer_split(cmd.backend, gpus)


def _fractions(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace("/", ",").split(",")]
    except ValueError as exc:
        raise PlacementError(f"--tensor-split must list numbers, got '{text}'") from exc


def _notes(cmd: ParsedCommand, model: ModelSpec) -> list[str]:
    notes = []
    if cmd.backend == OLLAMA and cmd.env:
        notes.append(
            "OLLAMA_* variables configure the server: set them where `ollama serve` starts, not only "
            "for `ollama run`"
        )
    layers = cmd.integer("--n-gpu-layers")
    if cmd.backend == LLAMA_CPP and layers is not None and layers < model.num_layers:
        notes.append(
            f"-ngl {layers} leaves {model.num_layers - layers} layers on the CPU; this check assumes "
            "all layers on GPUs"
        )
    return notes


def _ollama_spills(candidate: Candidate, problems: list[Issue]) -> list[Issue]:
    """Ollama does not refuse a model that does not fit: it keeps the layers that do not fit on the CPU.
    Memory shortfalls become a risk (it runs, much slower) instead of a problem."""
    spill = [p for p in problems if p.code in ("memory", "busy")]
    for p in spill:
        candidate.risks.append(
            Issue(
                p.code,
                f"{p.message}; Ollama will keep the layers that do not fit on the CPU, "
                "so it starts but decodes far slower than predicted",
            )
        )
    return [p for p in problems if p not in spill]


def _explicit_length(cmd: ParsedCommand, request: Request) -> int | None:
    """The context the operator asked for; None lets the planner pick one (vLLM would default to the
    model's full max_position_embeddings)."""
    if cmd.backend in (VLLM, SGLANG) and cmd.get("--max-model-len") is None:
        return None
    return request.max_model_len


def check_command(
    argv: list[str] | str,
    cluster: Cluster,
    visible: list[int] | str | None = None,
    env: dict[str, str] | None = None,
    node: str | None = None,
    concurrency: int | None = None,
    model_dirs: list[Path] | None = None,
    spec: ModelSpec | None = None,
    backend_version: tuple[str | None, str] = (None, ""),
) -> CheckResult:
    """Judge one launch command on `cluster`. `backend_version`: the vLLM release that serves and where that
    came from (placement.request.Request.backend_version and its source)."""
    cmd = parse_command(argv)
    target = _node(cluster, node)
    model, dtype = _model(cmd, model_dirs, spec)
    version, source = backend_version
    request = replace(
        _request(cmd, model, dtype, concurrency), backend_version=version, backend_version_source=source
    )
    ev = Evaluator(model, cluster, request)
    if not ev.backends:
        raise PlacementError(f"{cmd.backend} cannot load {model.name} as {dtype or model.native_format}")
    gpus, notes = _visible_gpus(cmd, target, visible, env)
    if cmd.backend in (VLLM, SGLANG):
        layout, shape_problems = _hf_layout(ev, cmd, gpus)
    else:
        layout, shape_problems = _gguf_layout(ev, cmd, gpus), []
    data_mode = cmd.get("--mm-encoder-tp-mode") == "data"
    candidate = ev.evaluate(layout, encoder_data_mode=data_mode)
    result = CheckResult(cmd, target, candidate, model, cluster, notes + _notes(cmd, model) + candidate.notes)
    result.problems = shape_problems + candidate.problems
    if cmd.backend == OLLAMA:
        result.problems = _ollama_spills(candidate, result.problems)
    free = replace(
        request,
        backend=None,
        gpu_memory_utilization=None,
        node=target.name,
        split_mode="layer",
        max_model_len=_explicit_length(cmd, request),
    )
    result.suggestions = plan(model, cluster, free)
    return result

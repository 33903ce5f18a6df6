"""Per-GPU memory as vLLM and SGLang size it (formulas and sources: docs/research.md section 3).

vLLM (V1 worker): budget = total x gpu_memory_utilization; weights per TP/PP shard; activation peak of
the profiling run; non-torch memory (NCCL, cuBLAS); the KV pool takes the rest of the budget; CUDA
graphs are captured afterwards, outside the budget. SGLang: static pool = total x mem_fraction_static
holds weights + KV; activations and graphs live in the remainder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from placement.cluster import GPU
from placement.layout import Layout
from placement.request import SGLANG, Request, Settings, parse_version
from placement.spec import ModelSpec
from placement.weights import WeightBytes

GIB = float(2**30)
BLOCK = 16  # vLLM KV block size in tokens
ACT_BYTES = 2  # bf16 activations
NON_TORCH_GIB = 0.35  # vllm#10517 log: non_torch_memory=0.35GiB (TP=1)
# More than one rank adds NCCL and custom all-reduce buffers outside torch: vllm PR #10511's H100 logs of one
# model at TP1 and TP2 show non_torch_memory 1.79 -> 3.58 GiB (fixture vllm_memory_profile_pr10511.txt).
TP_NON_TORCH_GIB = 1.79


@dataclass(frozen=True)
class NonTorchBand:
    """What vLLM's memory profiler of the releases [since, until) counts as non-torch memory per rank, from
    public logs of such a release (`source`): at TP1, and at TP>1."""

    since: tuple[int, ...]
    until: tuple[int, ...]
    tp1_gib: float
    tp_many_gib: float
    source: str


# Releases with public profiling lines; any other version (or none given) keeps NON_TORCH_GIB and
# NON_TORCH_GIB + TP_NON_TORCH_GIB, the pessimistic pair (V1, the default engine from 0.8.0, logs no
# non-torch figure at INFO level).
VLLM_NON_TORCH = (
    NonTorchBand(
        (0, 6, 5), (0, 7, 0), 1.79, 3.58, "vllm PR #10511's H100 logs (released in 0.6.5), TP1 and TP2"
    ),
    NonTorchBand(
        (0, 7, 0),
        (0, 8, 0),
        0.16,
        0.20,
        "vllm PR #12126's H100 log (0.7.0) at TP1; PR #14447's V0 log of 0.8.3rc2 at TP16 (same profiler)",
    ),
)


def non_torch_band(version: str | None) -> NonTorchBand | None:
    if not version:
        return None
    release = parse_version(version)
    return next((b for b in VLLM_NON_TORCH if b.since <= release < b.until), None)


def vllm_release_note(request: Request) -> str:
    """The plan's assumption about the vLLM release: which one, where it came from, the non-torch memory it sets."""
    version, source = request.backend_version, request.backend_version_source
    default = f"{NON_TORCH_GIB:g} GiB per rank, {NON_TORCH_GIB + TP_NON_TORCH_GIB:g} at TP>1"
    if not version:
        why = source or "none given with the request"
        return f"vLLM release unknown ({why}): non-torch memory at the pessimistic {default}"
    where = source or "given with the request"
    band = non_torch_band(version)
    if band is None:
        return f"vLLM {version} ({where}): no public profiling figures for it, non-torch memory at {default}"
    return (
        f"vLLM {version} ({where}): non-torch memory {band.tp1_gib:g} GiB per rank, {band.tp_many_gib:g} at "
        f"TP>1 ({band.source})"
    )


NCCL_GIB = 0.10  # pipeline ranks only (no TP): NCCL send/recv buffers, no all-reduce buffers
# vLLM and SGLang budget from the total CUDA reports (torch.cuda.mem_get_info), which is below NVML's total
# by what the driver keeps: H100 81559 MiB (79.65 GiB) in NVML, total_gpu_memory 79.22 GiB in vLLM's log.
CUDA_RESERVED_GIB = 0.43
CUDA_GRAPH_GIB = 0.5  # public logs show 0.1-3.5 GiB; 0.66 GiB is a typical single-GPU figure
SAFETY_GIB = 0.25  # headroom left when the planner lowers the utilization below 0.9 for busy GPUs
DEFAULT_UTILIZATION = 0.9
ENCODER_BUDGET_TOKENS = 16384  # vLLM encoder cache budget for Qwen-VL ("budget of 16384 tokens", vllm#27706)
BUSY_GIB = 1.0  # memory other processes hold before it is worth a `busy` risk


@dataclass(frozen=True)
class Issue:
    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass
class GpuMemory:
    gpu: GPU
    stage: int
    first_layer: int
    layer_count: int
    parts: dict[str, float]  # GiB
    limit_gib: float  # what all parts together may use on this GPU
    limit_text: str
    kv_tokens: int | None = None
    budget_gib: float | None = None  # vLLM/SGLang: total x fraction

    @property
    def used_gib(self) -> float:
        return sum(self.parts.values())

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"node": self.gpu.node, "gpu": self.gpu.index, "name": self.gpu.name}
        data["layers"] = (
            [self.first_layer, self.first_layer + self.layer_count - 1] if self.layer_count else []
        )
        data.update({f"{key}_gib": round(value, 2) for key, value in self.parts.items()})
        data.update(
            total_gib=round(self.used_gib, 2),
            limit_gib=round(self.limit_gib, 2),
            limit=self.limit_text,
            free_gib=round(self.gpu.free_gib, 2),
            capacity_gib=round(self.gpu.total_gib, 2),
        )
        if self.budget_gib is not None:
            data["budget_gib"] = round(self.budget_gib, 2)
        if self.kv_tokens is not None:
            data["kv_tokens"] = self.kv_tokens
        return data


@dataclass
class MemoryReport:
    gpus: list[GpuMemory]
    kv_tokens: int | None
    problems: list[Issue] = field(default_factory=list)
    risks: list[Issue] = field(default_factory=list)
    knobs: dict[str, object] = field(default_factory=dict)

    @property
    def weights_gib_max(self) -> float:
        return max(g.parts.get("weights", 0.0) for g in self.gpus)


# ---------------------------------------------------------------- shared pieces


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads each TP rank holds: n_kv/tp, but at least one (replicated once TP exceeds n_kv)."""
    return max(1, model.num_kv_heads // tp)


def kv_layers_in(model: ModelSpec, layer_count: int) -> float:
    """Full-attention layers among `layer_count` (sliding/linear layers spread evenly)."""
    return layer_count * model.kv_layers / model.num_layers


def sharded_layer_bytes(model: ModelSpec, wb: WeightBytes, first: int, count: int, tp: int) -> float:
    """One rank's share of layers [first, first+count): linears split by TP, k/v projections replicated
    once TP exceeds the KV heads."""
    span = wb.layer_span(first, first + count)
    kv = wb.kv_proj * count
    return (span - kv) / tp + kv * kv_heads_per_rank(model, tp) / model.num_kv_heads


def vision_sharded(model: ModelSpec, tp: int) -> bool:
    """vLLM shards the ViT by TP (`--mm-encoder-tp-mode weights`) only when TP divides its heads."""
    return model.vision is not None and model.vision.num_heads % tp == 0


def stage_weight_bytes(model: ModelSpec, wb: WeightBytes, layout: Layout, stage: int) -> float:
    tp, last = layout.tp, layout.pp - 1
    total = sharded_layer_bytes(model, wb, layout.first_layer(stage), layout.layers[stage], tp)
    if stage == 0:
        total += wb.embed / tp + wb.vision / (tp if vision_sharded(model, tp) else 1)
    if stage == last and (not model.tie_word_embeddings or layout.pp > 1):
        total += wb.lm_head / tp
    return total


def non_torch_extra(layout: Layout) -> float:
    """Non-torch memory more ranks bring: TP's all-reduce buffers, or NCCL's alone between pipeline stages."""
    if layout.tp > 1:
        return TP_NON_TORCH_GIB
    return NCCL_GIB if len(layout.gpus) > 1 else 0.0


def non_torch_gib(layout: Layout, settings: Settings) -> float:
    """Non-torch memory per rank: the figure public logs of the requested vLLM release show, else the default."""
    band = non_torch_band(settings.request.backend_version) if settings.backend != SGLANG else None
    if band is None:
        return NON_TORCH_GIB + non_torch_extra(layout)
    if layout.tp > 1:
        return band.tp_many_gib
    return band.tp1_gib + (NCCL_GIB if len(layout.gpus) > 1 else 0.0)


def cuda_total_gib(gpu: GPU) -> float:
    """The total vLLM and SGLang budget from: NVML's total less what the driver keeps."""
    return max(0.0, gpu.total_gib - CUDA_RESERVED_GIB)


def batch_defaults(gpu: GPU, settings: Settings) -> tuple[int, int]:
    """vLLM `vllm serve` defaults: 8192 batched tokens / 1024 sequences on >=70 GiB GPUs other than
    A100, else 2048 / 256 (EngineArgs usage-context defaults)."""
    big = gpu.total_gib >= 70 and "A100" not in gpu.model
    tokens = settings.request.max_num_batched_tokens or (8192 if big else 2048)
    seqs = settings.request.max_num_seqs or (1024 if big else 256)
    return tokens, seqs


def activation_bytes(model: ModelSpec, tp: int, tokens: int, seqs: int, first: bool, last: bool) -> float:
    """Peak of the profiling run: the MLP of `tokens` tokens (residual + input + gate_up + act out =
    2H + 3I/TP), the ViT on one maximum-size image on the first stage, the sampler's fp32 logits and
    probabilities for `seqs` sequences on the last stage."""
    text = tokens * (2 * model.hidden_size + 3 * model.mlp_intermediate_active / tp) * ACT_BYTES
    vision = cache = 0.0
    if model.vision and first:
        v = model.vision
        patches = ENCODER_BUDGET_TOKENS * v.spatial_merge_size**2
        split = tp if vision_sharded(model, tp) else 1
        vision = patches * (2 * v.hidden_size + 2 * v.intermediate_size / split) * ACT_BYTES
        cache = ENCODER_BUDGET_TOKENS * v.out_hidden_size * ACT_BYTES
    sampler = seqs * model.vocab_size * 4 * 2 if last else 0.0
    return max(text, vision) + cache + sampler


def kv_bytes_per_token(model: ModelSpec, layout: Layout, stage: int, kv_bytes: float) -> float:
    """KV bytes one GPU of `stage` stores per token. MLA caches one latent per token and layer that every TP
    rank holds whole (vLLM's MLA backends replicate it)."""
    if model.is_mla:
        return kv_layers_in(model, layout.layers[stage]) * model.mla_latent_width * kv_bytes
    heads = kv_heads_per_rank(model, layout.tp)
    return 2 * kv_layers_in(model, layout.layers[stage]) * heads * model.head_dim * kv_bytes


def context_problems(model: ModelSpec, settings: Settings) -> list[Issue]:
    if settings.max_model_len <= model.max_position_embeddings:
        return []
    return [
        Issue(
            "context",
            f"context {settings.max_model_len:,} tokens exceeds the model's "
            f"max_position_embeddings {model.max_position_embeddings:,} (needs rope scaling in the "
            "config; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
        )
    ]


# ---------------------------------------------------------------- budget (utilization) and busy GPUs


def choose_fraction(
    layout: Layout, settings: Settings, outside_gib: float
) -> tuple[float, list[Issue], list[Issue]]:
    """The memory fraction to run with, plus busy risks and problems.

    An explicit fraction is kept and checked against free memory (vLLM refuses to start when free
    memory is below total x fraction). Otherwise 0.9, lowered to what the busiest GPU leaves free."""
    name = "--mem-fraction-static" if settings.backend == SGLANG else "--gpu-memory-utilization"
    requested = settings.request.gpu_memory_utilization
    if requested is not None:
        return requested, [], _startup_problems(layout, requested, name)
    fits = min((g.free_gib - outside_gib - SAFETY_GIB) / cuda_total_gib(g) for g in layout.gpus)
    default = default_fraction(settings.backend, layout.tp)
    fraction = default if fits >= default else max(0.05, math.floor(fits * 100) / 100)
    return fraction, _busy_risks(layout, fraction, default, name), []


def default_fraction(backend: str, tp: int) -> float:
    """vLLM: 0.9. SGLang (server_args, releases before the memory-based default): by TP size."""
    if backend != SGLANG:
        return DEFAULT_UTILIZATION
    return 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88


def _startup_problems(layout: Layout, fraction: float, name: str) -> list[Issue]:
    problems = []
    for gpu in layout.gpus:
        wanted = cuda_total_gib(gpu) * fraction
        if gpu.free_gib < wanted:
            problems.append(
                Issue(
                    "busy",
                    f"{gpu.label}: only {gpu.free_gib:.1f} of {gpu.total_gib:.1f} GiB free "
                    f"({gpu.used_gib:.1f} GiB used by other processes); {name} {fraction:g} asks "
                    f"for {wanted:.1f} GiB at startup, so the server refuses to start",
                )
            )
    return problems


def _busy_risks(layout: Layout, fraction: float, default: float, name: str) -> list[Issue]:
    busy = [g for g in layout.gpus if g.used_gib >= BUSY_GIB]
    if not busy:
        return []
    used = ", ".join(f"{g.label} {g.used_gib:.1f} GiB" for g in busy)
    action = (
        f"{name} lowered from {default:g} to {fraction:g} to fit"
        if fraction < default
        else f"{name} {fraction:g} still fits"
    )
    return [
        Issue(
            "busy",
            f"other processes already use memory ({used}); {action}; if they grow, the "
            "server can fail to start or run out of memory",
        )
    ]


# ---------------------------------------------------------------- vLLM and SGLang


def vllm_family_memory(model: ModelSpec, wb: WeightBytes, layout: Layout, settings: Settings) -> MemoryReport:
    graphs = 0.0 if settings.request.enforce_eager else CUDA_GRAPH_GIB
    sglang = settings.backend == SGLANG
    tokens, seqs = batch_defaults(layout.gpus[0], settings)
    peaks = [
        activation_bytes(model, layout.tp, tokens, seqs, s == 0, s == layout.pp - 1) / GIB
        for s in range(layout.pp)
    ]
    non_torch = non_torch_gib(layout, settings)
    # vLLM captures graphs outside its budget; SGLang keeps activations, graphs and non-torch memory outside.
    outside = graphs + (max(peaks) + non_torch if sglang else 0.0)
    fraction, risks, problems = choose_fraction(layout, settings, outside)
    gpus = []
    for stage, group in enumerate(layout.stages):
        weights = stage_weight_bytes(model, wb, layout, stage) / GIB
        per_token = kv_bytes_per_token(model, layout, stage, settings.kv_bytes)
        parts = {"weights": weights, "activation": peaks[stage], "non_torch": non_torch}
        gpus += [
            _rank_memory(parts, per_token, settings, layout, stage, gpu, fraction, graphs) for gpu in group
        ]
    kv_tokens = min(g.kv_tokens or 0 for g in gpus)
    problems += _fit_problems(gpus, settings, kv_tokens, sglang) + context_problems(model, settings)
    knob = "mem_fraction_static" if sglang else "gpu_memory_utilization"
    knobs = {knob: fraction, "max_num_batched_tokens": tokens, "max_num_seqs": seqs}
    return MemoryReport(gpus, kv_tokens, problems, risks, knobs)


def _rank_memory(
    shared: dict[str, float],
    per_token: float,
    settings: Settings,
    layout: Layout,
    stage: int,
    gpu: GPU,
    fraction: float,
    graphs: float,
) -> GpuMemory:
    """One GPU: the stage's weights, activation and non-torch memory; the rest of the budget is KV."""
    budget = cuda_total_gib(gpu) * fraction
    sglang = settings.backend == SGLANG
    kv_gib = max(0.0, budget - _inside_budget(shared, sglang))
    block = 1 if sglang else BLOCK
    parts = {**shared, "kv_cache": kv_gib, "cuda_graphs": graphs}
    kv_tokens = int(kv_gib * GIB // (per_token * block)) * block if per_token else 0
    return GpuMemory(
        gpu,
        stage,
        layout.first_layer(stage),
        layout.layers[stage],
        parts,
        gpu.free_gib,
        f"{gpu.free_gib:.1f} GiB free",
        kv_tokens,
        budget,
    )


def _inside_budget(parts: dict[str, float], sglang: bool) -> float:
    """What must fit in the budget before the KV pool: SGLang's static pool holds only weights + KV."""
    if sglang:
        return parts["weights"]
    return parts["weights"] + parts["activation"] + parts["non_torch"]


def _fit_problems(gpus: list[GpuMemory], settings: Settings, kv_tokens: int, sglang: bool) -> list[Issue]:
    problems = [issue for g in gpus if (issue := _gpu_fit(g, settings, sglang))]
    if not problems and kv_tokens < settings.max_model_len:
        problems.append(
            Issue(
                "context",
                f"the KV cache holds {kv_tokens:,} tokens per replica, fewer than the "
                f"{settings.max_model_len:,}-token context one request may need (vLLM: \"The model's "
                "max seq len is larger than the maximum number of tokens that can be stored in KV "
                'cache"); shorten the context, use an fp8 KV cache, or add GPUs',
            )
        )
    return problems


def _gpu_fit(g: GpuMemory, settings: Settings, sglang: bool) -> Issue | None:
    budget = g.budget_gib or 0.0
    need = _inside_budget(g.parts, sglang)
    idle_budget = cuda_total_gib(g.gpu) * default_fraction(settings.backend, 1)
    code = "busy" if need <= idle_budget and g.gpu.used_gib >= BUSY_GIB else "memory"
    if need > budget:
        parts = f"weights {need:.1f} GiB"
        if not sglang:
            parts = (
                f"weights {g.parts['weights']:.1f} + activation peak {g.parts['activation']:.1f} + non-torch "
                f"{g.parts['non_torch']:.2f} = {need:.1f} GiB"
            )
        return Issue(
            code,
            f"{g.gpu.label}: {parts} exceed the budget of "
            f"{budget / cuda_total_gib(g.gpu):g} x {cuda_total_gib(g.gpu):.1f} GiB (the total CUDA reports) = "
            f"{budget:.1f} GiB, leaving "
            "nothing for the KV cache",
        )
    if g.used_gib > g.gpu.free_gib + 1e-9:
        outside = g.used_gib - budget
        what = (
            "activations, CUDA graphs and non-torch memory"
            if sglang
            else "CUDA graphs (captured after the KV pool)"
        )
        return Issue(
            code,
            f"{g.gpu.label}: the {budget:.1f} GiB budget plus {what} ({outside:.1f} GiB) exceed the "
            f"{g.gpu.free_gib:.1f} GiB free; lower the fraction{'' if sglang else ' or add --enforce-eager'}",
        )
    return None

"""Per-GPU memory for llama.cpp and Ollama (`--split-mode layer`), docs/research.md section 3.

Each GPU holds a contiguous block of layers with their KV cache, its own compute buffer and a CUDA
context; the first GPU also holds the vision projector (mmproj), the last one the output layer. Token
embeddings stay in host memory. llama-server's `-c` is the total KV over all `-np` slots; Ollama
reserves num_ctx x OLLAMA_NUM_PARALLEL tokens.
"""

from __future__ import annotations

from placement.cluster import GPU
from placement.layout import Layout
from placement.memory import BUSY_GIB, GIB, GpuMemory, Issue, MemoryReport, context_problems
from placement.request import OLLAMA, Settings
from placement.spec import ModelSpec
from placement.weights import WeightBytes

UBATCH = 512  # llama.cpp default n_ubatch
CUDA_CONTEXT_GIB = 0.45  # CUDA context + cuBLAS workspace; Ollama reserves 457 MiB per GPU
IMAGE_PATCHES = 4096  # patches of one default-size image through the projector (f32 compute)


def kv_tokens_total(settings: Settings) -> int:
    return settings.max_model_len * settings.concurrency


def kv_bytes_per_layer(model: ModelSpec, settings: Settings) -> float:
    """KV of one layer, averaged over full and sliding-window layers (SWA layers keep
    min(n_ctx, window x n_seq + n_ubatch) cells, llama.cpp's swa cache size)."""
    tokens = kv_tokens_total(settings)
    per_token = 2 * model.num_kv_heads * model.head_dim * settings.kv_bytes
    if model.is_mla:  # llama.cpp's deepseek2 graph caches the MLA latent, as vLLM does
        per_token = model.mla_latent_width * settings.kv_bytes
    window = model.sliding_window or tokens
    swa_tokens = min(tokens, window * settings.concurrency + UBATCH)
    kv_layer_tokens = model.kv_layers * tokens + model.sliding_layers * swa_tokens
    return per_token * kv_layer_tokens / model.num_layers


def compute_buffer_bytes(model: ModelSpec, settings: Settings) -> float:
    """Graph size as Ollama's estimator computes it (`GraphSize`, llama family):
    max(4 ub (1 + 4H + ctx (1 + heads)), 4 ub (H + V)); flash attention drops the ctx x heads scores."""
    scores = 0 if settings.request.flash_attention else kv_tokens_total(settings) * (1 + model.num_heads)
    body = 4 * UBATCH * (1 + 4 * model.hidden_size + scores)
    logits = 4 * UBATCH * (model.hidden_size + model.vocab_size)
    return max(body, logits)


def projector_compute_bytes(model: ModelSpec, wb: WeightBytes) -> float:
    if not wb.vision:
        return 0.0
    if model.vision is None:
        return IMAGE_PATCHES * 4 * 4 * model.hidden_size  # mmproj-only GGUF: size from the text width
    v = model.vision
    return IMAGE_PATCHES * (2 * v.hidden_size + 2 * v.intermediate_size) * 4


def _fixed(
    model: ModelSpec, wb: WeightBytes, settings: Settings, first: bool, last: bool
) -> dict[str, float]:
    parts = {"cuda_context": CUDA_CONTEXT_GIB, "compute_buffer": compute_buffer_bytes(model, settings) / GIB}
    if first and wb.vision:
        parts["vision"] = (wb.vision + projector_compute_bytes(model, wb)) / GIB
    if last:
        parts["output_layer"] = wb.lm_head / GIB
    return parts


def _capacities(
    model: ModelSpec, wb: WeightBytes, gpus: list[GPU], settings: Settings, free: bool
) -> list[float]:
    last = len(gpus) - 1
    return [
        (g.free_gib if free else g.total_gib) - sum(_fixed(model, wb, settings, i == 0, i == last).values())
        for i, g in enumerate(gpus)
    ]


def _proportional(demands: list[float], capacities: list[float]) -> list[int]:
    """llama.cpp-style split: layer i goes to the first GPU whose cumulative capacity share exceeds i/n."""
    usable = [max(c, 0.0) for c in capacities]
    total = sum(usable) or 1.0
    counts = [0] * len(capacities)
    bounds, running = [], 0.0
    for c in usable:
        running += c / total
        bounds.append(running)
    for i in range(len(demands)):
        share = (i + 0.5) / len(demands)
        counts[next((g for g, b in enumerate(bounds) if share < b), len(bounds) - 1)] += 1
    return counts


def _greedy(demands: list[float], capacities: list[float]) -> list[int]:
    """Fill each GPU in order as far as it goes (feasible whenever any in-order split is)."""
    counts, layer = [0] * len(capacities), 0
    for g, capacity in enumerate(capacities):
        room = capacity
        while layer < len(demands) and demands[layer] <= room + 1e-9:
            room -= demands[layer]
            counts[g] += 1
            layer += 1
    counts[-1] += len(demands) - layer
    return counts


def _fits(demands: list[float], capacities: list[float], counts: list[int]) -> bool:
    start = 0
    for capacity, count in zip(capacities, counts, strict=True):
        if sum(demands[start : start + count]) > capacity + 1e-9:
            return False
        start += count
    return True


def layer_demands(model: ModelSpec, wb: WeightBytes, settings: Settings) -> list[float]:
    kv = kv_bytes_per_layer(model, settings)
    return [(size + kv) / GIB for size in wb.layers]


def layer_split_counts(model: ModelSpec, wb: WeightBytes, gpus: list[GPU], settings: Settings) -> list[int]:
    """Layers per GPU: proportional to what each GPU has free after its fixed buffers, else greedy."""
    demands = layer_demands(model, wb, settings)
    capacities = _capacities(model, wb, gpus, settings, free=True)
    counts = _proportional(demands, capacities)
    if _fits(demands, capacities, counts):
        return counts
    greedy = _greedy(demands, capacities)
    return greedy if _fits(demands, capacities, greedy) else counts


def counts_from_fractions(fractions: list[float], layers: int) -> list[int]:
    """What llama.cpp does with `--tensor-split a,b,c`: the output layer counts as one more layer."""
    counts = _proportional([1.0] * (layers + 1), fractions)
    counts[-1] -= 1
    return counts


def layer_split_memory(model: ModelSpec, wb: WeightBytes, layout: Layout, settings: Settings) -> MemoryReport:
    gpus = layout.gpus
    kv = kv_bytes_per_layer(model, settings)
    reports = []
    for i, gpu in enumerate(gpus):
        first, count = layout.first_layer(i), layout.layers[i]
        parts = {"weights": wb.layer_span(first, first + count) / GIB, "kv_cache": kv * count / GIB}
        parts.update(_fixed(model, wb, settings, i == 0, i == len(gpus) - 1))
        reports.append(GpuMemory(gpu, i, first, count, parts, gpu.free_gib, f"{gpu.free_gib:.1f} GiB free"))
    total_tokens = kv_tokens_total(settings)
    problems = _layer_problems(reports) + context_problems(model, settings)
    knobs = {"n_ctx": total_tokens, "n_parallel": settings.concurrency, "tensor_split": list(layout.layers)}
    if settings.backend == OLLAMA:
        knobs = {"num_ctx": settings.max_model_len, "OLLAMA_NUM_PARALLEL": settings.concurrency}
    return MemoryReport(reports, total_tokens, problems, _busy_risks(reports), knobs)


def _layer_problems(reports: list[GpuMemory]) -> list[Issue]:
    over = [g for g in reports if g.used_gib > g.limit_gib + 1e-9]
    if not over:
        return []
    need = sum(g.used_gib for g in reports)
    offered = sum(g.gpu.free_gib for g in reports)
    worst = max(over, key=lambda g: g.used_gib - g.limit_gib)
    detail = ", ".join(f"{k} {v:.1f}" for k, v in worst.parts.items() if v >= 0.05)
    message = (
        f"{worst.gpu.label} would need {worst.used_gib:.1f} GiB ({detail}) but has {worst.gpu.free_gib:.1f} "
        f"GiB free; all {len(reports)} GPUs need {need:.1f} GiB and offer {offered:.1f} GiB free"
    )
    # Busy, not memory: the GPUs would hold it if other processes did not.
    busy = all(g.used_gib <= g.gpu.total_gib for g in over) and any(g.gpu.used_gib >= BUSY_GIB for g in over)
    if busy:
        message += " (other processes hold the difference)"
    return [Issue("busy" if busy else "memory", message)]


def _busy_risks(reports: list[GpuMemory]) -> list[Issue]:
    busy = [g for g in reports if g.gpu.used_gib >= BUSY_GIB]
    if not busy:
        return []
    used = ", ".join(f"{g.gpu.label} {g.gpu.used_gib:.1f} GiB" for g in busy)
    return [
        Issue(
            "busy",
            f"other processes already use memory ({used}); the split counts only free memory, "
            "so if they grow the load can fail",
        )
    ]


def tensor_split_memory(
    model: ModelSpec, wb: WeightBytes, layout: Layout, settings: Settings, mode: str
) -> MemoryReport:
    """`--split-mode row` (deprecated: splits only dense weights; KV and the rest on the main GPU) and
    `tensor` (experimental: weights and KV split across GPUs)."""
    gpus = layout.gpus
    n = len(gpus)
    kv_all = kv_bytes_per_layer(model, settings) * model.num_layers / GIB
    weights = wb.layer_span(0, model.num_layers) / GIB
    reports = []
    for i, gpu in enumerate(gpus):
        main = i == 0
        kv = kv_all / n if mode == "tensor" else (kv_all if main else 0.0)
        parts = {"weights": weights / n, "kv_cache": kv}
        parts.update(_fixed(model, wb, settings, main, i == n - 1))
        reports.append(
            GpuMemory(gpu, 0, 0, model.num_layers, parts, gpu.free_gib, f"{gpu.free_gib:.1f} GiB free")
        )
    problems = _layer_problems(reports) + context_problems(model, settings)
    return MemoryReport(
        reports,
        kv_tokens_total(settings),
        problems,
        _busy_risks(reports),
        {"n_ctx": kv_tokens_total(settings), "split_mode": mode},
    )

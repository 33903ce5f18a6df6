"""Predicted decode and prefill throughput: a roofline per pipeline stage plus communication.

Decode step of one stage at batch b:
    t_stage = max(bytes read / (HBM bandwidth x HBM_EFFICIENCY), FLOPs / (peak x DECODE_MFU)) + t_tp
    bytes read = the stage's weights (MoE: the experts b tokens touch; no embeddings, no vision tower)
                 + b x context x KV bytes per token on that GPU
    t_tp = 2 all-reduces per layer of b x hidden x 2 bytes over the TP group's worst link
Stages run one after another for a token (plus one activation hand-off per boundary). vLLM and SGLang
keep up to PP micro-batches in flight, so with enough streams the slowest stage sets the pace;
llama.cpp and Ollama run one batch through all GPUs per step (no decode pipelining).

Calibration (docs/placement.md, "Calibration"): HBM_EFFICIENCY is fitted on throughput_observations.csv;
the link constants come from the nccl-tests files (links.py); the rest are stated assumptions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from placement.calibration import FleetKey, factor_for, fleet_key
from placement.cluster import GPU
from placement.layout import Layout
from placement.links import Link
from placement.memory import kv_bytes_per_token, kv_heads_per_rank, sharded_layer_bytes, vllm_release_note
from placement.request import LLAMA_CPP, OLLAMA, SGLANG, VLLM, Settings
from placement.spec import ModelSpec
from placement.weights import WeightBytes

# Fraction of peak memory bandwidth decode reaches (derivation in docs/placement.md, "Calibration").
# vLLM/SGLang, fitted on throughput_observations.csv (tests/placement/test_placement_accuracy.py refits it): the
# two LambdaLabs H100 rows (Llama-3.1-70B FP8, TP1 TPOT 33.1 ms, TP2 over NVLink 22.3 ms) -> 0.60, the value
# whose errors on the two rows have a geometric mean of 1 (each row alone would give 0.66 and 0.55). SGLang
# has no row: it borrows vLLM's figure. llama.cpp/Ollama: LLAMA_CPP_EFFICIENCY below.
HBM_EFFICIENCY = {VLLM: 0.60, SGLANG: 0.60}
# llama.cpp/Ollama, fitted on the public llama-bench tg512/tg4096 tables in tests/data/fixtures/placement/
# llamabench_*.txt (10 of 16 files; the other 6 are held out, tests/placement/test_llama_bench_calibration.py
# refits it): HBM GPUs (A100, H100) reach 0.62 of peak, GDDR GPUs (RTX 3090/4090) 0.94, and every layer costs
# a fixed 0.11 ms per token on top (kernel launches and the small ops between the matrix-vector products).
LLAMA_CPP_EFFICIENCY = {"hbm": 0.62, "gddr": 0.94}
LLAMA_CPP_LAYER_MS = 0.11
HBM_FAMILIES = ("A30", "A100", "H100", "H200", "V100")  # GPU table rows with HBM; the rest have GDDR
# Fixed cost per decode step (scheduler, sampling, launches) with CUDA graphs; eager adds per layer.
STEP_OVERHEAD_MS = {VLLM: 0.5, SGLANG: 0.5, LLAMA_CPP: 0.5, OLLAMA: 0.8}
EAGER_MS_PER_LAYER = 0.04
DECODE_MFU = 0.5  # compute roofline for large decode batches
PREFILL_MFU = 0.5  # 4x3090 ik_llama pp2048 1005 tok/s on Llama-3-70B is ~0.5 of peak after comm
ACT_BYTES = 2


@dataclass
class StageTime:
    hbm_ms: float
    compute_ms: float
    tp_ms: float

    @property
    def total_ms(self) -> float:
        return max(self.hbm_ms, self.compute_ms) + self.tp_ms


@dataclass
class DecodeStep:
    """One decode cycle: `micro` micro-batches of `batch` streams pass through the stages."""

    micro: int
    batch: int
    stages: list[StageTime]
    handoff_ms: float
    overhead_ms: float

    @property
    def serial_ms(self) -> float:
        """One micro-batch through every stage in turn (what one stream waits per token)."""
        return sum(s.total_ms for s in self.stages) + self.handoff_ms + self.overhead_ms

    @property
    def cycle_ms(self) -> float:
        """Time until every micro-batch has produced a token; the slowest stage paces a full pipeline."""
        slowest = max(s.total_ms for s in self.stages) + self.overhead_ms
        return max(self.serial_ms, self.micro * slowest)

    @property
    def tok_s(self) -> float:
        return self.micro * self.batch / self.cycle_ms * 1e3

    def to_json(self) -> dict[str, object]:
        return {
            "micro_batches": self.micro,
            "batch": self.batch,
            "stages_ms": [
                {"hbm": round(s.hbm_ms, 2), "compute": round(s.compute_ms, 2), "tp_comm": round(s.tp_ms, 2)}
                for s in self.stages
            ],
            "pp_handoff_ms": round(self.handoff_ms, 3),
            "overhead_ms": self.overhead_ms,
            "serial_ms": round(self.serial_ms, 2),
            "cycle_ms": round(self.cycle_ms, 2),
        }


@dataclass
class Perf:
    decode_tok_s: float  # per stream at the requested concurrency
    decode_tok_s_total: float
    single_stream_tok_s: float
    prefill_tok_s: float
    streams: int  # concurrency actually served (KV-limited for vLLM/SGLang)
    step: DecodeStep
    assumes: list[str] = field(default_factory=list)
    key: FleetKey | None = None  # what the fleet's measurements of this plan calibrate
    fleet_factor: float = 1.0  # the fleet calibration applied to the decode figures (1: published only)

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "streams": self.streams,
            "decode_step": self.step.to_json(),
            "single_stream_tok_s": round(self.single_stream_tok_s, 1),
            "assumes": self.assumes,
        }
        if self.key is not None:
            data["calibration"] = {**asdict(self.key), "fleet_factor": round(self.fleet_factor, 4)}
        return data


def _gpu_stage_bytes(model: ModelSpec, wb: WeightBytes, layout: Layout, stage: int, batch: int) -> float:
    """Weight bytes one GPU of `stage` reads per decode step."""
    first, count = layout.first_layer(stage), layout.layers[stage]
    touched = 1 - (1 - wb.active_expert_share) ** batch if model.is_moe else 1.0
    skipped = wb.experts * (1 - touched) * count / layout.tp
    weights = sharded_layer_bytes(model, wb, first, count, layout.tp) - skipped
    if stage == layout.pp - 1:
        weights += wb.lm_head / layout.tp
    return weights


def _active_flops_per_token(model: ModelSpec, layout: Layout, stage: int) -> float:
    share = layout.layers[stage] / model.num_layers
    return 2 * model.active_params * share / layout.tp


def stage_time(
    model: ModelSpec,
    wb: WeightBytes,
    layout: Layout,
    settings: Settings,
    stage: int,
    batch: int,
    context: int,
) -> StageTime:
    gpu = layout.stages[stage][0]
    kv = kv_bytes_per_token(model, layout, stage, settings.kv_bytes) * batch * context
    read = _gpu_stage_bytes(model, wb, layout, stage, batch) + kv
    hbm_ms = read / (gpu.mem_bw_gbs * 1e9 * bandwidth_efficiency(settings.backend, gpu)) * 1e3
    compute_ms = (
        _active_flops_per_token(model, layout, stage) * batch / (gpu.tflops * 1e12 * DECODE_MFU) * 1e3
    )
    return StageTime(hbm_ms, compute_ms, tp_comm_ms(model, layout, stage, batch))


def bandwidth_efficiency(backend: str, gpu: GPU) -> float:
    """Fraction of the GPU's peak memory bandwidth one decode step reaches on this backend."""
    if backend in (LLAMA_CPP, OLLAMA):
        return LLAMA_CPP_EFFICIENCY["hbm" if gpu.model.startswith(HBM_FAMILIES) else "gddr"]
    return HBM_EFFICIENCY[backend]


def tp_comm_ms(model: ModelSpec, layout: Layout, stage: int, tokens: int) -> float:
    """Megatron TP: 2 all-reduces per layer (after attention and after the MLP) of tokens x hidden."""
    link = layout.tp_links[stage]
    if layout.tp == 1 or link is None:
        return 0.0
    size = tokens * model.hidden_size * ACT_BYTES
    return 2 * layout.layers[stage] * link.allreduce_us(size, layout.tp) / 1e3


def handoff_ms(model: ModelSpec, layout: Layout, tokens: int) -> float:
    """One activation (vLLM also forwards the residual: x2) per stage boundary."""
    size = tokens * model.hidden_size * ACT_BYTES * 2
    return sum(_send_ms(link, size) for link in layout.boundaries)


def _send_ms(link: Link | None, size: float) -> float:
    return link.send_us(size) / 1e3 if link is not None else 0.0


def overhead_ms(layout: Layout, settings: Settings) -> float:
    eager = EAGER_MS_PER_LAYER * max(layout.layers) if settings.request.enforce_eager else 0.0
    per_layer = LLAMA_CPP_LAYER_MS * sum(layout.layers) if settings.backend in (LLAMA_CPP, OLLAMA) else 0.0
    return STEP_OVERHEAD_MS[settings.backend] + eager + per_layer


def decode_step(
    model: ModelSpec, wb: WeightBytes, layout: Layout, settings: Settings, streams: int
) -> DecodeStep:
    """vLLM/SGLang split the streams into up to PP micro-batches; llama.cpp/Ollama run one batch."""
    pipelined = settings.backend in (VLLM, SGLANG) and layout.pp > 1
    micro = min(streams, layout.pp) if pipelined else 1
    batch = math.ceil(streams / micro)
    stages = [
        stage_time(model, wb, layout, settings, s, batch, settings.decode_context) for s in range(layout.pp)
    ]
    return DecodeStep(micro, batch, stages, handoff_ms(model, layout, batch), overhead_ms(layout, settings))


def prefill_tok_s(
    model: ModelSpec, wb: WeightBytes, layout: Layout, settings: Settings, prompt: int, chunk: int
) -> float:
    """Compute-bound prompt processing in chunks; PP stages overlap across chunks."""
    chunk = max(1, min(chunk, prompt))
    chunks = math.ceil(prompt / chunk)
    worst = max(_prefill_stage_ms(model, wb, layout, s, chunk, prompt) for s in range(layout.pp))
    total_ms = (chunks + layout.pp - 1) * worst + handoff_ms(model, layout, chunk)
    return prompt / total_ms * 1e3


def _prefill_stage_ms(
    model: ModelSpec, wb: WeightBytes, layout: Layout, stage: int, chunk: int, prompt: int
) -> float:
    gpu: GPU = layout.stages[stage][0]
    heads = model.num_heads / layout.tp
    attention = 4 * kv_layer_count(model, layout, stage) * chunk * (prompt / 2) * heads * model.head_dim
    flops = _active_flops_per_token(model, layout, stage) * chunk + attention
    compute = flops / (gpu.tflops * 1e12 * PREFILL_MFU) * 1e3
    read = _gpu_stage_bytes(model, wb, layout, stage, chunk) / (gpu.mem_bw_gbs * 1e9) * 1e3
    return max(compute, read) + tp_comm_ms(model, layout, stage, chunk)


def kv_layer_count(model: ModelSpec, layout: Layout, stage: int) -> float:
    return layout.layers[stage] * model.kv_layers / model.num_layers


def predict(
    model: ModelSpec, wb: WeightBytes, layout: Layout, settings: Settings, kv_tokens: int | None, chunk: int
) -> Perf:
    streams = served_streams(layout, settings, kv_tokens)
    step = decode_step(model, wb, layout, settings, streams)
    single = decode_step(model, wb, layout, settings, 1).tok_s
    prompt = min(settings.max_model_len, 2048)
    prefill = prefill_tok_s(model, wb, layout, settings, prompt, chunk)
    key = fleet_key(layout, settings.backend)
    factor = factor_for(key, settings.request.decode_factors)
    total = step.tok_s * factor
    perf = Perf(total / streams, total, single * factor, prefill, streams, step, key=key, fleet_factor=factor)
    perf.assumes = _assumptions(model, layout, settings, streams, prompt)
    if factor != 1.0:
        perf.assumes.append(
            f"decode x{factor:.2f}: the fleet's measured deployments on {key.text()} (shrunk toward the "
            "published calibration)"
        )
    return perf


def served_streams(layout: Layout, settings: Settings, kv_tokens: int | None) -> int:
    """vLLM/SGLang queue requests the KV pool cannot hold; llama.cpp/Ollama reserve every slot upfront."""
    if settings.backend in (LLAMA_CPP, OLLAMA) or not kv_tokens:
        return settings.concurrency
    fits = max(1, kv_tokens // max(1, settings.decode_context))
    return max(1, min(settings.concurrency, fits))


def _assumptions(
    model: ModelSpec, layout: Layout, settings: Settings, streams: int, prompt: int
) -> list[str]:
    eff = bandwidth_efficiency(settings.backend, layout.gpus[0])
    notes = [
        f"decode at {settings.decode_context:,} tokens of context per stream, {streams} stream(s) batched",
        f"memory bandwidth used at {eff:.0%} of peak; {DECODE_MFU:.0%} of peak FLOPs for large batches",
        f"prefill of a {prompt:,}-token prompt at {PREFILL_MFU:.0%} of peak FLOPs",
    ]
    if model.is_moe:
        notes.append(
            f"MoE: reads the experts {streams} token(s) touch (top-{model.experts_per_tok} of "
            f"{model.num_experts}), all experts stay resident"
        )
    if layout.tp > 1:
        heads = kv_heads_per_rank(model, layout.tp)
        notes.append(f"TP={layout.tp}: 2 all-reduces per layer per step; {heads} KV head(s) per rank")
    if layout.pp > 1 and settings.backend in (VLLM, SGLANG):
        notes.append(
            f"PP={layout.pp}: up to {layout.pp} micro-batches in flight; one stream still waits for "
            "every stage in turn"
        )
    if settings.request.enforce_eager:
        notes.append("--enforce-eager: no CUDA graphs, per-layer launch overhead added")
    if settings.backend == VLLM:
        notes.append(vllm_release_note(settings.request))
    return notes

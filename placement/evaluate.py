"""Evaluate one layout: memory, feasibility, risks and predicted speed."""

from __future__ import annotations

from dataclasses import dataclass, field

from placement.cluster import GPU, Cluster
from placement.feasibility import (
    divisibility_problems,
    estimated_speed_risks,
    link_risks,
    network_issues,
    numa_risks,
    vision_tp_problem,
)
from placement.layout import Layout, make_layout
from placement.memory import Issue, MemoryReport, batch_defaults, vllm_family_memory
from placement.memory_gguf import UBATCH, layer_split_counts, layer_split_memory, tensor_split_memory
from placement.perf import Perf, predict, served_streams
from placement.request import LLAMA_CPP, SGLANG, VLLM, Request, Settings, backends_for, resolve
from placement.spec import ModelSpec
from placement.weights import WeightBytes, weight_bytes


@dataclass
class Candidate:
    layout: Layout
    settings: Settings
    memory: MemoryReport | None
    perf: Perf | None
    problems: list[Issue]
    risks: list[Issue]
    notes: list[str] = field(default_factory=list)
    equivalent_nodes: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def backend(self) -> str:
        return self.settings.backend

    @property
    def throughput(self) -> float:
        return self.perf.decode_tok_s_total if self.perf else 0.0


class Evaluator:
    """Evaluates layouts for one model and request; caches what does not depend on free memory."""

    def __init__(self, model: ModelSpec, cluster: Cluster, request: Request) -> None:
        self.model, self.cluster, self.request = model, cluster, request
        self.backends = backends_for(model, request)
        self.settings: dict[str, Settings] = {b: resolve(model, request, b) for b in self.backends}
        self.weights: dict[str, WeightBytes] = {
            b: weight_bytes(model, s.fmt) for b, s in self.settings.items()
        }
        self._perf: dict[tuple[object, ...], Perf] = {}
        self.layouts: dict[tuple[object, ...], Layout | None] = {}

    def layer_split(self, backend: str, gpus: list[GPU]) -> Layout:
        counts = layer_split_counts(self.model, self.weights[backend], gpus, self.settings[backend])
        return make_layout(self.cluster, backend, [(g,) for g in gpus], counts)

    def evaluate(self, layout: Layout, encoder_data_mode: bool = True) -> Candidate:
        settings = self.settings[layout.backend]
        problems = divisibility_problems(self.model, layout, settings)
        vision = (
            vision_tp_problem(self.model, layout, encoder_data_mode)
            if layout.backend in (VLLM, SGLANG)
            else None
        )
        problems += [vision] if vision else []
        net_problems, net_risks = network_issues(layout)
        problems += net_problems
        risks = link_risks(layout) + numa_risks(layout) + net_risks + estimated_speed_risks(layout)
        if problems:
            return Candidate(layout, settings, None, None, problems, risks)
        memory = self._memory(layout, settings, self.request.split_mode)
        perf = self._predict(layout, settings, memory) if not memory.problems else None
        return Candidate(
            layout,
            settings,
            memory,
            perf,
            memory.problems,
            memory.risks + risks,
            _split_notes(layout.backend, self.request.split_mode) + _rpc_notes(layout),
        )

    def _memory(self, layout: Layout, settings: Settings, split_mode: str) -> MemoryReport:
        wb = self.weights[layout.backend]
        if layout.backend in (VLLM, SGLANG):
            return vllm_family_memory(self.model, wb, layout, settings)
        if layout.backend == LLAMA_CPP and split_mode != "layer":
            return tensor_split_memory(self.model, wb, layout, settings, split_mode)
        return layer_split_memory(self.model, wb, layout, settings)

    def _predict(self, layout: Layout, settings: Settings, memory: MemoryReport) -> Perf:
        chunk = batch_defaults(layout.gpus[0], settings)[0] if layout.backend in (VLLM, SGLANG) else UBATCH
        streams = served_streams(layout, settings, memory.kv_tokens)
        key = (
            layout.backend,
            layout.layers,
            layout.tp_links,
            layout.boundaries,
            streams,
            chunk,
            tuple((g.model, g.mem_bw_gbs, g.tflops) for g in layout.gpus),
        )
        if key not in self._perf:
            self._perf[key] = predict(
                self.model, self.weights[layout.backend], layout, settings, memory.kv_tokens, chunk
            )
        return self._perf[key]


def _split_notes(backend: str, split_mode: str) -> list[str]:
    if backend != LLAMA_CPP or split_mode == "layer":
        return []
    if split_mode == "row":
        return [
            "--split-mode row is deprecated in llama.cpp: it splits only dense weights and runs slower; "
            "prefer layer"
        ]
    return [
        "--split-mode tensor is experimental in llama.cpp: it needs flash attention, an NCCL build "
        "(-DGGML_CUDA_NCCL=ON) and an unquantized KV cache, and excludes several MoE/hybrid models"
    ]


def _rpc_notes(layout: Layout) -> list[str]:
    if layout.backend != LLAMA_CPP or not layout.multi_node:
        return []
    return [
        "llama.cpp lists RPC devices and local GPUs in its own order: check `llama-server --list-devices "
        "--rpc ...` and reorder --tensor-split to match before launching"
    ]

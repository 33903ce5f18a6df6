"""Plans as JSON (the fields the issue lists) with a `why` an operator can check by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from placement.cluster import Cluster, NodeRejection
from placement.commands import launch
from placement.evaluate import Candidate
from placement.memory import cuda_total_gib
from placement.perf import bandwidth_efficiency
from placement.request import LLAMA_CPP, OLLAMA, Request
from placement.spec import ModelSpec

BACKEND_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp", "ollama": "Ollama"}


def _place(c: Candidate) -> dict[str, Any]:
    lay = c.layout
    if lay.multi_node:
        gpus = {node: [g.index for g in lay.gpus if g.node == node] for node in lay.node_names}
        return {"nodes": lay.node_names, "gpus": gpus}
    place: dict[str, Any] = {"node": lay.node_names[0], "gpus": [g.index for g in lay.gpus]}
    if c.equivalent_nodes:
        place["equivalent_nodes"] = c.equivalent_nodes
    return place


def shape_text(c: Candidate) -> str:
    lay = c.layout
    name = BACKEND_NAMES[c.backend]
    if c.backend in (LLAMA_CPP, OLLAMA):
        if lay.tp > 1:
            return f"{name} ({c.settings.request.split_mode} split over {lay.tp} GPUs)"
        return f"{name} ({'layer split' if lay.pp > 1 else 'one GPU'})"
    return f"{name} TP={lay.tp} x PP={lay.pp}"


def where_text(c: Candidate) -> str:
    lay = c.layout
    parts = []
    for node in lay.node_names:
        gpus = ",".join(str(g.index) for g in lay.gpus if g.node == node)
        parts.append(f"{node} GPU{'s' if ',' in gpus else ''} {gpus}")
    return " + ".join(parts)


def memory_text(c: Candidate, model: ModelSpec) -> str:
    mem = c.memory
    assert mem is not None
    weights = [g.parts["weights"] for g in mem.gpus]
    total = sum(weights)
    lo, hi = min(weights), max(weights)
    share = f"{hi:.1f}" if hi - lo < 0.05 else f"{lo:.1f}-{hi:.1f}"
    text = f"weights {total:.1f} GiB on GPU ({c.settings.fmt.name}) -> {share} GiB per GPU"
    if c.backend in (LLAMA_CPP, OLLAMA):
        layers = "/".join(str(n) for n in c.layout.layers)
        kv = sum(g.parts["kv_cache"] for g in mem.gpus)
        return (
            f"{text} with layers {layers}; KV for {c.settings.concurrency} slot(s) x "
            f"{c.settings.max_model_len:,} tokens = {mem.kv_tokens:,} tokens ({kv:.1f} GiB, "
            f"{c.settings.kv_dtype}); busiest GPU {max(g.used_gib for g in mem.gpus):.1f} GiB"
        )
    g = min(mem.gpus, key=lambda x: x.kv_tokens or 0)
    fraction = mem.knobs.get("gpu_memory_utilization", mem.knobs.get("mem_fraction_static"))
    fits = (mem.kv_tokens or 0) / c.settings.max_model_len
    return (
        f"{text}; {fraction:g} x {cuda_total_gib(g.gpu):.1f} GiB = {g.budget_gib:.1f} GiB budget minus weights, "
        f"activation {g.parts['activation']:.1f} and non-torch {g.parts['non_torch']:.2f} leaves "
        f"{g.parts['kv_cache']:.1f} GiB of KV on the tightest GPU = {mem.kv_tokens:,} tokens "
        f"({fits:.1f} requests of {c.settings.max_model_len:,} tokens, KV {_kv_name(c.settings.kv_dtype)})"
    )


def _kv_name(kv: str) -> str:
    return "16-bit (auto)" if kv == "auto" else kv


def links_text(c: Candidate) -> str:
    lay = c.layout
    tp = sorted({link.describe() for link in lay.tp_links if link is not None})
    pp = sorted({link.describe() for link in lay.boundaries if link is not None})
    if lay.tp > 1 and any(link is None for link in lay.tp_links):
        tp.append("an unknown network between nodes (no network_gbps)")
    parts = [f"TP all-reduces over {', '.join(tp)}"] if tp else ["no TP"]
    parts.append(f"pipeline hand-offs over {', '.join(pp)}" if pp else "no pipeline boundary")
    return "; ".join(parts)


def speed_text(c: Candidate) -> str:
    perf = c.perf
    assert perf is not None
    step, gpu = perf.step, c.layout.gpus[0]
    hbm = sum(s.hbm_ms for s in step.stages)
    tp = sum(s.tp_ms for s in step.stages)
    text = (
        f"decode: {step.batch} stream(s) per micro-batch read for {hbm:.1f} ms over {c.layout.pp} stage(s) at "
        f"{bandwidth_efficiency(c.backend, gpu):.0%} of {gpu.mem_bw_gbs:g} GB/s"
    )
    text += f" + {tp:.1f} ms TP all-reduce" if tp >= 0.05 else ""
    text += f" + {step.handoff_ms:.2f} ms hand-offs" if step.handoff_ms >= 0.01 else ""
    text += f" + {step.overhead_ms:.2f} ms overhead = {step.serial_ms:.1f} ms per token"
    if step.micro > 1:
        text += f"; {step.micro} micro-batches in flight, one every {step.cycle_ms / step.micro:.1f} ms"
    return (
        f"{text} -> {perf.decode_tok_s:.1f} tok/s per stream, {perf.decode_tok_s_total:.0f} tok/s for "
        f"{perf.streams} stream(s); prefill ~{perf.prefill_tok_s:.0f} tok/s"
    )


def why_text(c: Candidate, model: ModelSpec) -> str:
    head = f"{shape_text(c)} on {where_text(c)}"
    return ". ".join([head, memory_text(c, model), links_text(c), speed_text(c)]) + "."


def candidate_json(c: Candidate, model: ModelSpec, cluster: Cluster) -> dict[str, Any]:
    data: dict[str, Any] = {"backend": c.backend, "tp": c.layout.tp, "pp": c.layout.pp, **_place(c)}
    mem = c.memory
    if mem is not None:
        data["weights_gib_per_gpu"] = round(mem.weights_gib_max, 2)
        data["memory_gib_per_gpu"] = [round(g.used_gib, 2) for g in mem.gpus]
        data["breakdown"] = [g.to_json() for g in mem.gpus]
        data["kv_cache_tokens"] = mem.kv_tokens
    if c.perf is not None:
        data.update(
            decode_tok_s=round(c.perf.decode_tok_s, 1),
            decode_tok_s_total=round(c.perf.decode_tok_s_total, 1),
            prefill_tok_s=round(c.perf.prefill_tok_s, 0),
        )
    return data


def plan_json(c: Candidate, model: ModelSpec, cluster: Cluster) -> dict[str, Any]:
    data = candidate_json(c, model, cluster)
    run = launch(model, c, cluster)
    data.update(env=run.env, command=run.command)
    if run.node_commands:
        data["node_commands"] = run.node_commands
    data["risks"] = [r.to_json() for r in c.risks]
    data["why"] = why_text(c, model)
    if c.notes:
        data["notes"] = c.notes
    s = c.settings
    data["settings"] = {
        "dtype": s.fmt.name,
        "kv_cache_dtype": s.kv_dtype,
        "max_model_len": s.max_model_len,
        "concurrency": s.concurrency,
        "layers_per_stage": list(c.layout.layers),
        **(c.memory.knobs if c.memory else {}),
    }
    data["performance"] = c.perf.to_json() if c.perf else None
    return data


def rejected_json(c: Candidate, model: ModelSpec, cluster: Cluster) -> dict[str, Any]:
    data = candidate_json(c, model, cluster)
    data["problems"] = [p.to_json() for p in c.problems]
    if c.risks:
        data["risks"] = [r.to_json() for r in c.risks]
    return data


@dataclass
class PlanResult:
    model: ModelSpec
    cluster: Cluster
    request: Request
    plans: list[Candidate]
    rejected: list[Candidate]
    rejected_nodes: list[NodeRejection] = field(default_factory=list)  # whole nodes left out (bad input)

    @property
    def best(self) -> Candidate | None:
        return self.plans[0] if self.plans else None

    def model_json(self) -> dict[str, Any]:
        m = self.model
        data = {
            "name": m.name,
            "source": m.source,
            "architecture": m.architecture,
            "layers": m.num_layers,
            "hidden_size": m.hidden_size,
            "attention_heads": m.num_heads,
            "kv_heads": m.num_kv_heads,
            "head_dim": m.head_dim,
            "params_b": round(m.total_params / 1e9, 2),
            "active_params_b": round(m.active_params / 1e9, 2),
            "native_dtype": m.native_format,
            "kv_bytes_per_token_16bit": 2 * m.kv_elements_per_token(),
        }
        if m.vision:
            data["vision"] = {"heads": m.vision.num_heads, "params_b": round(m.vision.params / 1e9, 2)}
        if m.sliding_window:
            data["sliding_window"] = {"window": m.sliding_window, "sliding_layers": m.sliding_layers}
        return data

    def to_json(self, limit: int | None = None, rejected_limit: int | None = None) -> dict[str, Any]:
        """`rejected` lists the nodes left out first, then the rejected configurations; the limit covers both."""
        plans = self.plans[:limit] if limit is not None else self.plans
        nodes = [r.to_json() for r in self.rejected_nodes[:rejected_limit]]
        rejected = (
            self.rejected if rejected_limit is None else self.rejected[: max(0, rejected_limit - len(nodes))]
        )
        return {
            "model": self.model_json(),
            "plans": [plan_json(c, self.model, self.cluster) for c in plans],
            "rejected": nodes + [rejected_json(c, self.model, self.cluster) for c in rejected],
            "plans_total": len(self.plans),
            "rejected_total": len(self.rejected_nodes) + len(self.rejected),
        }

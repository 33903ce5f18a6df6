"""One plan as everything downstream of the planner reads it: the dashboard stores it as JSON, shows it, and
turns it into launch commands.

The stored JSON keeps the shape `PlanResult.to_json` writes (a single-node plan has `node` and a GPU list, a
multi-node one `nodes` and a GPU list per node); `Plan.from_json` reads both, and `to_json` writes the same
shape back, so rows stored before this class existed still load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

BUSY = "busy"  # the risk code of a plan that needs GPUs already in use


@dataclass(frozen=True)
class NodeGpus:
    """The GPUs a plan uses on one node (node is "" only in hand-made plans that name no node)."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Risk:
    code: str
    message: str


@dataclass(frozen=True)
class MemoryBar:
    """One GPU's memory as the plan page draws it: weights, KV cache, and the rest of what the plan uses."""

    gpu: int
    weights_gib: float
    kv_cache_gib: float
    total_gib: float
    capacity_gib: float

    @property
    def other_gib(self) -> float:
        return max(0.0, self.total_gib - self.weights_gib - self.kv_cache_gib)


@dataclass(frozen=True)
class PlanSettings:
    """The serving settings the plan assumes; `knobs` holds the backend's other tuning values, shown as they are."""

    dtype: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    concurrency: int | None = None
    layers_per_stage: tuple[int, ...] | None = None
    gpu_memory_utilization: float | None = None  # vLLM
    mem_fraction_static: float | None = None  # SGLang
    n_ctx: int | None = None  # llama.cpp: the whole context over all slots
    n_parallel: int | None = None  # llama.cpp: slots
    tensor_split: tuple[float, ...] | None = None  # llama.cpp: layers per GPU
    knobs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlanSettings:
        named = _named(cls) - {"knobs"}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in named}
        return cls(**values, knobs={k: v for k, v in data.items() if k not in named})

    def to_json(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "knobs"}
        return {**{k: _plain(v) for k, v in values.items() if v is not None}, **self.knobs}

    @property
    def memory_fraction(self) -> float | None:
        """The share of GPU memory the server may take (vLLM's and SGLang's names for it)."""
        return self.gpu_memory_utilization or self.mem_fraction_static


# Top-level keys read and written as they are (None: not in the JSON).
_PASSED = (
    "weights_gib_per_gpu",
    "memory_gib_per_gpu",
    "breakdown",
    "kv_cache_tokens",
    "decode_tok_s",
    "decode_tok_s_total",
    "prefill_tok_s",
    "env",
    "command",
    "node_commands",
    "why",
    "notes",
)

_JSON_KEYS = {
    "backend",
    "tp",
    "pp",
    "node",
    "nodes",
    "gpus",
    "equivalent_nodes",
    "risks",
    "settings",
    "performance",
    *_PASSED,
}


@dataclass(frozen=True)
class Plan:
    backend: str
    tp: int
    pp: int
    placement: tuple[NodeGpus, ...]  # the head first
    multi_node: bool
    equivalent_nodes: tuple[str, ...] | None = (
        None  # single-node plans: nodes the same plan would fit as well
    )
    weights_gib_per_gpu: float | None = None
    memory_gib_per_gpu: tuple[float, ...] | None = None
    breakdown: tuple[Mapping[str, Any], ...] | None = None  # per GPU: the planner's memory accounting
    kv_cache_tokens: int | None = None
    decode_tok_s: float | None = None
    decode_tok_s_total: float | None = None
    prefill_tok_s: float | None = None
    env: Mapping[str, Any] | None = None
    command: str | None = None  # the head's command line, for an operator to run by hand
    node_commands: Mapping[str, str] | None = None  # multi-node: the other nodes' command lines
    risks: tuple[Risk, ...] | None = None
    why: str | None = None
    notes: tuple[str, ...] | None = None
    settings: PlanSettings | None = None
    performance: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this class does not know, kept as they came

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        if not isinstance(data, Mapping):
            raise ValueError(f"a plan must be a JSON object, not {type(data).__name__}")
        multi = "nodes" in data
        passed = {
            k: tuple(data[k]) if isinstance(data[k], list) else data[k]
            for k in _PASSED
            if data.get(k) is not None
        }
        settings = data.get("settings")
        risks = data.get("risks")
        return cls(
            backend=data.get("backend", ""),
            tp=data.get("tp") or 1,
            pp=data.get("pp") or 1,
            placement=_placement(data, multi),
            multi_node=multi,
            equivalent_nodes=tuple(data["equivalent_nodes"]) if "equivalent_nodes" in data else None,
            risks=tuple(Risk(r["code"], r["message"]) for r in risks) if risks is not None else None,
            settings=PlanSettings.from_json(settings) if settings is not None else None,
            performance=data.get("performance"),
            **passed,
            extra={k: v for k, v in data.items() if k not in _JSON_KEYS},
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "backend": self.backend,
            "tp": self.tp,
            "pp": self.pp,
            **self._placement_json(),
        }
        data.update({k: _plain(getattr(self, k)) for k in _PASSED if getattr(self, k) is not None})
        if self.risks is not None:
            data["risks"] = [{"code": r.code, "message": r.message} for r in self.risks]
        if self.settings is not None:
            data["settings"] = self.settings.to_json()
        data["performance"] = self.performance
        return {**data, **self.extra}

    def _placement_json(self) -> dict[str, Any]:
        if self.multi_node:
            return {"nodes": self.nodes, "gpus": {p.node: list(p.gpus) for p in self.placement}}
        head = self.placement[0] if self.placement else NodeGpus("", ())
        data: dict[str, Any] = {"node": head.node} if head.node else {}
        data["gpus"] = list(head.gpus)
        if self.equivalent_nodes is not None:
            data["equivalent_nodes"] = list(self.equivalent_nodes)
        return data

    def placements(self) -> list[tuple[str, list[int]]]:
        """(node, GPU indices) for each node of the plan, the head first; single- and multi-node alike."""
        return [(p.node, list(p.gpus)) for p in self.placement if p.node]

    @property
    def nodes(self) -> list[str]:
        return [node for node, _ in self.placements()]

    @property
    def head_gpus(self) -> list[int]:
        return list(self.placement[0].gpus) if self.placement else []

    def gpus_on(self, node: str) -> list[int]:
        return next((list(p.gpus) for p in self.placement if p.node == node), [])

    def where_text(self) -> str:
        return " + ".join(f"{name} GPUs {','.join(map(str, gpus))}" for name, gpus in self.placements())

    @property
    def needs_override(self) -> bool:
        """The plan needs GPUs that are in use: deploying it takes the operator's explicit say-so."""
        return any(r.code == BUSY for r in self.risks or ())

    def memory_bars(self) -> list[MemoryBar]:
        return [
            MemoryBar(
                gpu=b["gpu"],
                weights_gib=b["weights_gib"],
                kv_cache_gib=b.get("kv_cache_gib", 0.0),
                total_gib=b["total_gib"],
                capacity_gib=b["capacity_gib"],
            )
            for b in self.breakdown or ()
        ]


def _placement(data: Mapping[str, Any], multi: bool) -> tuple[NodeGpus, ...]:
    gpus = data.get("gpus", [])
    if multi:
        return tuple(NodeGpus(node, tuple(gpus[node])) for node in data["nodes"])
    return (NodeGpus(data.get("node") or "", tuple(gpus)),)


def _named(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def _plain(value: Any) -> Any:
    """Tuples back to the JSON lists they were read from."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value

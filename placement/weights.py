"""Bytes of weights per decoder layer, embeddings, output layer and vision tower, for one weight format."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from placement.dtypes import WeightFormat
from placement.errors import PlacementError
from placement.spec import ModelSpec

SIXTEEN_BIT = 2.0


@dataclass(frozen=True)
class WeightBytes:
    fmt: WeightFormat
    layers: tuple[float, ...]  # every decoder layer, all experts
    kv_proj: float  # k_proj + v_proj of one layer (replicated per rank once TP exceeds the KV heads)
    experts: float  # the routed experts of one layer (0 for dense)
    active_expert_share: float  # top-k / experts
    embed: float
    lm_head: float  # output layer; for tied embeddings the copy that sits on the last stage/GPU
    vision: float  # vision tower (HF) or mmproj projector (GGUF)

    @property
    def total(self) -> float:
        return sum(self.layers) + self.embed + self.lm_head + self.vision

    @cached_property
    def _prefix(self) -> list[float]:
        sums = [0.0]
        for size in self.layers:
            sums.append(sums[-1] + size)
        return sums

    def layer_span(self, first: int, last: int) -> float:
        return self._prefix[last] - self._prefix[first]


def weight_bytes(spec: ModelSpec, fmt: WeightFormat) -> WeightBytes:
    if spec.gguf is not None:
        return _gguf_bytes(spec, fmt)
    linear = fmt.bytes_per_weight
    dense_bytes = SIXTEEN_BIT if fmt.experts_only else linear
    outer = linear if fmt.quantizes_embeddings and not fmt.experts_only else SIXTEEN_BIT
    scale = spec.layer_scale
    dense = (spec.attn_qo_params + spec.attn_kv_params + spec.dense_mlp_params + 2 * spec.hidden_size) * scale
    experts = spec.expert_params * scale * linear
    per_layer = dense * dense_bytes + experts
    lm_head = spec.lm_head_params or spec.embed_params  # tied: the last stage still holds a copy
    share = spec.experts_per_tok / spec.num_experts if spec.is_moe else 1.0
    return WeightBytes(
        fmt,
        (per_layer,) * spec.num_layers,
        spec.attn_kv_params * scale * dense_bytes,
        experts,
        share,
        spec.embed_params * outer,
        lm_head * outer,
        spec.vision_params * SIXTEEN_BIT,
    )


def _gguf_bytes(spec: ModelSpec, fmt: WeightFormat) -> WeightBytes:
    tensors = spec.gguf
    assert tensors is not None
    if fmt.name != tensors.file_type:
        raise PlacementError(
            f"{spec.source} holds {tensors.file_type} weights; dtype '{fmt.name}' would need "
            "another GGUF file"
        )
    average = sum(tensors.layer_bytes) / spec.num_layers
    geometric = spec.geometric_layer_params
    share = spec.experts_per_tok / spec.num_experts if spec.is_moe else 1.0
    return WeightBytes(
        fmt,
        tensors.layer_bytes,
        average * spec.attn_kv_params / geometric,
        average * spec.expert_params / geometric,
        share,
        tensors.embed_bytes,
        tensors.output_bytes,
        tensors.projector_bytes,
    )

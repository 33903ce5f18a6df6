"""Weight formats and KV-cache dtypes: bits per weight and which backends load them.

Bits include the scales a format stores: int4 AWQ/GPTQ with group size 128 keeps one 16-bit scale and
one zero point per 128 weights (4 + 32/128 = 4.25 bits); MXFP4 keeps an 8-bit scale per 32 (4.25).
GGUF block types are exact (llama.cpp `ggml-common.h` block sizes); the K-quant *mixes* (Q4_K_M ...)
are the averages llama.cpp's `tools/quantize/README.md` lists for Llama-2-7B. A GGUF file gives exact
tensor sizes, so these averages only matter when planning a model that is not a GGUF file yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from placement.errors import PlacementError

HF = "hf"  # safetensors checkpoints: vLLM, SGLang
GGUF = "gguf"  # llama.cpp, Ollama


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits: float
    family: str
    # HF quantizations (AWQ, GPTQ, FP8, INT8) leave embeddings, lm_head and vision towers in 16 bit.
    quantizes_embeddings: bool
    experts_only: bool = False  # MXFP4 in gpt-oss: only the MoE experts are 4-bit

    @property
    def bytes_per_weight(self) -> float:
        return self.bits / 8


_HF_FORMATS = [
    WeightFormat("bf16", 16, HF, True),
    WeightFormat("fp16", 16, HF, True),
    WeightFormat("fp32", 32, HF, True),
    WeightFormat("fp8", 8, HF, False),
    WeightFormat("int8", 8, HF, False),
    WeightFormat("int4", 4.25, HF, False),
    WeightFormat("awq", 4.25, HF, False),
    WeightFormat("gptq", 4.25, HF, False),
    WeightFormat("mxfp4", 4.25, HF, False, experts_only=True),
]
_GGUF_BITS = {
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "Q8_0": 8.5,
    "Q6_K": 6.5625,
    "Q5_K_M": 5.68,
    "Q5_K_S": 5.52,
    "Q5_0": 5.5,
    "Q5_1": 6.0,
    "Q4_K_M": 4.84,
    "Q4_K_S": 4.58,
    "Q4_0": 4.5,
    "Q4_1": 5.0,
    "IQ4_XS": 4.25,
    "IQ4_NL": 4.5,
    "Q3_K_L": 4.27,
    "Q3_K_M": 3.91,
    "Q3_K_S": 3.5,
    "Q2_K": 3.35,
    "MXFP4": 4.25,
}
FORMATS: dict[str, WeightFormat] = {f.name: f for f in _HF_FORMATS}
FORMATS.update({name: WeightFormat(name, bits, GGUF, True) for name, bits in _GGUF_BITS.items()})

_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "w8a8": "int8",
    "w8a16": "int8",
    "w4a16": "int4",
    "compressed-tensors": "int4",
    "f16": "F16",
}
# The GGUF type llama.cpp/Ollama would run for an HF dtype, and back.
HF_TO_GGUF = {
    "bf16": "BF16",
    "fp16": "F16",
    "fp32": "F32",
    "fp8": "Q8_0",
    "int8": "Q8_0",
    "int4": "Q4_K_M",
    "awq": "Q4_K_M",
    "gptq": "Q4_K_M",
    "mxfp4": "MXFP4",
}
GGUF_TO_HF = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "Q8_0": "int8", "MXFP4": "mxfp4"}


def weight_format(name: str) -> WeightFormat:
    """The format for a user-facing name (`bf16`, `awq`, `Q4_K_M`, `bfloat16`, ...)."""
    key = _ALIASES.get(name.lower(), name)
    found = FORMATS.get(key) or FORMATS.get(key.lower()) or FORMATS.get(key.upper())
    if found is None:
        known = ", ".join(sorted(FORMATS))
        raise PlacementError(f"unknown weight dtype/quantization '{name}' (known: {known})")
    return found


def format_for_family(fmt: WeightFormat, family: str) -> WeightFormat | None:
    """The same weights in the other checkpoint family, or None when that family cannot load them."""
    if fmt.family == family:
        return fmt
    mapped = HF_TO_GGUF.get(fmt.name) if family == GGUF else GGUF_TO_HF.get(fmt.name)
    return FORMATS[mapped] if mapped else None


# KV cache element sizes in bytes. vLLM/SGLang: auto (= activation dtype, 16 bit) or fp8;
# llama.cpp `-ctk/-ctv`: f16, bf16, q8_0 (34 bytes / 32), q4_0 (18 / 32), q5_0/q5_1.
KV_BYTES = {
    "auto": 2.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "f16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "f32": 4.0,
}
# What each family calls the dtype it would use for a requested KV dtype.
KV_FOR_GGUF = {
    "auto": "f16",
    "bf16": "bf16",
    "fp16": "f16",
    "fp8": "q8_0",
    "fp8_e4m3": "q8_0",
    "fp8_e5m2": "q8_0",
}
KV_FOR_HF = {
    "f16": "auto",
    "bf16": "auto",
    "q8_0": "fp8",
    "q4_0": "fp8",
    "q4_1": "fp8",
    "q5_0": "fp8",
    "q5_1": "fp8",
    "f32": "auto",
}


def kv_dtype(name: str, family: str) -> str:
    """The KV dtype as the backend family spells it; raises for unknown names."""
    key = name.lower()
    if key not in KV_BYTES:
        raise PlacementError(f"unknown KV cache dtype '{name}' (known: {', '.join(sorted(KV_BYTES))})")
    if family == GGUF:
        return KV_FOR_GGUF.get(key, key)
    return KV_FOR_HF.get(key, key)

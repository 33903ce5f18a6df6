"""Model specs: the geometry the planner needs, from a catalog entry, an HF config.json or a GGUF file.

Parameter counts come from the geometry (q/k/v/o projections, gated MLP or experts, embeddings,
lm_head unless tied, vision tower). For catalog entries the per-layer count is scaled so the total
equals the catalog's published figure (the scale is within 1 % of 1 for every entry; a test checks).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from placement.errors import PlacementError


@dataclass(frozen=True)
class VisionSpec:
    num_heads: int
    hidden_size: int
    intermediate_size: int
    depth: int
    out_hidden_size: int
    spatial_merge_size: int
    params: float


@dataclass(frozen=True)
class GgufTensors:
    """Exact tensor bytes from a GGUF file (read from the header; weights never loaded)."""

    file_type: str
    layer_bytes: tuple[float, ...]
    embed_bytes: float
    output_bytes: float  # output.weight, or the tied token_embd copy llama.cpp puts on the output GPU
    projector_bytes: float  # sibling mmproj*.gguf, 0 when none
    paths: tuple[str, ...]


@dataclass
class ModelSpec:
    """Treat as immutable once loaded: the parameter counts below are computed once and cached."""

    name: str
    ref: str  # what the operator typed; commands use it
    source: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    native_format: str
    num_experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    full_attention_layers: int | None = None  # layers whose KV grows with context (None: all)
    sliding_layers: int = 0
    sliding_window: int | None = None
    vision: VisionSpec | None = None
    # DeepSeek V2/V3 multi-head latent attention: K and V come from one cached latent of kv_lora_rank values
    # plus a shared rope key of qk_rope_head_dim per token and layer (0: ordinary attention).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    dense_layers: int = 0  # MoE models whose first layers keep a dense MLP (first_k_dense_replace)
    text_params: float | None = None  # published total (catalog) the geometry is scaled to
    hf_repo: str | None = None
    gguf: GgufTensors | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def serve_ref(self) -> str:
        """What vLLM/SGLang should load: the operator's path or HF id, else the catalog's HF repo."""
        if "/" in self.ref or not self.hf_repo:
            return self.ref
        return self.hf_repo

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mla_latent_width(self) -> int:
        """Values cached per token and layer under MLA (the latent and the rope key, all heads together)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def moe_fraction(self) -> float:
        """Share of the layers that hold experts (the rest keep a dense MLP)."""
        return (self.num_layers - self.dense_layers) / self.num_layers if self.is_moe else 0.0

    @property
    def kv_layers(self) -> int:
        return self.num_layers if self.full_attention_layers is None else self.full_attention_layers

    @property
    def expert_intermediate(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def mlp_intermediate_active(self) -> int:
        """Intermediate width one token passes through (top-k experts for MoE)."""
        if not self.is_moe:
            return self.intermediate_size
        return self.experts_per_tok * self.expert_intermediate + self.shared_expert_intermediate_size

    # ------------------------------------------------------------ parameter counts (geometry)

    @property
    def attn_qo_params(self) -> float:
        if self.is_mla:
            return self._mla_q_params + self.num_heads * self.v_head_dim * self.hidden_size
        return 2.0 * self.hidden_size * self.num_heads * self.head_dim

    @property
    def _mla_q_params(self) -> float:
        per_head = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        if self.q_lora_rank:
            return self.q_lora_rank * (self.hidden_size + per_head)
        return float(self.hidden_size * per_head)

    @property
    def attn_kv_params(self) -> float:
        if self.is_mla:
            up = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return float(self.hidden_size * self.mla_latent_width + up)
        return 2.0 * self.hidden_size * self.num_kv_heads * self.head_dim

    @property
    def expert_params(self) -> float:
        """The experts of one layer, averaged over all layers (0 for dense)."""
        return self.num_experts * 3.0 * self.hidden_size * self.expert_intermediate * self.moe_fraction

    @property
    def dense_mlp_params(self) -> float:
        """The always-active MLP part of one layer, averaged over all layers: dense MLP, or shared experts +
        router for MoE layers (and the dense MLP of the first `dense_layers`)."""
        dense = 3.0 * self.hidden_size * self.intermediate_size
        if not self.is_moe:
            return dense
        shared = 3.0 * self.hidden_size * self.shared_expert_intermediate_size
        moe = shared + self.hidden_size * self.num_experts
        return self.moe_fraction * moe + (1 - self.moe_fraction) * dense

    @cached_property
    def geometric_layer_params(self) -> float:
        return (
            self.attn_qo_params
            + self.attn_kv_params
            + self.expert_params
            + self.dense_mlp_params
            + 2.0 * self.hidden_size
        )

    @property
    def embed_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def lm_head_params(self) -> float:
        return 0.0 if self.tie_word_embeddings else self.embed_params

    @cached_property
    def layer_scale(self) -> float:
        """Factor that makes the geometry add up to the published text total (1.0 without one)."""
        if not self.text_params:
            return 1.0
        return (self.text_params - self.embed_params - self.lm_head_params) / (
            self.num_layers * self.geometric_layer_params
        )

    @cached_property
    def layer_params(self) -> float:
        return self.geometric_layer_params * self.layer_scale

    @cached_property
    def total_text_params(self) -> float:
        return self.num_layers * self.layer_params + self.embed_params + self.lm_head_params

    @property
    def vision_params(self) -> float:
        return self.vision.params if self.vision else 0.0

    @cached_property
    def total_params(self) -> float:
        return self.total_text_params + self.vision_params

    @cached_property
    def active_params(self) -> float:
        """Parameters one token touches: all dense parts, top-k of the experts, embeddings once."""
        inactive = self.expert_params * (1 - self.experts_per_tok / self.num_experts) if self.is_moe else 0.0
        return self.total_text_params - self.num_layers * inactive * self.layer_scale

    def kv_elements_per_token(self) -> int:
        """K+V elements per token over the layers that grow with context (all ranks together)."""
        if self.is_mla:
            return self.kv_layers * self.mla_latent_width
        return 2 * self.kv_layers * self.num_kv_heads * self.head_dim


# ---------------------------------------------------------------- HF config.json


def _int(config: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if value is None:
            raise PlacementError(f"{where}: missing '{key}'")
        raise PlacementError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    for key in ("text_config", "llm_config", "language_config"):
        nested = config.get(key)
        if isinstance(nested, dict) and "hidden_size" in nested:
            return _with_chatglm_names({**{k: v for k, v in config.items() if k != key}, **nested})
    return _with_chatglm_names(config)


# ChatGLM's own config class (glm-4-9b-chat, chatglm3-6b: model_type "chatglm") names the geometry its way;
# vLLM's ChatGLM model reads these keys. GLM-4-0414 (model_type "glm4") and the "-hf" ports use the standard names.
CHATGLM_NAMES = {
    "num_hidden_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "head_dim": "kv_channels",
    "vocab_size": "padded_vocab_size",
    "max_position_embeddings": "seq_length",
}


def _with_chatglm_names(text: dict[str, Any]) -> dict[str, Any]:
    if text.get("model_type") != "chatglm":
        return text
    named = {standard: text[own] for standard, own in CHATGLM_NAMES.items() if own in text}
    if text.get("multi_query_attention") and "multi_query_group_num" in text:
        named["num_key_value_heads"] = text["multi_query_group_num"]
    return {**text, **named}


# Architectures whose HF config class interleaves sliding and full attention when the config has no
# layer_types: every n-th layer is global (transformers' Gemma2Config alternates local/global, n=2;
# Gemma3TextConfig and Cohere2Config read `sliding_window_pattern`, defaults 6 and 4).
INTERLEAVED_DEFAULT_PATTERN = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "cohere2": 4}
# HF config classes whose `tie_word_embeddings` defaults to True (the rest default to False): a config.json
# written by save_pretrained leaves out a value equal to the class default, as gemma-2-9b-it does.
TIED_BY_DEFAULT = frozenset(
    {"gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "cohere2", "starcoder2", "gpt2"}
)


def _tied_embeddings(config: dict[str, Any], text: dict[str, Any]) -> bool:
    for source in (config, text):
        if isinstance(source.get("tie_word_embeddings"), bool):
            return source["tie_word_embeddings"]
    return str(text.get("model_type") or config.get("model_type")) in TIED_BY_DEFAULT


def _interleaved(text: dict[str, Any], layers: int) -> tuple[int, int] | None:
    """(full, sliding) layer counts for an architecture that interleaves them by default, else None."""
    default = INTERLEAVED_DEFAULT_PATTERN.get(str(text.get("model_type")))
    if default is None:
        return None
    pattern = text.get("sliding_window_pattern", default)
    pattern = pattern if isinstance(pattern, int) and pattern > 0 else default
    full = layers // pattern
    return full, layers - full


def _layer_kinds(text: dict[str, Any], layers: int, max_pos: int) -> tuple[int | None, int, int | None]:
    """(full-attention layers, sliding layers, window) from layer_types / sliding_window."""
    window = text.get("sliding_window")
    window = window if isinstance(window, int) and window > 0 else None
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and kinds:
        full = sum(1 for kind in kinds if kind == "full_attention")
        sliding = sum(1 for kind in kinds if kind == "sliding_attention")
        return full, sliding, window
    interleaved = _interleaved(text, layers) if window and window < max_pos else None
    if interleaved:
        return interleaved[0], interleaved[1], window
    uses_window = text.get("use_sliding_window", True) and "max_window_layers" not in text
    if window and uses_window and window < max_pos:
        return 0, layers, window
    return None, 0, None


def vision_params(hidden: int, intermediate: int, depth: int, merge: int, out: int, mergers: int) -> float:
    """ViT blocks (qkv+proj, 2-matrix MLP) plus patch mergers (MLP over merge x merge patches)."""
    merged = hidden * merge * merge
    return depth * (4.0 * hidden * hidden + 2.0 * hidden * intermediate) + mergers * (
        merged * merged + merged * out
    )


def _vision_from_config(config: dict[str, Any], where: str, text_hidden: int) -> VisionSpec | None:
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    hidden = _int(vision, "hidden_size", f"{where} vision_config", vision.get("embed_dim"))
    heads = _int(vision, "num_heads", f"{where} vision_config", vision.get("num_attention_heads"))
    depth = _int(vision, "depth", f"{where} vision_config", vision.get("num_hidden_layers"))
    intermediate = _int(vision, "intermediate_size", f"{where} vision_config", 4 * hidden)
    merge = int(vision.get("spatial_merge_size", 2))
    out = int(vision.get("out_hidden_size", text_hidden))
    mergers = 1 + len(vision.get("deepstack_visual_indexes") or [])
    params = vision_params(hidden, intermediate, depth, merge, out, mergers)
    return VisionSpec(heads, hidden, intermediate, depth, out, merge, params)


def native_format_of(config: dict[str, Any]) -> str:
    """bf16/fp16/fp32 from torch_dtype, or the quantization the checkpoint ships in."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        return _quant_format(quant)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, "bf16")


def _quant_format(quant: dict[str, Any]) -> str:
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if method in ("awq", "gptq"):
        return method if bits in (None, 4) else "int8"
    if method in ("fp8", "mxfp4"):
        return method
    if method == "bitsandbytes":
        return "int4" if quant.get("load_in_4bit") else "int8"
    text = json.dumps(quant)
    if '"num_bits": 4' in text:
        return "int4"
    return "fp8" if '"type": "float"' in text else "int8"


def spec_from_hf_config(config: dict[str, Any], name: str, ref: str, source: str) -> ModelSpec:
    where = source
    text = _text_config(config)
    hidden = _int(text, "hidden_size", where)
    layers = _int(text, "num_hidden_layers", where)
    heads = _int(text, "num_attention_heads", where)
    kv_heads = _int(text, "num_key_value_heads", where, heads)
    mla = _mla_fields(text)
    mla_head = mla.get("qk_nope_head_dim", 0) + mla.get("qk_rope_head_dim", 0)
    head_dim = _int(text, "head_dim", where, mla_head or hidden // heads)
    max_pos = _int(text, "max_position_embeddings", where, 4096)
    full, sliding, window = _layer_kinds(text, layers, max_pos)
    arch = (config.get("architectures") or [text.get("model_type", "unknown")])[0]
    return ModelSpec(
        name=name,
        ref=ref,
        source=source,
        architecture=str(arch),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(text, "intermediate_size", where),
        vocab_size=_int(text, "vocab_size", where),
        max_position_embeddings=max_pos,
        tie_word_embeddings=_tied_embeddings(config, text),
        native_format=native_format_of(config),
        **_moe_fields(text),
        full_attention_layers=full,
        sliding_layers=sliding,
        sliding_window=window,
        vision=_vision_from_config(config, where, hidden),
        **mla,
    )


def _moe_fields(text: dict[str, Any]) -> dict[str, int]:
    """Experts as Mixtral/Qwen (num_local_experts / num_experts) or DeepSeek (n_routed_experts, n_shared_experts
    of moe_intermediate_size each, first_k_dense_replace dense layers) name them."""
    experts = int(
        text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts") or 0
    )
    moe = int(text.get("moe_intermediate_size") or 0)
    shared = (
        int(text.get("shared_expert_intermediate_size") or 0) or int(text.get("n_shared_experts") or 0) * moe
    )
    return {
        "num_experts": experts,
        "experts_per_tok": int(text.get("num_experts_per_tok") or 0) if experts else 0,
        "moe_intermediate_size": moe,
        "shared_expert_intermediate_size": shared,
        "dense_layers": int(text.get("first_k_dense_replace") or 0) if experts else 0,
    }


MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _mla_fields(text: dict[str, Any]) -> dict[str, int]:
    rank = text.get("kv_lora_rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        return {}
    return {key: int(text.get(key) or 0) for key in MLA_KEYS}


MAX_CONFIG_BYTES = 2_000_000  # a config.json is a few kB; anything this big is some other file


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise PlacementError(f"{path}: larger than {MAX_CONFIG_BYTES // 1_000_000} MB, not a config.json")
        data = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise PlacementError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise PlacementError(f"{path}: not UTF-8 text, so not a config.json") from None
    except OSError as exc:
        raise PlacementError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise PlacementError(f"{path}: expected a JSON object")
    return data


def load_hf_config(path: Path, ref: str) -> ModelSpec:
    name = path.parent.name if path.name == "config.json" else path.stem
    return spec_from_hf_config(_read_json(path), name, ref, str(path))


# ---------------------------------------------------------------- catalog


@cache
def catalog() -> dict[str, dict[str, Any]]:
    """The built-in catalog (a copy of tests/data/fixtures/placement/model_configs.json)."""
    raw = resources.files("placement.data").joinpath("model_configs.json").read_text(encoding="utf-8")
    return json.loads(raw)


@cache
def hf_catalog() -> dict[str, dict[str, Any]]:
    """Public config.json files bundled verbatim (placement/data/hf_configs.json): {key: {hf_repo, source,
    config, overrides?}}; each is a copy of a fixture in tests/data/fixtures/configs, with its source."""
    raw = resources.files("placement.data").joinpath("hf_configs.json").read_text(encoding="utf-8")
    return json.loads(raw)


def catalog_names() -> list[str]:
    """Every model the planner knows by name, both catalogs."""
    return sorted({*catalog(), *hf_catalog()})


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


# Quantization suffixes in Ollama tags and file names (qwen3-vl-32b-instruct-bf16, llama3:70b-q4_K_M).
_QUANT_SUFFIX = re.compile(
    r"[-_:.](bf16|fp16|f16|fp32|f32|fp8|int8|int4|awq|gptq|mxfp4|i?q\d[\w]*)$", re.IGNORECASE
)


def split_quant_suffix(name: str) -> tuple[str, str | None]:
    """('qwen3-vl-32b-instruct', 'bf16') from 'qwen3-vl-32b-instruct-bf16'."""
    match = _QUANT_SUFFIX.search(name)
    if not match:
        return name, None
    return name[: match.start()], match.group(1)


def find_catalog_key(ref: str) -> str | None:
    """Catalog key for an HF id, a path whose last part is a catalog name, or an Ollama-style tag."""
    entries = {**hf_catalog(), **catalog()}
    last = re.sub(r"\.gguf$", "", ref.rstrip("/").split("/")[-1].removesuffix(":latest"), flags=re.IGNORECASE)
    by_norm = {_norm(key): key for key in entries}
    by_norm.update({_norm(entry.get("hf_repo", "")): key for key, entry in entries.items()})
    stem, _ = split_quant_suffix(last)
    for candidate in (ref, last, stem):
        key = by_norm.get(_norm(candidate))
        if key:
            return key
    prefixed = sorted({key for norm, key in by_norm.items() if _norm(stem) and norm.startswith(_norm(stem))})
    return prefixed[0] if len(prefixed) == 1 else None


def _catalog_vision(entry: dict[str, Any], text_hidden: int) -> VisionSpec | None:
    tower = entry.get("vision_tower")
    if not tower:
        return None
    return VisionSpec(
        int(tower["num_heads"]),
        int(tower["hidden_size"]),
        int(tower["intermediate_size"]),
        int(tower["depth"]),
        int(tower.get("out_hidden_size", text_hidden)),
        int(tower.get("spatial_merge_size", 2)),
        float(tower["params_b"]) * 1e9,
    )


def hf_catalog_spec(key: str, ref: str) -> ModelSpec:
    entry = hf_catalog()[key]
    config = {**entry["config"], **entry.get("overrides", {})}
    spec = spec_from_hf_config(
        config, key, ref, f"built-in config.json of {entry['hf_repo']} ({entry['source']})"
    )
    spec.hf_repo = entry["hf_repo"]
    return spec


def catalog_spec(key: str, ref: str) -> ModelSpec:
    if key not in catalog():
        return hf_catalog_spec(key, ref)
    entry = catalog()[key]
    spec = spec_from_hf_config(entry, key, ref, f"built-in catalog entry '{key}'")
    spec.vision = _catalog_vision(entry, spec.hidden_size)
    spec.architecture = str(entry.get("architecture", spec.architecture))
    spec.hf_repo = entry.get("hf_repo")
    text_b = entry.get("params_b_text") or entry["params_b_total"] - entry.get("params_b_vision", 0.0)
    spec.text_params = float(text_b) * 1e9
    if "kv_layers" in entry:
        spec.full_attention_layers = int(entry["kv_layers"])
        spec.sliding_layers = spec.num_layers - spec.full_attention_layers
    if "MXFP4" in entry.get("note", ""):
        spec.native_format = "mxfp4"
    return spec


# ---------------------------------------------------------------- entry point


def load_model(ref: str) -> ModelSpec:
    """A model from a config.json (or its folder), a .gguf file (or a folder of them) or the catalog."""
    if not ref or not ref.strip():
        raise PlacementError("no model given")
    path = Path(ref)
    if path.is_dir() or path.is_file():
        return _load_path(path, ref)
    return _from_catalog(ref, "no such file")


def load_model_within(ref: str, model_dirs: list[Path]) -> ModelSpec:
    """load_model for a reference from someone who may not read this machine's files: a file or folder is read
    only if its real path (symlinks followed) lies under one of `model_dirs`; any other reference is looked up
    in the catalog. A path outside the directories is never opened or tested, so the error for it is the same
    whether it exists or not."""
    if not ref or not ref.strip():
        raise PlacementError("no model given")
    path = confined_path(ref, model_dirs)
    if path is not None:
        return _load_path(path, ref)
    where = ", ".join(str(d) for d in model_dirs) or "none configured"
    return _from_catalog(ref, f"no config.json or GGUF of that name under the model directories ({where})")


def confined_path(ref: str, model_dirs: list[Path]) -> Path | None:
    """The real path `ref` names under one of `model_dirs` (relative refs are taken from each), if it exists."""
    try:
        roots = [Path(d).resolve() for d in model_dirs]
        candidates = [Path(ref)] if Path(ref).is_absolute() else [root / ref for root in roots]
        for candidate in candidates:
            real = candidate.resolve()
            if any(real.is_relative_to(root) for root in roots) and (real.is_file() or real.is_dir()):
                return real
    except (OSError, RuntimeError, ValueError):  # symlink loops, NUL bytes, names too long
        return None
    return None


def _load_path(path: Path, ref: str) -> ModelSpec:
    if path.is_dir():
        return _load_folder(path, ref)
    if path.suffix.lower() == ".gguf":
        from placement.gguf_spec import load_gguf

        return load_gguf(path, ref)
    return load_hf_config(path, ref)


def _from_catalog(ref: str, no_file: str) -> ModelSpec:
    key = find_catalog_key(ref)
    if key is None:
        known = ", ".join(catalog_names())
        raise PlacementError(f"unknown model '{ref}': {no_file}, and not in the built-in catalog ({known})")
    return catalog_spec(key, ref)


def _load_folder(path: Path, ref: str) -> ModelSpec:
    if (path / "config.json").is_file():
        return load_hf_config(path / "config.json", ref)
    from placement.gguf_spec import load_gguf, main_gguf_files

    files = main_gguf_files(path)
    if len(files) != 1:
        found = ", ".join(p.name for p in files) or "none"
        raise PlacementError(f"{path}: need a config.json or exactly one model .gguf (found: {found})")
    return load_gguf(files[0], ref)

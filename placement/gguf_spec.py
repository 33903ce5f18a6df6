"""ModelSpec from a GGUF file: metadata and tensor sizes via the `gguf` package (memory-mapped; the
weights are never read). Split files (`-00001-of-00003.gguf`) are summed; a sibling `mmproj*.gguf`
is the vision projector llama.cpp loads with `--mmproj`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from agents.inventory import GgufHeaderError, TensorEntry, check_gguf_header
from placement.errors import PlacementError
from placement.spec import GgufTensors, ModelSpec

SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
LAYER_RE = re.compile(r"^blk\.(\d+)\.")
# Architectures whose sliding-window layout llama.cpp hard-codes (llama-model.cpp `set_swa_pattern`):
# every n-th layer is full attention, the others use the window.
SWA_PERIOD = {"gpt-oss": 2, "gemma2": 2, "gemma3": 6, "cohere2": 4}


def main_gguf_files(folder: Path) -> list[Path]:
    """Model files in a folder: not projectors, and only the first part of a split model."""
    files = []
    for path in sorted(folder.glob("*.gguf")):
        split = SPLIT_RE.search(path.name)
        if path.name.lower().startswith("mmproj") or (split and int(split.group(1)) != 1):
            continue
        files.append(path)
    return files


def _parts(path: Path) -> list[Path]:
    split = SPLIT_RE.search(path.name)
    if not split:
        return [path]
    total = int(split.group(2))
    stem = path.name[: split.start()]
    parts = [path.with_name(f"{stem}-{i:05d}-of-{total:05d}.gguf") for i in range(1, total + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise PlacementError(f"{path}: split GGUF is missing {', '.join(missing)}")
    return parts


def _reader(path: Path) -> Any:
    """The gguf package's reader, once the header has been walked here: on a broken file the package fails
    with numpy's words (array shapes, dtypes), not with what is wrong with the file."""
    from gguf import GGUFReader

    try:
        with path.open("rb") as file:
            check_gguf_header(file, _entry_bytes)
    except GgufHeaderError as exc:
        raise PlacementError(f"{path}: broken GGUF header: {exc}") from None
    except OSError as exc:
        raise PlacementError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return GGUFReader(path)
    except Exception as exc:  # whatever numpy raises on a corrupt tensor table
        raise PlacementError(
            f"{path}: broken GGUF file: its tensors do not match its header (corrupt or cut short; "
            f"the gguf reader raised {type(exc).__name__})"
        ) from None


def _entry_bytes(entry: TensorEntry) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(entry.kind)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown element type {entry.kind}") from None
    elements = math.prod(entry.shape)
    if elements % block:
        raise ValueError(f"shape {list(entry.shape)} is not a whole number of {block}-element blocks")
    return elements // block * size


def _fields(reader: Any) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items()}


def _get(meta: dict[str, Any], key: str, where: str, default: Any = None) -> Any:
    value = meta.get(key, default)
    if value is None:
        raise PlacementError(f"{where}: GGUF metadata has no '{key}'")
    return value


def _per_layer(value: Any) -> tuple[int, int]:
    """(max, count of non-zero) for a value that GGUF stores as a scalar or a per-layer array."""
    if isinstance(value, list):
        return max(int(v) for v in value), sum(1 for v in value if int(v) > 0)
    return int(value), -1


def _tensor_bytes(readers: list[Any], layers: int) -> tuple[list[float], float, float]:
    layer_bytes = [0.0] * layers
    embed = output = other = 0.0
    for reader in readers:
        for tensor in reader.tensors:
            size = float(tensor.n_bytes)
            match = LAYER_RE.match(tensor.name)
            if match and int(match.group(1)) < layers:
                layer_bytes[int(match.group(1))] += size
            elif tensor.name == "token_embd.weight":
                embed = size
            elif tensor.name == "output.weight":
                output = size
            else:
                other += size
    return layer_bytes, embed, (output or embed) + other


def _file_type(meta: dict[str, Any], readers: list[Any]) -> str:
    from gguf import GGMLQuantizationType, LlamaFileType

    if "general.file_type" in meta:
        try:
            name = LlamaFileType(int(meta["general.file_type"])).name
        except ValueError:
            return f"type {meta['general.file_type']}"
        return name.removeprefix("MOSTLY_").replace("ALL_", "")
    biggest = max((t for r in readers for t in r.tensors), key=lambda t: t.n_bytes)
    return GGMLQuantizationType(int(biggest.tensor_type)).name


def _sliding(
    meta: dict[str, Any], arch: str, layers: int, kv_counted: int
) -> tuple[int | None, int, int | None]:
    window = meta.get(f"{arch}.attention.sliding_window")
    attention_layers = kv_counted if kv_counted >= 0 else layers
    if not window:
        return (None if kv_counted < 0 else kv_counted), 0, None
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        sliding = sum(1 for flag in pattern if flag)
    else:
        period = SWA_PERIOD.get(arch, 0)
        sliding = attention_layers - attention_layers // period if period else attention_layers
    return attention_layers - sliding, sliding, int(window)


def load_gguf(path: Path, ref: str) -> ModelSpec:
    try:
        return _load_gguf(path, ref)
    except PlacementError:
        raise
    except (ValueError, TypeError, ArithmeticError) as exc:  # a metadata value of the wrong type, or zero
        raise PlacementError(
            f"{path}: GGUF metadata has a value the planner cannot use ({type(exc).__name__}: {exc})"
        ) from None


def _load_gguf(path: Path, ref: str) -> ModelSpec:
    where = str(path)
    parts = _parts(path)
    readers = [_reader(p) for p in parts]
    meta = _fields(readers[0])
    arch = str(_get(meta, "general.architecture", where))
    layers = int(_get(meta, f"{arch}.block_count", where))
    hidden = int(_get(meta, f"{arch}.embedding_length", where))
    heads, _ = _per_layer(_get(meta, f"{arch}.attention.head_count", where))
    kv_heads, kv_counted = _per_layer(meta.get(f"{arch}.attention.head_count_kv", heads))
    ffn, _ = _per_layer(_get(meta, f"{arch}.feed_forward_length", where))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = int(meta.get(f"{arch}.vocab_size") or (len(tokens) if tokens else 0))
    if vocab <= 0:
        raise PlacementError(f"{where}: GGUF metadata has neither '{arch}.vocab_size' nor a token list")
    full, sliding, window = _sliding(meta, arch, layers, kv_counted)
    layer_bytes, embed, output = _tensor_bytes(readers, layers)
    experts = int(meta.get(f"{arch}.expert_count") or 0)
    projector = sum(p.stat().st_size for p in sorted(path.parent.glob("mmproj*.gguf")))
    tensors = GgufTensors(
        _file_type(meta, readers),
        tuple(layer_bytes),
        embed,
        output,
        float(projector),
        tuple(str(p) for p in parts),
    )
    return ModelSpec(
        name=str(meta.get("general.name") or path.stem),
        ref=ref,
        source=where,
        architecture=arch,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(meta.get(f"{arch}.attention.key_length") or hidden // heads),
        intermediate_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=int(meta.get(f"{arch}.context_length") or 4096),
        tie_word_embeddings="output.weight" not in {t.name for r in readers for t in r.tensors},
        native_format=tensors.file_type,
        num_experts=experts,
        experts_per_tok=int(meta.get(f"{arch}.expert_used_count") or 0) if experts else 0,
        moe_intermediate_size=int(meta.get(f"{arch}.expert_feed_forward_length") or 0),
        full_attention_layers=full,
        sliding_layers=sliding,
        sliding_window=window,
        gguf=tensors,
    )

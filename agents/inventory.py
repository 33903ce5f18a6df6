"""The models present in an agent's --model-dir folders, reported to the server in the hello.

Each folder is scanned one level deep: a sub-folder with a config.json is a Hugging Face checkpoint (its
architecture, dtype or quantization, the size of its weight files, and the config keys the planner reads),
and every main .gguf file (not a projector, only the first part of a split file) is a GGUF model (its
architecture, name, size label and file type, read from the header; the weights are never read). Pure
standard library, bounded: at most MAX_MODELS models, MAX_CONFIG_CHARS of config per model, and at most
MAX_HEADER_BYTES read from a GGUF header.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from agents import protocol

MAX_MODELS = protocol.MAX_NODE_MODELS
MAX_CONFIG_BYTES = 2_000_000
MAX_HEADER_BYTES = 64 * 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# The config.json keys the planner reads (placement.spec.spec_from_hf_config); the rest stays on the node.
PLANNER_KEYS = frozenset(
    {
        "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "torch_dtype", "dtype", "sliding_window", "use_sliding_window",
        "max_window_layers", "layer_types", "sliding_window_pattern", "num_local_experts", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
        "quantization_config", "text_config", "llm_config", "language_config", "vision_config", "embed_dim",
        "num_heads", "depth", "spatial_merge_size", "out_hidden_size", "deepstack_visual_indexes",
    }
)  # fmt: skip
# llama.cpp's LLAMA_FTYPE values (general.file_type) as the names its quantize tool prints.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip
GGUF_KEYS = ("general.architecture", "general.name", "general.size_label", "general.file_type")


log = logging.getLogger(__name__)


class GgufHeaderError(ValueError):
    """Not a GGUF file, or a header that breaks the format."""


def scan_model_dirs(dirs: list[Path]) -> list[protocol.LocalModel]:
    """Every model found under `dirs` (unreadable entries are skipped), sorted by path, at most MAX_MODELS."""
    found: list[protocol.LocalModel] = []
    for root in dirs:
        for candidate in _candidates(Path(root)):
            model = _describe(candidate)
            if model is not None:
                found.append(model)
    return sorted(found, key=lambda m: m.path)[:MAX_MODELS]


def _candidates(root: Path) -> list[Path]:
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    folders = [p for p in entries if p.is_dir() and (p / "config.json").is_file()]
    ggufs = [p for p in entries if p.is_file() and is_main_gguf(p)]
    for folder in (p for p in entries if p.is_dir() and not (p / "config.json").is_file()):
        ggufs += [p for p in sorted(folder.glob("*.gguf")) if is_main_gguf(p)]
    return folders + ggufs


def is_main_gguf(path: Path) -> bool:
    split = SPLIT_RE.search(path.name)
    return (
        path.suffix.lower() == ".gguf"
        and not path.name.lower().startswith("mmproj")
        and not (split and int(split.group(1)) != 1)
    )


def _describe(path: Path) -> protocol.LocalModel | None:
    """The model at `path`, or None (logged, naming the file and what is wrong): the others still report."""
    try:
        return describe_gguf(path) if path.is_file() else describe_hf_folder(path)
    except GgufHeaderError as exc:
        log.warning("model %s left out: broken GGUF header: %s", path, exc)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.warning("model %s left out: %s", path, exc)
    return None


# ---------------------------------------------------------------- Hugging Face folders


def describe_hf_folder(folder: Path) -> protocol.LocalModel:
    raw = (folder / "config.json").read_bytes()[: MAX_CONFIG_BYTES + 1]
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{folder}/config.json is larger than {MAX_CONFIG_BYTES} bytes")
    config = json.loads(raw.decode("utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{folder}/config.json is not a JSON object")
    return protocol.LocalModel(
        path=str(folder),
        name=folder.name,
        format="hf",
        architecture=_architecture(config),
        quantization=_hf_quantization(config),
        size_bytes=sum(p.stat().st_size for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES),
        config=planner_config(config),
    )


def _architecture(config: dict[str, Any]) -> str:
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names else config.get("model_type", "")
    return str(name)[: protocol.MAX_MODEL_FIELD]


def _hf_quantization(config: dict[str, Any]) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        return str(quant["quant_method"])[: protocol.MAX_MODEL_FIELD]
    return str(config.get("torch_dtype") or config.get("dtype") or "")[: protocol.MAX_MODEL_FIELD]


def planner_config(config: dict[str, Any]) -> str:
    """The keys the planner reads, as compact JSON; empty when even those exceed the protocol's bound."""
    kept = {key: value for key, value in config.items() if key in PLANNER_KEYS}
    for nested in ("text_config", "llm_config", "language_config", "vision_config"):
        if isinstance(kept.get(nested), dict):
            kept[nested] = {k: v for k, v in kept[nested].items() if k in PLANNER_KEYS}
    text = json.dumps(kept, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= protocol.MAX_MODEL_CONFIG_CHARS else ""


# ---------------------------------------------------------------- GGUF files


def describe_gguf(path: Path) -> protocol.LocalModel:
    with path.open("rb") as file:
        meta = read_gguf_metadata(file, GGUF_KEYS)
    arch = str(meta.get("general.architecture", ""))
    file_type = meta.get("general.file_type")
    name = str(meta.get("general.name") or SPLIT_RE.sub("", path.name).removesuffix(".gguf"))
    size_label = str(meta.get("general.size_label", ""))
    return protocol.LocalModel(
        path=str(path),
        name=name[: protocol.MAX_MODEL_FIELD],
        format="gguf",
        architecture=arch[: protocol.MAX_MODEL_FIELD],
        quantization=FILE_TYPES.get(file_type, f"type {file_type}") if isinstance(file_type, int) else "",
        size_bytes=sum(p.stat().st_size for p in _split_parts(path)),
        size_label=size_label[: protocol.MAX_MODEL_FIELD],
    )


def _split_parts(path: Path) -> list[Path]:
    split = SPLIT_RE.search(path.name)
    if not split:
        return [path]
    stem, total = path.name[: split.start()], int(split.group(2))
    return [
        p
        for i in range(1, total + 1)
        if (p := path.with_name(f"{stem}-{i:05d}-of-{total:05d}.gguf")).is_file()
    ]


class _Header:
    """Sequential little-endian reads with a byte budget."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.read_bytes = file, 0

    def take(self, size: int) -> bytes:
        at = self.read_bytes
        self.read_bytes += size
        if self.read_bytes > MAX_HEADER_BYTES:
            raise GgufHeaderError(
                f"GGUF header larger than {MAX_HEADER_BYTES} bytes (a length of {size} at byte {at})"
            )
        data = self.file.read(size)
        if len(data) != size:
            raise GgufHeaderError(f"GGUF header is cut short at byte {at + len(data)}")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self, what: str = "a string value") -> str:
        at = self.read_bytes
        raw = self.take(self.unpack("Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GgufHeaderError(f"{what} at byte {at} is not UTF-8") from None


SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32


def read_gguf_metadata(file: BinaryIO, wanted: tuple[str, ...]) -> dict[str, Any]:
    """The scalar and string values of the `wanted` keys; other values (token arrays) are skipped."""
    header = _Header(file)
    _, key_count = _preamble(header)
    found: dict[str, Any] = {}
    for _ in range(key_count):
        key, value = _key_value(header)
        if key in wanted:
            found[key] = value
        if len(found) == len(wanted):
            break
    return found


class TensorEntry(NamedTuple):
    name: str
    shape: tuple[int, ...]
    kind: int  # the ggml element type
    offset: int  # from the start of the data section


def check_gguf_header(file: BinaryIO, tensor_bytes: Callable[[TensorEntry], int] | None = None) -> None:
    """Walk the whole header: every key and value, then every tensor's entry, and check that each tensor lies
    inside the file (its size from `tensor_bytes` when given, which raises ValueError for an unknown type).
    Raises GgufHeaderError saying what is wrong and at which byte."""
    header = _Header(file)
    tensor_count, key_count = _preamble(header)
    alignment = DEFAULT_ALIGNMENT
    for _ in range(key_count):
        key, value = _key_value(header)
        if key == "general.alignment":
            alignment = _alignment(value)
    entries = [_tensor_entry(header) for _ in range(tensor_count)]
    data_start = -(-header.read_bytes // alignment) * alignment
    size = os.fstat(file.fileno()).st_size
    for entry in entries:
        _check_inside(entry, data_start, size, tensor_bytes)


def _check_inside(
    entry: TensorEntry, data_start: int, size: int, tensor_bytes: Callable[[TensorEntry], int] | None
) -> None:
    try:
        length = tensor_bytes(entry) if tensor_bytes is not None else 1
    except ValueError as exc:
        raise GgufHeaderError(f"tensor {entry.name!r}: {exc}") from None
    end = data_start + entry.offset + length
    if end > size:
        raise GgufHeaderError(
            f"tensor {entry.name!r} ends at byte {end}, past the end of the file ({size} bytes): "
            "the file is cut short or its tensor table is corrupt"
        )


def _preamble(header: _Header) -> tuple[int, int]:
    if header.take(4) != b"GGUF":
        raise GgufHeaderError("not a GGUF file (no GGUF magic)")
    version = header.unpack("I")
    if version not in (2, 3):
        raise GgufHeaderError(f"GGUF version {version} is not supported")
    return header.unpack("Q"), header.unpack("Q")  # tensor count, key count


def _key_value(header: _Header) -> tuple[str, Any]:
    key = header.string("a key")
    return key, _value(header, header.unpack("I"), key)


def _alignment(value: Any) -> int:
    if not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise GgufHeaderError(f"general.alignment is {value!r}, not a power of two")
    return value


def _tensor_entry(header: _Header) -> TensorEntry:
    name = header.string("a tensor name")
    dims = header.unpack("I")
    if not 1 <= dims <= MAX_DIMS:
        raise GgufHeaderError(f"tensor {name!r} has {dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
    shape = tuple(header.unpack("Q") for _ in range(dims))
    return TensorEntry(name, shape, header.unpack("I"), header.unpack("Q"))


def _value(header: _Header, kind: int, key: str) -> Any:
    if kind in SCALARS:
        return header.unpack(SCALARS[kind])
    if kind == STRING:
        return header.string(f"the value of {key!r}")
    if kind == ARRAY:
        item, count = header.unpack("I"), header.unpack("Q")
        if item in SCALARS:
            header.take(count * struct.calcsize("<" + SCALARS[item]))
            return None
        for _ in range(count):
            _value(header, item, key)
        return None
    raise GgufHeaderError(f"unknown GGUF value type {kind} for {key!r} (at byte {header.read_bytes - 4})")

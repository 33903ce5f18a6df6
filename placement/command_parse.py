"""Read an operator's command line: which backend, model, parallelism, context and memory settings."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from placement.errors import PlacementError
from placement.request import LLAMA_CPP, OLLAMA, SGLANG, VLLM

ENV_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# Options that never take a value (everything else followed by a non-option token takes it).
BOOLEAN = {
    "--enforce-eager",
    "--disable-custom-all-reduce",
    "--trust-remote-code",
    "--disable-cuda-graph",
    "--enable-prefix-caching",
    "--no-mmap",
    "--mlock",
    "--verbose",
    "-v",
    "--cont-batching",
    "-cb",
    "--kv-unified",
    "-kvu",
    "--jinja",
    "--metrics",
    "--enable-chunked-prefill",
}
ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-q": "--quantization",
    "--tp-size": "--tensor-parallel-size",
    "--tp": "--tensor-parallel-size",
    "--pp-size": "--pipeline-parallel-size",
    "--context-length": "--max-model-len",
    "--mem-fraction-static": "--gpu-memory-utilization",
    "--model-path": "--model",
    "-m": "--model",
    "-c": "--ctx-size",
    "-np": "--parallel",
    "-ngl": "--n-gpu-layers",
    "--gpu-layers": "--n-gpu-layers",
    "-sm": "--split-mode",
    "-ts": "--tensor-split",
    "-mg": "--main-gpu",
    "-ctk": "--cache-type-k",
    "-ctv": "--cache-type-v",
    "-fa": "--flash-attn",
    "-dev": "--device",
    "--max-running-requests": "--max-num-seqs",
    "--chunked-prefill-size": "--max-num-batched-tokens",
}


@dataclass
class ParsedCommand:
    backend: str
    model_ref: str
    options: dict[str, str | bool]
    env: dict[str, str]
    argv: list[str]
    notes: list[str] = field(default_factory=list)

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self.options.get(name, default)
        return None if value is None or isinstance(value, bool) else str(value)

    def flag(self, name: str) -> bool:
        return name in self.options

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError as exc:
            raise PlacementError(f"{name} expects an integer, got '{value}'") from exc

    def number(self, name: str) -> float | None:
        value = self.get(name)
        try:
            return None if value is None else float(value)
        except ValueError as exc:
            raise PlacementError(f"{name} expects a number, got '{value}'") from exc


def _split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env, rest = {}, list(argv)
    if rest and rest[0] == "env":
        rest = rest[1:]
    while rest and (match := ENV_RE.match(rest[0])):
        env[match.group(1)] = match.group(2)
        rest = rest[1:]
    return env, rest


def _options(tokens: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    options: dict[str, str | bool] = {}
    positional: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-") or _is_number(token):
            positional.append(token)
            i += 1
            continue
        name, has_value, value = token.partition("=")
        name = ALIASES.get(name, name)
        if has_value:
            options[name] = value
        elif name not in BOOLEAN and i + 1 < len(tokens) and not _option_like(tokens[i + 1]):
            options[name] = tokens[i + 1]
            i += 1
        else:
            options[name] = True
        i += 1
    return options, positional


def _is_number(token: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d+)?", token))


def _option_like(token: str) -> bool:
    return token.startswith("-") and not _is_number(token)


def _identify(rest: list[str]) -> tuple[str, list[str], list[str]]:
    """(backend, head tokens, remaining tokens)."""
    program = Path(rest[0]).name
    if program == "vllm" and rest[1:2] == ["serve"]:
        return VLLM, rest[:2], rest[2:]
    if program.startswith("python") and rest[1:2] == ["-m"] and len(rest) > 2:
        module = rest[2]
        if module.startswith("vllm"):
            return VLLM, rest[:3], rest[3:]
        if module.startswith("sglang"):
            return SGLANG, rest[:3], rest[3:]
    if program == "sglang" and rest[1:2] == ["serve"]:
        return SGLANG, rest[:2], rest[2:]
    if program in ("llama-server", "llama-cli", "server"):
        return LLAMA_CPP, rest[:1], rest[1:]
    if program == "ollama" and rest[1:2] in (["run"], ["serve"]):
        return OLLAMA, rest[:2], rest[2:]
    raise PlacementError(
        f"unrecognised command '{' '.join(rest[:3])}': expected vllm serve, python -m "
        "sglang.launch_server, llama-server or ollama run"
    )


def parse_command(argv: list[str] | str) -> ParsedCommand:
    tokens = shlex.split(argv) if isinstance(argv, str) else list(argv)
    env, rest = _split_env(tokens)
    if not rest:
        raise PlacementError("no command given after the environment assignments")
    backend, head, tail = _identify(rest)
    options, positional = _options(tail)
    model = str(options.get("--model") or (positional[0] if positional else ""))
    if backend == OLLAMA and head[-1] == "serve":
        raise PlacementError("`ollama serve` names no model; check the `ollama run MODEL` line")
    if not model:
        raise PlacementError(f"the {backend} command names no model")
    return ParsedCommand(backend, model, options, env, tokens)


def parse_visible(text: str, node_gpus: list[int]) -> tuple[list[int], list[str]]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: it stops at the first index that does not exist."""
    notes: list[str] = []
    visible: list[int] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        if not part.isdigit():
            raise PlacementError(
                f"CUDA_VISIBLE_DEVICES entry '{part}' is not a GPU index (UUIDs and MIG names "
                "are not supported here; pass --visible with indices)"
            )
        index = int(part)
        if index not in node_gpus:
            notes.append(
                f"CUDA_VISIBLE_DEVICES={text}: GPU {index} does not exist on this node (GPUs "
                f"{','.join(map(str, node_gpus))}); CUDA ignores it and every index after it, so only "
                f"GPUs {','.join(map(str, visible)) or 'none'} are visible"
            )
            break
        visible.append(index)
    if not visible:
        raise PlacementError(f"CUDA_VISIBLE_DEVICES={text} leaves no GPU of this node visible")
    return visible, notes

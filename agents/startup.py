"""What an inference server says about its own memory at startup: weights and KV cache, per GPU.

    python -m agents.startup LOG     # prints the measurements found in a log file as JSON

Read from the lines vLLM, SGLang and llama.cpp print while loading (sizes are per GPU, the largest rank
when every rank prints its own line):
* vLLM: "Model loading took 14.9889 GiB" (V1) / "model weights take 14.96GiB" (profiling table) /
  "Loading model weights took 7.9692 GB" (V0), "Loading weights took 2.95 seconds", "Available KV cache
  memory: 8.11 GiB" / "available_kv_cache_memory 53.29GiB" / "reserved for KV Cache is 1.57GiB",
  "GPU KV cache size: 158,656 tokens", "Maximum concurrency for 32,768 tokens per request: 4.84x",
  "total_gpu_memory 79.22GiB" and "non_torch_memory 1.79GiB" (the profiling table).
* SGLang: "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB" (K + V is the pool),
  "Load weight end. ... mem usage=15.26 GB".
* llama.cpp: "CUDA0 model buffer size = 25338.47 MiB" (CPU buffers are not GPU memory), "CUDA0 KV buffer
  size = 5824.00 MiB", "n_ctx = 16384" (the KV cells: tokens over all slots).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

MIB_PER_GIB = 1024.0
NUMBER = r"([\d][\d,]*(?:\.\d+)?)"


@dataclass
class StartupFacts:
    weights_gib: float | None = None  # per GPU, the largest
    kv_cache_gib: float | None = None  # per GPU, the largest
    kv_tokens: int | None = None  # tokens the KV cache holds (one replica)
    max_concurrency: float | None = None  # requests of the full context the KV cache holds at once
    context_tokens: int | None = None  # the context the concurrency line is for
    load_seconds: float | None = None
    cuda_total_gib: float | None = None
    non_torch_gib: float | None = None

    def found(self) -> dict[str, float | int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _largest(current: float | None, value: float) -> float:
    return value if current is None else max(current, value)


Setter = Callable[[StartupFacts, re.Match[str]], None]


def _weights(scale: float = 1.0) -> Setter:
    def apply(facts: StartupFacts, m: re.Match[str]) -> None:
        if _num(m[1]) > 0:  # the simulated backend loads nothing and says "0.00 GiB"
            facts.weights_gib = _largest(facts.weights_gib, _num(m[1]) * scale)

    return apply


def _kv_gib(scale: float = 1.0) -> Setter:
    def apply(facts: StartupFacts, m: re.Match[str]) -> None:
        facts.kv_cache_gib = _largest(facts.kv_cache_gib, _num(m[1]) * scale)

    return apply


def _field(name: str, cast: Callable[[float], float | int] = float) -> Setter:
    def apply(facts: StartupFacts, m: re.Match[str]) -> None:
        setattr(facts, name, cast(_num(m[1])))

    return apply


def _concurrency(facts: StartupFacts, m: re.Match[str]) -> None:
    facts.context_tokens, facts.max_concurrency = int(_num(m[1])), _num(m[2])


def _sglang_pool(facts: StartupFacts, m: re.Match[str]) -> None:
    facts.kv_tokens = int(_num(m[1]))
    facts.kv_cache_gib = _largest(facts.kv_cache_gib, _num(m[2]) + _num(m[3]))


GPU_BUFFER = r"(?:CUDA|ROCm|Vulkan|Metal)\d*"
RULES: list[tuple[re.Pattern[str], Setter]] = [
    (re.compile(rf"Model loading took {NUMBER} GiB"), _weights()),
    (re.compile(rf"model weights take +{NUMBER} ?GiB"), _weights()),
    (re.compile(rf"Loading model weights took {NUMBER} GB"), _weights()),
    (re.compile(rf"Load weight end\..*mem usage={NUMBER} GB"), _weights()),
    (re.compile(rf"{GPU_BUFFER} model buffer size = +{NUMBER} MiB"), _weights(1 / MIB_PER_GIB)),
    (re.compile(rf"Loading weights took {NUMBER} seconds"), _field("load_seconds")),
    (re.compile(rf"Available KV cache memory: {NUMBER} GiB"), _kv_gib()),
    (re.compile(rf"available_kv_cache_memory +{NUMBER} ?GiB"), _kv_gib()),
    (re.compile(rf"reserved for KV Cache is {NUMBER} ?GiB"), _kv_gib()),
    (re.compile(rf"{GPU_BUFFER} KV buffer size = +{NUMBER} MiB"), _kv_gib(1 / MIB_PER_GIB)),
    (re.compile(rf"GPU KV cache size: {NUMBER} tokens"), _field("kv_tokens", int)),
    (
        re.compile(rf"KV Cache is allocated\. #tokens: {NUMBER}, K size: {NUMBER} GB, V size: {NUMBER} GB"),
        _sglang_pool,
    ),
    (re.compile(rf"\bn_ctx += {NUMBER}\s*$"), _field("kv_tokens", int)),
    (re.compile(rf"Maximum concurrency for {NUMBER} tokens per request: {NUMBER}x"), _concurrency),
    (re.compile(rf"total_gpu_memory \(?\s*{NUMBER} ?GiB"), _field("cuda_total_gib")),
    (re.compile(rf"non_torch_memory(?: takes)? +{NUMBER} ?GiB"), _field("non_torch_gib")),
]


def read_startup(lines: Iterable[str]) -> StartupFacts:
    """Every startup measurement the lines give; later lines win, sizes keep the largest GPU."""
    facts = StartupFacts()
    for line in lines:
        for pattern, apply in RULES:
            match = pattern.search(line)
            if match:
                apply(facts, match)
    return facts


FIELDS = tuple(f.name for f in fields(StartupFacts))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agents.startup LOG", file=sys.stderr)
        return 2
    try:
        text = Path(args[0]).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        print(f"error: cannot read {args[0]}: {exc.strerror}", file=sys.stderr)
        return 1
    print(json.dumps(read_startup(text.splitlines()).found(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

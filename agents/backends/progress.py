"""Weight-loading progress as the backends print it (0.0 = loading started, 1.0 = weights loaded)."""

from __future__ import annotations

import re

# vLLM and SGLang load through the same tqdm bar, one update per shard:
#   "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:01<00:01,  1.50it/s]"
SHARDS = re.compile(r"Loading \w+ checkpoint shards:\s*\d+% Completed \| (\d+)/(\d+)")
VLLM_MARKS = (
    (re.compile(r"Starting to load model "), 0.0),
    (re.compile(r"Loading weights took [\d.]+ seconds|Model loading took [\d.]+ ?GiB"), 1.0),
)
SGLANG_MARKS = (
    (re.compile(r"Load weight begin\."), 0.0),
    (re.compile(r"Load weight end\."), 1.0),
)
# llama.cpp: "load_tensors: loading model tensors, this can take a while..." (older builds
# "llm_load_tensors: ..."), then its default progress callback prints one dot per percent on one line
# (the line only ends at 100 %, so the supervisor also shows this parser the unfinished line), then
# llama-server says "main: model loaded".
LLAMACPP_MARKS = (
    (re.compile(r"\bload_tensors: loading model tensors|srv +load_model: loading model"), 0.0),
    (re.compile(r"\bmain: model loaded\b"), 1.0),
)
DOTS = re.compile(r"^\.{1,100}$")
# agents.sim.llamacpp_server (llama-cpp-python) says when it starts and ends loading, around llama.cpp's lines.
LLAMACPP_PYTHON_MARKS = (
    (re.compile(r"\(llama\.cpp engine\) loading model "), 0.0),
    (re.compile(r"Model \S+ loaded in [\d.]+ s"), 1.0),
)
# Ollama's server prints the runner's llama.cpp lines and, at debug level, `msg="model load progress 0.42"`.
OLLAMA_MARKS = (
    (re.compile(r"model load progress (\d(?:\.\d+)?)"), None),
    (re.compile(r"llama runner started in [\d.]+ ?s"), 1.0),
)


def shard_progress(line: str) -> float | None:
    match = SHARDS.search(line)
    if match is None:
        return None
    done, total = int(match.group(1)), int(match.group(2))
    return min(1.0, done / total) if total else None


def marked(line: str, marks: tuple) -> float | None:
    """The progress a marker line stands for; a marker without a fixed value carries it in group 1."""
    for pattern, value in marks:
        match = pattern.search(line)
        if match:
            return value if value is not None else min(1.0, float(match.group(1)))
    return None


def vllm_progress(line: str) -> float | None:
    found = shard_progress(line)
    return found if found is not None else marked(line, VLLM_MARKS)


def sglang_progress(line: str) -> float | None:
    found = shard_progress(line)
    return found if found is not None else marked(line, SGLANG_MARKS)


def llamacpp_progress(line: str) -> float | None:
    stripped = line.strip()
    if DOTS.fullmatch(stripped):
        return len(stripped) / 100
    return marked(line, LLAMACPP_MARKS)


def ollama_progress(line: str) -> float | None:
    found = marked(line, OLLAMA_MARKS)
    return found if found is not None else llamacpp_progress(line)


def llamacpp_python_progress(line: str) -> float | None:
    found = marked(line, LLAMACPP_PYTHON_MARKS)
    return found if found is not None else llamacpp_progress(line)

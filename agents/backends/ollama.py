"""Ollama: `ollama serve` on a private port, then the model loaded through its API and kept resident.

Ollama has no /metrics; `/api/ps` says which models are loaded and how much of them sits in VRAM.
It takes model names from its own store (`ollama pull` puts them there), never paths.
"""

from __future__ import annotations

import json

from agents import metrics
from agents.backends.base import LOOPBACK, Adapter, url_host
from agents.backends.progress import ollama_progress
from agents.protocol import Launch, ServerCounters


class OllamaAdapter(Adapter):
    name = "ollama"
    executable_name = "ollama"
    model_is_path = False
    health_path = "/api/version"
    metrics_path = "/api/ps"

    def argv(self, launch: Launch, port: int, host: str = LOOPBACK) -> list[str]:
        return [self.executable(), "serve"]

    def env(self, launch: Launch, port: int, host: str = LOOPBACK) -> dict[str, str]:
        o = launch.options
        bind = f"[{host}]" if ":" in host else host
        env = {"OLLAMA_HOST": f"{bind}:{port}", "OLLAMA_KEEP_ALIVE": "-1"}
        if o.max_model_len is not None:
            env["OLLAMA_CONTEXT_LENGTH"] = str(o.max_model_len)
        if o.parallel is not None:
            env["OLLAMA_NUM_PARALLEL"] = str(o.parallel)
        if len(launch.gpus) > 1:  # the plan spreads layers over these GPUs; Ollama packs onto few unless told
            env["OLLAMA_SCHED_SPREAD"] = "1"
        return {**env, **super().env(launch, port, host)}

    def counters(self, body: str) -> ServerCounters:
        return metrics.counters_from_ollama_ps(json.loads(body))

    def loading_progress(self, line: str) -> float | None:
        return ollama_progress(line)

    def load_request(self, launch: Launch, port: int, host: str = LOOPBACK) -> tuple[str, dict] | None:
        # A generate request without a prompt only loads the model; keep_alive -1 keeps it loaded.
        body = {"model": launch.model, "keep_alive": -1, "stream": False}
        return f"http://{url_host(host)}:{port}/api/generate", body

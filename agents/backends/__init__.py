"""Backend adapters, keyed by the protocol's backend names; see `base` for what an adapter is."""

from __future__ import annotations

from agents.backends.base import LOOPBACK, Adapter, LaunchRefused, admit
from agents.backends.llamacpp import LlamaCppAdapter, LlamaCppPythonAdapter
from agents.backends.ollama import OllamaAdapter
from agents.backends.sglang import SglangAdapter
from agents.backends.simulated import SimulatedAdapter
from agents.backends.vllm import VllmAdapter

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (
        VllmAdapter(),
        SglangAdapter(),
        LlamaCppAdapter(),
        OllamaAdapter(),
        LlamaCppPythonAdapter(),
        SimulatedAdapter(),
    )
}

__all__ = ["ADAPTERS", "LOOPBACK", "Adapter", "LaunchRefused", "admit"]

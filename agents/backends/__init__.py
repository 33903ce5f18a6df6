"""Backend adapters, keyed by the protocol's backend names; see `base` for what an adapter is."""

from __future__ import annotations

from agents.backends.base import LOOPBACK, Adapter, LaunchRefused, admit
from agents.backends.llamacpp import LlamaCppAdapter
from agents.backends.ollama import OllamaAdapter
from agents.backends.sglang import SglangAdapter
from agents.backends.vllm import VllmAdapter

SIMULATION_BACKENDS = ("llama-cpp-python", "simulated")


def simulation_adapters() -> tuple[Adapter, ...]:
    """The simulated nodes' adapters, when layercake-agent-sim is installed (never on a GPU node)."""
    try:
        from agents.sim.adapters import LlamaCppPythonAdapter, SimulatedAdapter
    except ModuleNotFoundError:
        return ()
    return LlamaCppPythonAdapter(), SimulatedAdapter()


ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (
        VllmAdapter(),
        SglangAdapter(),
        LlamaCppAdapter(),
        OllamaAdapter(),
        *simulation_adapters(),
    )
}

__all__ = ["ADAPTERS", "LOOPBACK", "SIMULATION_BACKENDS", "Adapter", "LaunchRefused", "admit"]

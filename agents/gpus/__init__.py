"""GPU sources: where the agent gets inventory, topology and samples from (NVML or simulated)."""

from agents.gpus.sim import make_source

__all__ = ["make_source"]

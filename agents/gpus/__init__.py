"""GPU sources: where the agent gets inventory, topology and samples from (NVML or simulated)."""

from __future__ import annotations

from agents.gpus.base import GpuSource, GpuSourceError
from agents.gpus.nvml import NvmlSource


def make_source(spec: str) -> GpuSource:
    """The CLI's --gpu-source: "nvml" or "sim:SPEC"; anything else is a GpuSourceError."""
    from agents.sim.gpus import PRESETS, SimSource  # agents.sim imports agents.gpus: load it on demand

    if spec == "nvml":
        return NvmlSource()
    if spec.startswith("sim:"):
        return SimSource(spec)
    raise GpuSourceError(f"unknown GPU source {spec!r}: use nvml or sim:SPEC (presets: {', '.join(PRESETS)})")


__all__ = ["make_source"]

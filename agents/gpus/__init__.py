"""GPU sources: where the agent gets inventory, topology and samples from (NVML or simulated)."""

from __future__ import annotations

import importlib

from agents.gpus.base import GpuSource, GpuSourceError
from agents.gpus.nvml import NvmlSource

SIM_MODULE = "agents.sim.gpus"


def make_source(spec: str) -> GpuSource:
    """The CLI's --gpu-source: "nvml" or "sim:SPEC"; anything else is a GpuSourceError."""
    if spec == "nvml":
        return NvmlSource()
    if spec.startswith("sim:"):
        return sim_source_class()(spec)
    raise GpuSourceError(f"unknown GPU source {spec!r}: use nvml or sim:SPEC (e.g. sim:a30x4)")


def sim_source_class() -> type[GpuSource]:
    """The simulated source, from the separately installed simulation (layercake-agent-sim)."""
    try:
        module = importlib.import_module(SIM_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in ("agents.sim", SIM_MODULE):
            raise
        raise GpuSourceError(
            "--gpu-source sim:... needs the simulation, which is not installed here "
            "(pip install layercake-agent-sim; a GPU node uses --gpu-source nvml)"
        ) from None
    return module.SimSource


__all__ = ["GpuSource", "GpuSourceError", "make_source"]

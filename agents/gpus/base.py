"""The interface every GPU source implements: the real NVML one and the simulated one alike."""

from __future__ import annotations

from abc import ABC, abstractmethod

from agents.protocol import GpuInfo, GpuReading, Topology


class GpuSourceError(RuntimeError):
    """The source cannot run here (no driver, no GPU, bad spec); the CLI prints it on one line, exit 2."""


class GpuSource(ABC):
    """A node's GPUs. Created once per agent process; `sample()` is called every interval."""

    kind: str  # "nvml" or "sim", as sent in the hello message
    simulated: bool

    @abstractmethod
    def driver_version(self) -> str: ...

    @abstractmethod
    def cuda_version(self) -> str: ...

    @abstractmethod
    def inventory(self) -> list[GpuInfo]: ...

    @abstractmethod
    def topology(self) -> Topology: ...

    @abstractmethod
    def sample(self) -> list[GpuReading]:
        """One sample per GPU, including XID events seen since the previous call."""

    def close(self) -> None:  # noqa: B027 - optional hook, most sources hold nothing
        """Release the driver handle; the default has nothing to release."""


class LoadAware(ABC):
    """Optional for a source: it is told what the agent's inference servers put on its GPUs.

    Real GPUs show a server's memory and utilization by themselves; a simulated source has nothing to fill, so
    the agent tells it (memory held by the KV pool while loaded, utilization while tokens flow).
    """

    @abstractmethod
    def set_load(
        self, index: int, util: float | None = None, mem_used_mib: float | None = None, pid: int | None = None
    ) -> None:
        """Pin a GPU's utilization and/or memory used (None leaves that one as it is); `pid`: the server
        process that holds the memory (NVML would list it)."""

    @abstractmethod
    def clear_load(self, index: int) -> None:
        """Hand a pinned GPU back to the source's own behaviour."""

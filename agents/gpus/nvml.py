"""GPU source backed by NVML (the nvidia-ml-py package, imported as `pynvml`) on a real GPU node.

`pynvml` is imported when a source is created, not when this module is imported, so tests can put a
fake NVML module at sys.modules["pynvml"] and machines without the package can still run the simulator.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from agents.gpus.base import GpuSource, GpuSourceError
from agents.protocol import GpuInfo, GpuProcess, GpuReading, TopoDevice, TopoLink, Topology

log = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_XIDS_PER_SAMPLE = 64
MAX_PROCESSES = 256
MAX_PROCESS_NAME = 256
SIM_HINT = "; on a machine without NVIDIA GPUs use --gpu-source sim:SPEC"
# NVML_TOPOLOGY_* level -> nvidia-smi label; INTERNAL (0: two GPUs on one board) gets the nearest label, PIX.
PATH_LEVELS = ((10, "PIX"), (20, "PXB"), (30, "PHB"), (40, "NODE"), (50, "SYS"))
# Literal indices: several pynvml versions define NVML_P2P_CAPS_INDEX_READ as the tuple (0,), which ctypes rejects.
P2P_INDEX = {"r": 0, "w": 1, "n": 2}
# nvmlGpuP2PStatus_t -> the legend of `nvidia-smi topo -p2p`.
P2P_LABELS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS"}
P2P_UNKNOWN = "U"
NVLINK_ACTIVE = 1
# NVML errors meaning "this GPU or driver cannot tell you that": the reading degrades to None.
OPTIONAL_ERRORS = (
    "NotSupported",
    "FunctionNotFound",
    "NoPermission",
    "NotFound",
    "NoData",
    "InvalidArgument",
    "ArgumentVersionMismatch",
    "Deprecated",
)


class NvmlSource(GpuSource):
    """All GPUs NVML sees, read through one `nvmlInit()` held for the life of the agent."""

    kind = "nvml"
    simulated = False

    def __init__(self) -> None:
        self._nvml = _import_pynvml()
        self._unsupported = tuple(
            getattr(self._nvml, f"NVMLError_{name}")
            for name in OPTIONAL_ERRORS
            if hasattr(self._nvml, f"NVMLError_{name}")
        )
        self._warned: set[tuple[int, str]] = set()
        _start_nvml(self._nvml)
        try:
            self._handles = self._device_handles()
            self._bus_ids = [
                _text(self._call(i, "PCI info", self._nvml.nvmlDeviceGetPciInfo, h).busId)
                for i, h in enumerate(self._handles)
            ]
        except GpuSourceError:
            self._optional(self._nvml.nvmlShutdown)
            raise
        self._event_sets = [self._xid_event_set(h) for h in self._handles]
        self._open = True

    def driver_version(self) -> str:
        return _text(self._optional(self._nvml.nvmlSystemGetDriverVersion) or "")

    def cuda_version(self) -> str:
        version = self._optional(self._nvml.nvmlSystemGetCudaDriverVersion)
        return f"{version // 1000}.{version % 1000 // 10}" if version else ""

    def inventory(self) -> list[GpuInfo]:
        return [self._gpu_info(i, h) for i, h in enumerate(self._handles)]

    def sample(self) -> list[GpuReading]:
        return [self._sample_gpu(i, h) for i, h in enumerate(self._handles)]

    def topology(self) -> Topology:
        """PCIe path, NVLink and P2P status per GPU pair; pairs whose path NVML cannot tell are left out."""
        peers, to_switch = self._nvlink_counts()
        pairs = list(itertools.combinations(range(len(self._handles)), 2))
        labels = {(i, j): self._pair_label(i, j, peers, to_switch) for i, j in pairs}
        return Topology(
            gpus=[self._topo_device(i, h) for i, h in enumerate(self._handles)],
            links=[_link(i, j, label) for (i, j), label in labels.items() if label],
            p2p=self._p2p_matrices(pairs),
        )

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        for event_set in filter(None, self._event_sets):
            self._optional(self._nvml.nvmlEventSetFree, event_set)
        self._optional(self._nvml.nvmlShutdown)

    # --- calls into NVML -------------------------------------------------------------------------

    def _call(self, index: int, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A reading the agent cannot do without: any NVML failure becomes a GpuSourceError naming the GPU."""
        try:
            return fn(*args, **kwargs)
        except self._nvml.NVMLError as exc:
            raise GpuSourceError(f"GPU {index}: reading {what} failed: {exc}") from None

    def _optional(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._unsupported:
            return None

    def _required(self, index: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A reading the protocol needs a number for: unsupported gives None (sent as 0) and one warning."""
        try:
            return fn(*args)
        except self._unsupported:
            if (index, what) not in self._warned:
                self._warned.add((index, what))
                log.warning("GPU %d does not report %s; sending 0", index, what)
            return None
        except self._nvml.NVMLError as exc:
            raise GpuSourceError(f"GPU {index}: reading {what} failed: {exc}") from None

    def _device_handles(self) -> list[Any]:
        count = self._call(0, "device count", self._nvml.nvmlDeviceGetCount)
        if not count:
            raise GpuSourceError("NVML is running but found no NVIDIA GPUs" + SIM_HINT)
        return [self._call(i, "handle", self._nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]

    # --- inventory -------------------------------------------------------------------------------

    def _gpu_info(self, index: int, handle: Any) -> GpuInfo:
        nvml = self._nvml
        return GpuInfo(
            index=index,
            uuid=_text(self._call(index, "UUID", nvml.nvmlDeviceGetUUID, handle)),
            name=_text(self._call(index, "name", nvml.nvmlDeviceGetName, handle)),
            pci_bus_id=self._bus_ids[index],
            memory_total_mib=self._call(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle).total // MIB,
            numa_node=self._numa_node(handle),
            power_limit_w=self._power_limit_w(handle),
        )

    def _numa_node(self, handle: Any) -> int | None:
        """The NUMA node closest to the GPU, when NVML names exactly one."""
        nodes = _mask_bits(self._memory_affinity(handle) or [])
        return nodes[0] if len(nodes) == 1 else None

    def _memory_affinity(self, handle: Any) -> Any:
        return self._optional(
            self._nvml.nvmlDeviceGetMemoryAffinity, handle, 1, self._nvml.NVML_AFFINITY_SCOPE_NODE
        )

    def _power_limit_w(self, handle: Any) -> float | None:
        milliwatts = self._optional(self._nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if milliwatts is None:
            milliwatts = self._optional(self._nvml.nvmlDeviceGetPowerManagementLimit, handle)
        return None if milliwatts is None else milliwatts / 1000

    # --- samples ---------------------------------------------------------------------------------

    def _sample_gpu(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        util = self._required(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._memory(index, handle)
        temp = self._required(
            index, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power_mw = self._required(index, "power draw", nvml.nvmlDeviceGetPowerUsage, handle)
        return GpuReading(
            index=index,
            util_gpu=util.gpu if util else 0,
            util_mem=util.memory if util else 0,
            mem_used_mib=memory.used / MIB,
            mem_free_mib=memory.free / MIB,
            temp_c=temp or 0,
            power_w=(power_mw or 0) / 1000,
            power_limit_w=self._power_limit_w(handle),
            sm_clock_mhz=self._optional(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            mem_clock_mhz=self._optional(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
            throttle_reasons=self._clock_event_reasons(handle) or 0,
            ecc_corrected=self._ecc_errors(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_uncorrected=self._ecc_errors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            xids=self._drain_xids(index),
            processes=self._processes(handle),
        )

    def _memory(self, index: int, handle: Any) -> Any:
        """v2 when the driver has it: its `used` excludes driver-reserved memory, as nvidia-smi shows."""
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        memory = (
            None
            if version is None
            else self._optional(self._nvml.nvmlDeviceGetMemoryInfo, handle, version=version)
        )
        return memory or self._call(index, "memory", self._nvml.nvmlDeviceGetMemoryInfo, handle)

    def _clock_event_reasons(self, handle: Any) -> int | None:
        # Renamed from ...ThrottleReasons in newer bindings; old ones only have the old name.
        nvml = self._nvml
        reader = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return self._optional(reader, handle)

    def _ecc_errors(self, handle: Any, error_type: int) -> int | None:
        return self._optional(
            self._nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, self._nvml.NVML_VOLATILE_ECC
        )

    def _processes(self, handle: Any) -> list[GpuProcess]:
        running = self._optional(self._nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return [
            GpuProcess(
                pid=proc.pid, name=self._process_name(proc.pid), used_mib=(proc.usedGpuMemory or 0) / MIB
            )
            for proc in running[:MAX_PROCESSES]
        ]

    def _process_name(self, pid: int) -> str:
        name = _text(self._optional(self._nvml.nvmlSystemGetProcessName, pid) or "")
        return name[-MAX_PROCESS_NAME:]

    # --- XID events ------------------------------------------------------------------------------

    def _xid_event_set(self, handle: Any) -> Any:
        """One event set per GPU, so every event is attributed to its GPU without comparing handles."""
        nvml = self._nvml
        event_set = self._optional(nvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        try:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        except self._unsupported:
            self._optional(nvml.nvmlEventSetFree, event_set)
            return None
        return event_set

    def _drain_xids(self, index: int) -> list[int]:
        """Every XID queued since the last sample, without waiting (timeout 0)."""
        nvml, event_set = self._nvml, self._event_sets[index]
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        xids: list[int] = []
        while event_set is not None and len(xids) < MAX_XIDS_PER_SAMPLE:
            try:
                event = wait(event_set, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as exc:
                log.warning("GPU %d: reading XID events failed: %s", index, exc)
                break
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                xids.append(int(event.eventData))
        return xids

    # --- topology --------------------------------------------------------------------------------

    def _topo_device(self, index: int, handle: Any) -> TopoDevice:
        cpus = self._optional(self._nvml.nvmlDeviceGetCpuAffinity, handle, _cpu_set_words())
        nodes = self._memory_affinity(handle)
        return TopoDevice(
            name=f"GPU{index}",
            cpu_affinity=None if cpus is None else mask_to_ranges(cpus),
            numa_affinity=None if nodes is None else mask_to_ranges(nodes),
        )

    def _nvlink_counts(self) -> tuple[list[Counter[int]], list[int]]:
        """Per GPU: active NVLinks to each peer GPU index, and active NVLinks to an NVSwitch."""
        by_bus = {_bus_key(bus): i for i, bus in enumerate(self._bus_ids)}
        peers: list[Counter[int]] = []
        to_switch: list[int] = []
        for handle in self._handles:
            remotes = [self._nvlink_remote(handle, link) for link in range(self._nvlink_count(handle))]
            to_switch.append(remotes.count("switch"))
            peers.append(Counter(by_bus[r] for r in remotes if r in by_bus))
        return peers, to_switch

    def _nvlink_count(self, handle: Any) -> int:
        nvml = self._nvml
        values = self._optional(nvml.nvmlDeviceGetFieldValues, handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
        if values and values[0].nvmlReturn == nvml.NVML_SUCCESS:
            return int(values[0].value.uiVal)
        return nvml.NVML_NVLINK_MAX_LINKS

    def _nvlink_remote(self, handle: Any, link: int) -> str | None:
        """What an active link reaches: "switch", a normalized PCI bus id, or None (inactive or unknown)."""
        nvml = self._nvml
        if self._optional(nvml.nvmlDeviceGetNvLinkState, handle, link) != NVLINK_ACTIVE:
            return None
        if (
            self._optional(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        ):
            return "switch"
        remote = self._optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        return None if remote is None else _bus_key(_text(remote.busId))

    def _pair_label(self, i: int, j: int, peers: list[Counter[int]], to_switch: list[int]) -> str | None:
        bonded = max(peers[i][j], peers[j][i])
        if to_switch[i] and to_switch[j]:
            # NVSwitch boards: no peer bus id to match, every switch-attached pair is fully connected.
            bonded = max(bonded, min(to_switch[i], to_switch[j]))
        if bonded:
            return f"NV{bonded}"
        level = self._optional(
            self._nvml.nvmlDeviceGetTopologyCommonAncestor, self._handles[i], self._handles[j]
        )
        return None if level is None else path_label(level)

    def _p2p_matrices(self, pairs: list[tuple[int, int]]) -> dict[str, list[TopoLink]]:
        matrices = {mode: self._p2p_links(pairs, index) for mode, index in P2P_INDEX.items()}
        return {mode: links for mode, links in matrices.items() if links}

    def _p2p_links(self, pairs: list[tuple[int, int]], p2p_index: int) -> list[TopoLink]:
        links = []
        for i, j in pairs:
            status = self._optional(
                self._nvml.nvmlDeviceGetP2PStatus, self._handles[i], self._handles[j], p2p_index
            )
            if status is not None:
                links.append(_link(i, j, P2P_LABELS.get(status, P2P_UNKNOWN)))
        return links


def _import_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise GpuSourceError(f"cannot import pynvml ({exc}): install nvidia-ml-py" + SIM_HINT) from None


def _start_nvml(nvml: ModuleType) -> None:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if isinstance(exc, nvml.NVMLError_LibraryNotFound):
            reason = "no NVIDIA driver here: the NVML library libnvidia-ml.so.1 was not found"
        elif isinstance(exc, nvml.NVMLError_DriverNotLoaded):
            reason = "the NVIDIA driver is not loaded"
        else:
            reason = f"NVML failed to start: {exc}"
        raise GpuSourceError(reason + SIM_HINT) from None


def path_label(level: int) -> str:
    """nvidia-smi's label for an NVML_TOPOLOGY_* level (an unknown level gets the next wider one)."""
    return next((label for limit, label in PATH_LEVELS if level <= limit), "SYS")


def mask_to_ranges(words: Iterable[int]) -> str | None:
    """64-bit mask words (word 0 = bits 0-63) as nvidia-smi prints them, e.g. "0-27,56-83"."""
    bits = _mask_bits(words)
    if not bits:
        return None
    runs: list[list[int]] = []
    for bit in bits:
        if runs and bit == runs[-1][1] + 1:
            runs[-1][1] = bit
        else:
            runs.append([bit, bit])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _mask_bits(words: Iterable[int]) -> list[int]:
    return [64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1]


def _cpu_set_words() -> int:
    return max(1, -(-(os.cpu_count() or 1) // 64))


def _bus_key(bus_id: str) -> str:
    """Bus ids compare equal whatever the domain width or case: 00000000:07:00.0 == 0000:07:00.0."""
    domain, sep, rest = bus_id.strip().partition(":")
    if not sep:
        return bus_id.strip().lower()
    try:
        return f"{int(domain, 16):x}:{rest.lower()}"
    except ValueError:
        return bus_id.strip().lower()


def _text(value: str | bytes) -> str:
    # Older bindings return bytes for C strings, newer ones decode them.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _link(i: int, j: int, label: str) -> TopoLink:
    return TopoLink(a=f"GPU{i}", b=f"GPU{j}", link=label)

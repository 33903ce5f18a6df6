"""A fake NVML for tests: a module with real pynvml's names, constants and error classes, driven by a config.

Build a `FakeNvml(gpus=[FakeGpu(...)], ...)`, then put `fake.module()` at sys.modules["pynvml"]. Handles are
opaque objects, values come back in NVML's units (bytes, mW, MHz), strings as str like nvidia-ml-py 12+.
"""

from __future__ import annotations

import string
import types
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# Constants, with the values of nvidia-ml-py 13.615.71 (test_nvml_source checks them against the real module).
NVML_SUCCESS = 0
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_AFFINITY_SCOPE_NODE = 0
NVML_AFFINITY_SCOPE_SOCKET = 1
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50
NVML_P2P_CAPS_INDEX_READ = (0,)  # the real module's trailing-comma gotcha: `NVML_P2P_CAPS_INDEX_READ = 0,`
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_CAPS_INDEX_ATOMICS = 3
NVML_P2P_CAPS_INDEX_PCI = 4
NVML_P2P_CAPS_INDEX_UNKNOWN = 5
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3
NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_P2P_STATUS_UNKNOWN = 6
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
nvmlMemory_v2 = 0x02000028
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypeXidCriticalError = 0x0000000000000008

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

_ERROR_STRINGS = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    """Same behaviour as pynvml.NVMLError: NVMLError(code) builds the matching NVMLError_<Name> subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int | None = None) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value if value is not None else cls._code
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _error_classes() -> dict[str, type[NVMLError]]:
    """NVMLError_NotSupported etc., named exactly as pynvml's _extractNVMLErrorsAsClasses names them."""
    classes = {}
    for const, code in list(globals().items()):
        if const.startswith("NVML_ERROR_"):
            name = "NVMLError_" + string.capwords(const.replace("NVML_ERROR_", ""), "_").replace("_", "")
            cls = type(name, (NVMLError,), {"_code": code, "__module__": __name__})
            NVMLError._valClassMapping[code] = cls
            classes[name] = cls
    return classes


globals().update(_error_classes())


@dataclass
class FakeGpu:
    """One fake GPU. `nvlinks` lists (active, remote) per link; remote is a bus id or "switch"."""

    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = ""
    bus_id: str = ""
    memory_total_mib: int = 81920
    memory_used_mib: int = 1024
    util_gpu: int = 0
    util_mem: int = 0
    temp_c: int = 35
    power_mw: int = 60_000
    power_limit_mw: int = 400_000
    sm_clock_mhz: int = 1410
    mem_clock_mhz: int = 1593
    clock_event_reasons: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    cpu_mask: list[int] = field(default_factory=lambda: [0xFFFF_FFFF])
    numa_mask: list[int] = field(default_factory=lambda: [0b1])
    nvlinks: list[tuple[bool, str]] = field(default_factory=list)
    processes: list[tuple[int, int | None, str]] = field(default_factory=list)


class FakeHandle:
    """Opaque like a c_nvmlDevice_t; the code under test must not look inside."""

    def __init__(self, index: int) -> None:
        self._index = index


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    ancestors: dict[tuple[int, int], int] = field(default_factory=dict)
    default_ancestor: int = NVML_TOPOLOGY_SYSTEM
    p2p: dict[tuple[int, int, int], int] = field(default_factory=dict)
    default_p2p: int = NVML_P2P_STATUS_NOT_SUPPORTED
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)
    init_error: int | None = None
    driver: str = "550.54.15"
    cuda: int = 12040
    link_count_field: bool = True

    def __post_init__(self) -> None:
        for index, gpu in enumerate(self.gpus):
            gpu.uuid = gpu.uuid or f"GPU-{index:08x}-fake-0000-0000-{index:012x}"
            gpu.bus_id = gpu.bus_id or f"00000000:{0x10 + 0x10 * index:02X}:00.0"
        self.initialized = 0
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.xid_queues: list[deque[int]] = [deque() for _ in self.gpus]
        self._handles = [FakeHandle(i) for i in range(len(self.gpus))]
        self._event_sets: dict[int, list[int]] = {}

    def queue_xid(self, index: int, xid: int) -> None:
        self.xid_queues[index].append(xid)

    def module(self) -> types.ModuleType:
        """A fresh module object to install as sys.modules["pynvml"]."""
        module = types.ModuleType("pynvml")
        for name, value in globals().items():
            if name.startswith(("NVML", "nvml")):
                setattr(module, name, value)
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(module, name, self._wrap(name, getattr(self, name)))
        return module

    def _wrap(self, name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if name in self.unsupported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            if name in self.failing:
                raise NVMLError(self.failing[name])
            if not self.initialized and name != "nvmlInit":
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return method(*args, **kwargs)

        return call

    def _gpu(self, handle: FakeHandle) -> FakeGpu:
        return self.gpus[handle._index]

    # --- system ----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self.gpus:
            for proc_pid, _, name in gpu.processes:
                if proc_pid == pid:
                    return name
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    # --- identity and inventory ------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        return handle._index

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=self._gpu(handle).bus_id)

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeHandle, version: int | None = None
    ) -> types.SimpleNamespace:
        gpu = self._gpu(handle)
        total, used = gpu.memory_total_mib * 2**20, gpu.memory_used_mib * 2**20
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    # --- samples ---------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> types.SimpleNamespace:
        gpu = self._gpu(handle)
        return types.SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._gpu(handle).temp_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu(handle).power_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._gpu(handle)
        return {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.mem_clock_mhz}[clock_type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._gpu(handle).clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._gpu(handle).clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle)
        return gpu.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_uncorrected

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[types.SimpleNamespace]:
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used, _ in self._gpu(handle).processes
        ]

    # --- events ----------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> int:
        event_set = len(self._event_sets) + 1
        self._event_sets[event_set] = []
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: int) -> None:
        self._event_sets[event_set].append(handle._index)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> types.SimpleNamespace:
        for index in self._event_sets[event_set]:
            if self.xid_queues[index]:
                xid = self.xid_queues[index].popleft()
                return types.SimpleNamespace(
                    device=self._handles[index], eventType=nvmlEventTypeXidCriticalError, eventData=xid
                )
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetWait(self, event_set: int, timeout_ms: int) -> types.SimpleNamespace:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: int) -> None:
        del self._event_sets[event_set]

    # --- topology --------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeHandle, second: FakeHandle) -> int:
        pair = (min(first._index, second._index), max(first._index, second._index))
        return self.ancestors.get(pair, self.default_ancestor)

    def nvmlDeviceGetFieldValues(
        self, handle: FakeHandle, field_ids: list[Any]
    ) -> list[types.SimpleNamespace]:
        if not self.link_count_field:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        assert field_ids == [NVML_FI_DEV_NVLINK_LINK_COUNT]
        count = len(self._gpu(handle).nvlinks)
        return [types.SimpleNamespace(nvmlReturn=NVML_SUCCESS, value=types.SimpleNamespace(uiVal=count))]

    def _nvlink(self, handle: FakeHandle, link: int) -> tuple[bool, str]:
        links = self._gpu(handle).nvlinks
        if not links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        return NVML_FEATURE_ENABLED if self._nvlink(handle, link)[0] else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeHandle, link: int) -> int:
        remote = self._nvlink(handle, link)[1]
        return NVML_NVLINK_DEVICE_TYPE_SWITCH if remote == "switch" else NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=self._nvlink(handle, link)[1])

    def nvmlDeviceGetP2PStatus(self, first: FakeHandle, second: FakeHandle, p2p_index: int) -> int:
        if not isinstance(p2p_index, int):
            # What ctypes does with the real module's tuple constant.
            raise TypeError(f"an integer is required (got type {type(p2p_index).__name__})")
        pair = (min(first._index, second._index), max(first._index, second._index))
        return self.p2p.get((*pair, p2p_index), self.default_p2p)

    def nvmlDeviceGetCpuAffinity(self, handle: FakeHandle, cpu_set_size: int) -> list[int]:
        return (self._gpu(handle).cpu_mask + [0] * cpu_set_size)[:cpu_set_size]

    def nvmlDeviceGetMemoryAffinity(self, handle: FakeHandle, node_set_size: int, scope: int) -> list[int]:
        return (self._gpu(handle).numa_mask + [0] * node_set_size)[:node_set_size]

"""Simulated GPUs for machines without any (CI, the demo fleet, load tests).

A spec names a GPU model, a count and a real `nvidia-smi topo -m` paste:
  sim:a30x4 | sim:h100x8 | sim:rtx4090x2            presets shipped in topologies/
  sim:MODEL,COUNT,PATH_TO_TOPO_TXT                   e.g. sim:L40S,4,/tmp/topo.txt
either with an optional `,seed=N`. Everything is driven by seeded random generators and advances one step
per `sample()` call, so two sources built from the same spec produce identical inventories and samples.
"""

from __future__ import annotations

import random
import re
import uuid
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from agents.gpus.base import GpuSource, GpuSourceError, LoadAware
from agents.protocol import GpuInfo, GpuProcess, GpuReading, TopoDevice, TopoLink, Topology, TopoNic
from agents.topo import TopologyParseError, parse_topology

TOPOLOGY_DIR = Path(__file__).with_name("topologies")
DRIVER_VERSION = "550.54.15"
CUDA_VERSION = "12.4"
DEFAULT_SEED = 0
MAX_GPUS = 64
MAX_XIDS_PER_SAMPLE = 64
# NVML clock-event reason bits the simulator raises.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
# Dynamics, per sample step.
BURST_CHANCE = 0.03
JOB_CHANGE_CHANCE = 0.01
IDLE_MEMORY_MIB = 1.0
PROCESS_MIN_MIB = 256.0


@dataclass(frozen=True)
class GpuModel:
    name: str  # as NVML reports it
    memory_mib: int  # as nvidia-smi reports the total
    tdp_w: float
    idle_w: float
    sm_clock_mhz: tuple[int, int]  # idle, boost
    mem_clock_mhz: tuple[int, int]  # idle, busy (HBM does not downclock)
    temp_c: tuple[float, float]  # idle, sustained full load
    ecc: bool
    pcie_p2p: bool  # the driver disables PCIe P2P on GeForce cards


MODELS = {
    "A30": GpuModel(
        "NVIDIA A30", 24576, 165, 33, (210, 1440), (1215, 1215), (32, 72), ecc=True, pcie_p2p=True
    ),
    "H100": GpuModel(
        "NVIDIA H100 80GB HBM3", 81559, 700, 70, (345, 1980), (2619, 2619), (28, 74), ecc=True, pcie_p2p=True
    ),
    "A100-80GB": GpuModel(
        "NVIDIA A100-SXM4-80GB", 81920, 400, 55, (210, 1410), (1593, 1593), (30, 70), ecc=True, pcie_p2p=True
    ),
    "L40S": GpuModel(
        "NVIDIA L40S", 46068, 350, 35, (210, 2520), (405, 9001), (30, 76), ecc=True, pcie_p2p=True
    ),
    "RTX4090": GpuModel(
        "NVIDIA GeForce RTX 4090",
        24564,
        450,
        20,
        (210, 2520),
        (405, 10501),
        (35, 70),
        ecc=False,
        pcie_p2p=False,
    ),
}


@dataclass(frozen=True)
class Preset:
    model: str
    count: int
    topology_file: str


PRESETS = {
    "a30x4": Preset("A30", 4, "a30x4.txt"),  # the field report's server: every pair SYS, no P2P
    "h100x8": Preset("H100", 8, "h100x8.txt"),  # HGX board, NV18 through NVSwitch
    "rtx4090x2": Preset("RTX4090", 2, "rtx4090x2.txt"),  # desktop box, PHB
}


@dataclass(frozen=True)
class SimSpec:
    model: GpuModel
    count: int
    topology_text: str
    topology_source: str  # where the matrix came from, for error messages
    seed: int = DEFAULT_SEED
    workload: str = (
        "mixed"  # "mixed": other jobs come and go; "idle": a dedicated server with nothing running
    )


def parse_spec(spec: str) -> SimSpec:
    """Read "PRESET[,seed=N]" or "MODEL,COUNT,PATH[,seed=N]" (a leading "sim:" is allowed)."""
    body = spec.removeprefix("sim:").strip()
    parts = [part.strip() for part in body.split(",")]
    options = dict(_option(part, spec) for part in parts if "=" in part)
    positional = [part for part in parts if "=" not in part]
    seed = _seed(options.pop("seed", str(DEFAULT_SEED)), spec)
    workload = options.pop("workload", "mixed")
    if workload not in ("mixed", "idle"):
        raise GpuSourceError(f"sim spec {spec!r}: workload must be mixed or idle, got {workload!r}")
    if options:
        raise GpuSourceError(
            f"sim spec {spec!r}: unknown option {next(iter(options))!r} (only seed=N and workload=mixed|idle)"
        )
    if len(positional) == 1:
        return replace(_preset_spec(positional[0], seed), workload=workload)
    if len(positional) == 3:
        return replace(_custom_spec(*positional, seed=seed), workload=workload)
    raise GpuSourceError(
        f"sim spec {spec!r}: expected a preset ({', '.join(PRESETS)}) or MODEL,COUNT,PATH_TO_TOPO_TXT[,seed=N]"
    )


def _option(part: str, spec: str) -> tuple[str, str]:
    key, _, value = part.partition("=")
    if not key.strip():
        raise GpuSourceError(f"sim spec {spec!r}: option {part!r} has no name")
    return key.strip().lower(), value.strip()


def _seed(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise GpuSourceError(f"sim spec {spec!r}: seed must be an integer, got {text!r}") from None


def _preset_spec(name: str, seed: int) -> SimSpec:
    preset = PRESETS.get(name.lower())
    if preset is None:
        raise GpuSourceError(
            f"unknown sim preset {name!r}: valid presets are {', '.join(PRESETS)}; or give MODEL,COUNT,PATH_TO_TOPO_TXT"
        )
    path = TOPOLOGY_DIR / preset.topology_file
    return SimSpec(
        MODELS[preset.model], preset.count, path.read_text(encoding="utf-8"), f"preset {name}", seed
    )


def _custom_spec(model_name: str, count_text: str, path_text: str, seed: int) -> SimSpec:
    model = find_model(model_name)
    if not count_text.isdigit() or not 1 <= int(count_text) <= MAX_GPUS:
        raise GpuSourceError(
            f"sim spec: GPU count must be a whole number from 1 to {MAX_GPUS}, got {count_text!r}"
        )
    path = Path(path_text).expanduser()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise GpuSourceError(f"sim spec: cannot read topology file {path}: {exc.strerror}") from None
    return SimSpec(model, int(count_text), text, str(path), seed)


def find_model(name: str) -> GpuModel:
    """A model by its table key or NVML name, ignoring case, spaces and dashes ("rtx 4090", "A100-80GB")."""
    wanted = _squash(name)
    for key, model in MODELS.items():
        if wanted in (_squash(key), _squash(model.name)):
            return model
    raise GpuSourceError(f"unknown sim GPU model {name!r}: valid models are {', '.join(MODELS)}")


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def build_topology(spec: SimSpec) -> Topology:
    """The spec's matrix as the protocol's Topology, with the P2P status such a machine would report."""
    try:
        parsed = parse_topology(spec.topology_text)
    except TopologyParseError as exc:
        raise GpuSourceError(
            f"{spec.topology_source}: not a readable nvidia-smi topo -m paste: {exc}"
        ) from None
    if parsed["kind"] != "matrix":
        raise GpuSourceError(
            f"{spec.topology_source}: expected nvidia-smi topo -m output, got a {parsed['kind']} paste"
        )
    if len(parsed["gpus"]) != spec.count:
        raise GpuSourceError(
            f"{spec.topology_source}: the matrix has {len(parsed['gpus'])} GPUs but the spec asks for {spec.count}"
        )
    gpu_names = {gpu["name"] for gpu in parsed["gpus"]}
    links = [TopoLink(a=link["a"], b=link["b"], link=link["link"]) for link in parsed["links"]]
    gpu_links = [link for link in links if {link.a, link.b} <= gpu_names]
    return Topology(
        gpus=[
            TopoDevice(name=g["name"], cpu_affinity=g["cpu_affinity"], numa_affinity=g["numa_affinity"])
            for g in parsed["gpus"]
        ],
        nics=[TopoNic(name=nic["name"], device=nic["device"]) for nic in parsed["nics"]],
        links=links,
        p2p={
            mode: [
                link.model_copy(update={"link": p2p_label(spec.model, link.link, mode)}) for link in gpu_links
            ]
            for mode in ("r", "w", "n")
        },
    )


def p2p_label(model: GpuModel, link: str, mode: str) -> str:
    """`nvidia-smi topo -p2p` status for a GPU pair: NVLink always works; PCIe P2P not across sockets or on GeForce."""
    if link.startswith("NV"):
        return "OK"
    if mode == "n":
        return "NS"
    if not model.pcie_p2p:
        return "GNS"
    return "NS" if link in ("SYS", "SOC") else "OK"


class SimSource(GpuSource, LoadAware):
    """Simulated GPUs from a spec; `set_load`, `inject_xid` and `inject_ecc_errors` let tests and demos drive them."""

    kind = "sim"
    simulated = True

    def __init__(self, spec: str | SimSpec) -> None:
        self.spec = spec if isinstance(spec, SimSpec) else parse_spec(spec)
        self._topology = build_topology(self.spec)
        ids = random.Random(f"{self.spec.seed}:{self.spec.model.name}:{self.spec.count}:ids")
        bus_numbers = sorted(ids.sample(range(0x04, 0xF0), self.spec.count))
        self._gpus = [
            SimulatedGpu(
                index=i,
                model=self.spec.model,
                uuid=f"GPU-{uuid.UUID(int=ids.getrandbits(128))}",
                pci_bus_id=f"00000000:{bus:02X}:00.0",
                numa_node=_single_node(device.numa_affinity),
                rng=random.Random(f"{self.spec.seed}:{self.spec.model.name}:{self.spec.count}:{i}"),
                idle=self.spec.workload == "idle",
            )
            for i, (bus, device) in enumerate(zip(bus_numbers, self._topology.gpus, strict=True))
        ]

    def driver_version(self) -> str:
        return DRIVER_VERSION

    def cuda_version(self) -> str:
        return CUDA_VERSION

    def inventory(self) -> list[GpuInfo]:
        return [gpu.info() for gpu in self._gpus]

    def topology(self) -> Topology:
        return self._topology

    def sample(self) -> list[GpuReading]:
        return [gpu.sample() for gpu in self._gpus]

    def set_load(
        self, index: int, util: float | None = None, mem_used_mib: float | None = None, pid: int | None = None
    ) -> None:
        """Pin a GPU's utilization and/or memory used (None leaves that one as it is); the pinned memory is
        listed as held by `pid` (the inference server) when given."""
        self._gpu(index).pin(util, mem_used_mib)
        if pid is not None:
            self._gpu(index).server_pid = pid

    def clear_load(self, index: int) -> None:
        """Hand a pinned GPU back to the random walk."""
        self._gpu(index).unpin()

    def inject_xid(self, index: int, code: int) -> None:
        """Queue an XID event; the next sample reports it, as NVML's event set would."""
        if not isinstance(code, int) or code <= 0:
            raise ValueError(f"XID code must be a positive integer, got {code!r}")
        self._gpu(index).xids.append(code)

    def inject_ecc_errors(self, index: int, corrected: int = 0, uncorrected: int = 0) -> None:
        """Add to a GPU's volatile ECC error counts (an ECC-capable model only), as the driver would count them."""
        gpu = self._gpu(index)
        if not gpu.model.ecc:
            raise ValueError(f"GPU {index} ({gpu.model.name}) has no ECC memory")
        if min(corrected, uncorrected) < 0:
            raise ValueError(f"ECC error counts only grow: got {corrected}, {uncorrected}")
        gpu.ecc_corrected += corrected
        gpu.ecc_uncorrected += uncorrected

    def _gpu(self, index: int) -> SimulatedGpu:
        if not 0 <= index < len(self._gpus):
            raise ValueError(f"no simulated GPU {index}: this source has GPUs 0-{len(self._gpus) - 1}")
        return self._gpus[index]


class SimulatedGpu:
    """One GPU's state: a mean-reverting random walk with bursts; memory, heat and power follow."""

    def __init__(
        self,
        index: int,
        model: GpuModel,
        uuid: str,
        pci_bus_id: str,
        numa_node: int | None,
        rng: random.Random,
        idle: bool = False,
    ) -> None:
        self.index, self.model, self.uuid, self.pci_bus_id, self.numa_node = (
            index,
            model,
            uuid,
            pci_bus_id,
            numa_node,
        )
        self.rng, self.idle = rng, idle
        self.baseline = 0.0 if idle else rng.uniform(5, 70)
        self.util = self.baseline
        self.mem_ratio = rng.uniform(0.3, 0.7)
        self.mem_target = IDLE_MEMORY_MIB if idle else rng.uniform(0.05, 0.85) * model.memory_mib
        self.mem_used = self.mem_target
        self.temp = model.temp_c[0] + (model.temp_c[1] - model.temp_c[0]) * self.util / 100
        self.burst = 0
        self.pid = rng.randint(1000, 4_000_000)
        self.pinned_util: float | None = None
        self.pinned_mem: float | None = None
        self.server_pid: int | None = None  # the pid NVML lists for pinned memory (an inference server's)
        self.xids: deque[int] = deque()
        self.ecc_corrected = self.ecc_uncorrected = 0  # volatile counts since the (simulated) driver loaded

    def info(self) -> GpuInfo:
        return GpuInfo(
            index=self.index,
            uuid=self.uuid,
            name=self.model.name,
            pci_bus_id=self.pci_bus_id,
            memory_total_mib=self.model.memory_mib,
            numa_node=self.numa_node,
            power_limit_w=self.model.tdp_w,
        )

    def pin(self, util: float | None, mem_used_mib: float | None) -> None:
        if util is not None and not 0 <= util <= 100:
            raise ValueError(f"GPU {self.index}: utilization must be 0-100 %, got {util}")
        if mem_used_mib is not None and not 0 <= mem_used_mib <= self.model.memory_mib:
            raise ValueError(
                f"GPU {self.index}: memory used must be 0-{self.model.memory_mib} MiB, got {mem_used_mib}"
            )
        if util is not None:
            self.pinned_util = self.util = float(util)
        if mem_used_mib is not None:
            self.pinned_mem = self.mem_used = float(mem_used_mib)

    def unpin(self) -> None:
        self.pinned_util = self.pinned_mem = self.server_pid = None

    def sample(self) -> GpuReading:
        util, mem_used = self._step_util(), self._step_memory()
        temp, power = self._step_temp(util), self._power(util)
        model = self.model
        return GpuReading(
            index=self.index,
            util_gpu=round(util),
            util_mem=round(_clamp(util * self.mem_ratio + self.rng.gauss(0, 1.5), 0, 100)),
            mem_used_mib=round(mem_used),
            mem_free_mib=model.memory_mib - round(mem_used),
            temp_c=round(temp),
            power_w=round(power, 1),
            power_limit_w=model.tdp_w,
            sm_clock_mhz=self._sm_clock(util, power),
            mem_clock_mhz=model.mem_clock_mhz[1] if util >= 1 else model.mem_clock_mhz[0],
            throttle_reasons=(REASON_GPU_IDLE if util < 1 else 0)
            | (REASON_SW_POWER_CAP if power >= 0.97 * model.tdp_w else 0),
            ecc_corrected=self.ecc_corrected if model.ecc else None,
            ecc_uncorrected=self.ecc_uncorrected if model.ecc else None,
            xids=[self.xids.popleft() for _ in range(min(len(self.xids), MAX_XIDS_PER_SAMPLE))],
            processes=self._processes(mem_used),
        )

    def _step_util(self) -> float:
        if self.pinned_util is not None:
            return self.pinned_util
        rng = self.rng
        if self.idle:  # nothing runs here but what layercake deploys (and pins)
            self.util = 0.0
            return self.util
        self.baseline = _clamp(self.baseline + rng.gauss(0, 0.5), 5, 80)
        if self.burst:
            self.burst -= 1
        elif rng.random() < BURST_CHANCE:
            self.burst = rng.randint(3, 12)
        target = rng.uniform(90, 100) if self.burst else self.baseline
        self.util = _clamp(self.util + 0.3 * (target - self.util) + rng.gauss(0, 3), 0, 100)
        return self.util

    def _step_memory(self) -> float:
        if self.pinned_mem is not None:
            return self.pinned_mem
        total, rng = self.model.memory_mib, self.rng
        if not self.idle and rng.random() < JOB_CHANGE_CHANCE:
            self.mem_target = rng.uniform(0.05, 0.85) * total
        step = 0.05 * (self.mem_target - self.mem_used) + rng.gauss(0, 0.001 * total)
        self.mem_used = _clamp(self.mem_used + step, IDLE_MEMORY_MIB, total)
        return self.mem_used

    def _step_temp(self, util: float) -> float:
        idle, full = self.model.temp_c
        self.temp += 0.1 * (idle + (full - idle) * util / 100 - self.temp) + self.rng.gauss(0, 0.2)
        return self.temp

    def _power(self, util: float) -> float:
        model = self.model
        draw = (
            model.idle_w + (model.tdp_w - model.idle_w) * util / 100 + self.rng.gauss(0, 0.01 * model.tdp_w)
        )
        return _clamp(draw, 0.8 * model.idle_w, model.tdp_w)

    def _sm_clock(self, util: float, power: float) -> int:
        idle, boost = self.model.sm_clock_mhz
        if util < 1:
            return idle
        capped = power >= 0.97 * self.model.tdp_w
        clock = boost * (0.9 if capped else 1.0) - self.rng.uniform(0, 0.03) * boost
        return int(clock // 15 * 15)  # NVML clocks move in 15 MHz bins

    def _processes(self, mem_used: float) -> list[GpuProcess]:
        if mem_used < PROCESS_MIN_MIB:
            return []
        pid = self.server_pid if self.pinned_mem is not None and self.server_pid else self.pid
        return [GpuProcess(pid=pid, name="python3", used_mib=round(mem_used - IDLE_MEMORY_MIB))]


def _single_node(numa_affinity: str | None) -> int | None:
    return int(numa_affinity) if numa_affinity and numa_affinity.isdigit() else None


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))

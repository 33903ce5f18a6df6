"""NvmlSource against a fake NVML module at the `pynvml` seam, plus one run on the real NVML when a GPU is here."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest

from agents.gpus import nvml as nvml_source
from agents.gpus.base import GpuSourceError
from agents.gpus.nvml import NvmlSource, mask_to_ranges, path_label
from agents.protocol import GpuReading
from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu, FakeNvml


@pytest.fixture
def install(monkeypatch):
    """Put a fake NVML at sys.modules["pynvml"]; returns a function taking the FakeNvml to install."""

    def _install(fake: FakeNvml) -> FakeNvml:
        monkeypatch.setitem(sys.modules, "pynvml", fake.module())
        return fake

    return _install


def links_of(topology, mode: str | None = None) -> dict[tuple[str, str], str]:
    links = topology.links if mode is None else topology.p2p[mode]
    return {(link.a, link.b): link.link for link in links}


def test_it_reports_inventory_with_versions(install):
    gpus = [
        FakeGpu(name="NVIDIA A30", memory_total_mib=24576, power_limit_mw=165_000, numa_mask=[0b10])
        for _ in range(2)
    ]
    fake = install(FakeNvml(gpus=gpus, driver="535.104.05", cuda=12020))
    source = NvmlSource()
    inventory = source.inventory()
    assert [g.index for g in inventory] == [0, 1]
    assert inventory[1].name == "NVIDIA A30"
    assert inventory[1].uuid == fake.gpus[1].uuid
    assert inventory[1].pci_bus_id == "00000000:20:00.0"
    assert inventory[0].memory_total_mib == 24576
    assert inventory[0].numa_node == 1
    assert inventory[0].power_limit_w == 165.0
    assert (source.driver_version(), source.cuda_version()) == ("535.104.05", "12.2")
    assert source.kind == "nvml" and source.simulated is False


def test_it_decodes_bytes_from_old_bindings(monkeypatch):
    module = FakeNvml(gpus=[FakeGpu()]).module()
    module.nvmlDeviceGetName = lambda handle: b"Tesla V100-SXM2-16GB"
    module.nvmlSystemGetDriverVersion = lambda: b"418.67"
    monkeypatch.setitem(sys.modules, "pynvml", module)
    source = NvmlSource()
    assert source.inventory()[0].name == "Tesla V100-SXM2-16GB"
    assert source.driver_version() == "418.67"


def test_it_samples_every_reading_in_protocol_units(install):
    gpu = FakeGpu(
        memory_total_mib=81920,
        memory_used_mib=20480,
        util_gpu=87,
        util_mem=41,
        temp_c=66,
        power_mw=312_500,
        power_limit_mw=700_000,
        sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        clock_event_reasons=0x4,
        ecc_corrected=3,
        ecc_uncorrected=1,
        processes=[(4242, 18 * 2**30, "/usr/bin/python3")],
    )
    install(FakeNvml(gpus=[gpu]))
    (sample,) = NvmlSource().sample()
    assert isinstance(sample, GpuReading)
    assert (sample.util_gpu, sample.util_mem) == (87, 41)
    assert (sample.mem_used_mib, sample.mem_free_mib) == (20480, 61440)
    assert sample.temp_c == 66
    assert (sample.power_w, sample.power_limit_w) == (312.5, 700.0)
    assert (sample.sm_clock_mhz, sample.mem_clock_mhz) == (1980, 2619)
    assert sample.throttle_reasons == 0x4
    assert (sample.ecc_corrected, sample.ecc_uncorrected) == (3, 1)
    assert [(p.pid, p.name, p.used_mib) for p in sample.processes] == [(4242, "/usr/bin/python3", 18432)]
    assert sample.xids == []


def test_it_asks_for_memory_v2_so_used_matches_nvidia_smi(install):
    fake = install(FakeNvml(gpus=[FakeGpu()]))
    NvmlSource().sample()
    versions = [kwargs.get("version") for name, _, kwargs in fake.calls if name == "nvmlDeviceGetMemoryInfo"]
    assert versions == [fake_pynvml.nvmlMemory_v2]


def test_it_drains_queued_xids_once_and_per_gpu(install):
    fake = install(FakeNvml(gpus=[FakeGpu(), FakeGpu()]))
    source = NvmlSource()
    fake.queue_xid(1, 79)
    fake.queue_xid(1, 43)
    fake.queue_xid(0, 13)
    first = source.sample()
    assert [s.xids for s in first] == [[13], [79, 43]]
    assert [s.xids for s in source.sample()] == [[], []]


def test_it_caps_xids_per_sample_and_keeps_the_rest_for_later(install):
    fake = install(FakeNvml(gpus=[FakeGpu()]))
    source = NvmlSource()
    for _ in range(70):
        fake.queue_xid(0, 31)
    assert len(source.sample()[0].xids) == 64
    assert len(source.sample()[0].xids) == 6


def test_it_waits_for_events_without_blocking(install):
    fake = install(FakeNvml(gpus=[FakeGpu()]))
    NvmlSource().sample()
    waits = [args for name, args, _ in fake.calls if name == "nvmlEventSetWait_v2"]
    assert waits and all(args[1] == 0 for args in waits)


def test_it_degrades_optional_readings_to_none_when_not_supported(install):
    unsupported = {
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetMemoryAffinity",
        "nvmlSystemGetCudaDriverVersion",
    }
    fake = install(FakeNvml(gpus=[FakeGpu()], unsupported=unsupported))
    source = NvmlSource()
    fake.queue_xid(0, 79)
    (sample,) = source.sample()
    assert (sample.sm_clock_mhz, sample.mem_clock_mhz, sample.power_limit_w) == (None, None, None)
    assert (sample.ecc_corrected, sample.ecc_uncorrected) == (None, None)
    assert (sample.throttle_reasons, sample.processes, sample.xids) == (0, [], [])
    assert source.inventory()[0].numa_node is None
    assert source.cuda_version() == ""


def test_it_falls_back_to_the_old_throttle_reasons_name(monkeypatch):
    module = FakeNvml(gpus=[FakeGpu(clock_event_reasons=0x20)]).module()
    del module.nvmlDeviceGetCurrentClocksEventReasons
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert NvmlSource().sample()[0].throttle_reasons == 0x20


def test_it_sends_zero_and_warns_once_when_utilization_is_not_supported(install, caplog):
    install(FakeNvml(gpus=[FakeGpu(util_gpu=50)], unsupported={"nvmlDeviceGetUtilizationRates"}))
    source = NvmlSource()
    with caplog.at_level(logging.WARNING, logger="agents.gpus.nvml"):
        samples = [source.sample()[0] for _ in range(3)]
    assert [s.util_gpu for s in samples] == [0, 0, 0]
    assert [r.getMessage() for r in caplog.records] == ["GPU 0 does not report utilization; sending 0"]


def test_it_names_the_gpu_when_a_required_reading_fails(install):
    install(
        FakeNvml(
            gpus=[FakeGpu(), FakeGpu()],
            failing={"nvmlDeviceGetPowerUsage": fake_pynvml.NVML_ERROR_GPU_IS_LOST},
        )
    )
    with pytest.raises(GpuSourceError, match="GPU 0: reading power draw failed: GPU is lost"):
        NvmlSource().sample()


def test_it_fails_with_one_clear_line_without_a_driver(install):
    install(FakeNvml(gpus=[], init_error=fake_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(GpuSourceError) as caught:
        NvmlSource()
    message = str(caught.value)
    assert "libnvidia-ml.so.1 was not found" in message and "--gpu-source sim:SPEC" in message
    assert "\n" not in message


def test_it_fails_clearly_when_the_driver_is_not_loaded(install):
    install(FakeNvml(gpus=[], init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(GpuSourceError, match="NVIDIA driver is not loaded"):
        NvmlSource()


def test_it_fails_clearly_with_no_gpus_and_releases_nvml(install):
    fake = install(FakeNvml(gpus=[]))
    with pytest.raises(GpuSourceError, match="found no NVIDIA GPUs"):
        NvmlSource()
    assert fake.initialized == 0


def test_it_fails_clearly_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuSourceError, match="install nvidia-ml-py"):
        NvmlSource()


def test_it_holds_one_nvml_init_and_releases_it_on_close(install):
    fake = install(FakeNvml(gpus=[FakeGpu()]))
    source = NvmlSource()
    for _ in range(3):
        source.sample()
    source.topology()
    assert fake.initialized == 1
    source.close()
    source.close()
    assert fake.initialized == 0
    assert [call[0] for call in fake.calls].count("nvmlInit") == 1


def test_it_maps_common_ancestors_to_pcie_labels(install):
    levels = fake_pynvml
    ancestors = {
        (0, 1): levels.NVML_TOPOLOGY_SINGLE,
        (2, 3): levels.NVML_TOPOLOGY_MULTIPLE,
        (0, 2): levels.NVML_TOPOLOGY_HOSTBRIDGE,
        (1, 2): levels.NVML_TOPOLOGY_NODE,
    }
    install(FakeNvml(gpus=[FakeGpu() for _ in range(4)], ancestors=ancestors))
    assert links_of(NvmlSource().topology()) == {
        ("GPU0", "GPU1"): "PIX",
        ("GPU0", "GPU2"): "PHB",
        ("GPU0", "GPU3"): "SYS",
        ("GPU1", "GPU2"): "NODE",
        ("GPU1", "GPU3"): "SYS",
        ("GPU2", "GPU3"): "PXB",
    }


def test_it_labels_every_nvml_level_like_nvidia_smi():
    assert [path_label(level) for level in (0, 10, 20, 30, 40, 50)] == [
        "PIX",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
    ]


def test_it_counts_bonded_nvlinks_over_bridges_into_nv_labels(install):
    gpus = [FakeGpu() for _ in range(4)]
    bus = ["00000000:10:00.0", "00000000:20:00.0", "00000000:30:00.0", "00000000:40:00.0"]
    # GPU0-GPU1 bonded by 4 links; GPU2-GPU3 by 2 plus one link down, remotes given in the legacy bus id form.
    gpus[0].nvlinks = [(True, bus[1])] * 4
    gpus[1].nvlinks = [(True, bus[0])] * 4
    gpus[2].nvlinks = [(True, "0000:40:00.0"), (True, "0000:40:00.0"), (False, "0000:40:00.0")]
    gpus[3].nvlinks = [(True, "0000:30:00.0"), (True, "0000:30:00.0"), (False, "0000:30:00.0")]
    install(FakeNvml(gpus=gpus, ancestors={(0, 2): fake_pynvml.NVML_TOPOLOGY_NODE}))
    links = links_of(NvmlSource().topology())
    assert links[("GPU0", "GPU1")] == "NV4"
    assert links[("GPU2", "GPU3")] == "NV2"
    assert links[("GPU0", "GPU2")] == "NODE"
    assert links[("GPU1", "GPU3")] == "SYS"


def test_it_finds_nvlinks_without_the_link_count_field(install):
    gpus = [FakeGpu(), FakeGpu()]
    gpus[0].nvlinks = [(True, "00000000:20:00.0")] * 2
    gpus[1].nvlinks = [(True, "00000000:10:00.0")] * 2
    install(FakeNvml(gpus=gpus, link_count_field=False))
    assert links_of(NvmlSource().topology()) == {("GPU0", "GPU1"): "NV2"}


def test_it_treats_nvswitch_attached_gpus_as_fully_connected(install):
    gpus = [FakeGpu(name="NVIDIA H100 80GB HBM3", nvlinks=[(True, "switch")] * 18) for _ in range(8)]
    install(FakeNvml(gpus=gpus))
    topology = NvmlSource().topology()
    assert len(topology.links) == 28
    assert set(links_of(topology).values()) == {"NV18"}


def test_it_labels_p2p_status_per_mode_with_a_literal_read_index(install):
    fake = fake_pynvml
    p2p = {
        (0, 1, 0): fake.NVML_P2P_STATUS_OK,
        (0, 1, 1): fake.NVML_P2P_STATUS_OK,
        (0, 2, 0): fake.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
        (0, 2, 1): fake.NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
        (1, 2, 0): fake.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
        (1, 2, 1): fake.NVML_P2P_STATUS_DISABLED_BY_REGKEY,
        (1, 2, 2): fake.NVML_P2P_STATUS_UNKNOWN,
    }
    install(FakeNvml(gpus=[FakeGpu() for _ in range(3)], p2p=p2p))
    topology = NvmlSource().topology()
    assert links_of(topology, "r") == {
        ("GPU0", "GPU1"): "OK",
        ("GPU0", "GPU2"): "CNS",
        ("GPU1", "GPU2"): "TNS",
    }
    assert links_of(topology, "w") == {
        ("GPU0", "GPU1"): "OK",
        ("GPU0", "GPU2"): "GNS",
        ("GPU1", "GPU2"): "DR",
    }
    assert links_of(topology, "n") == {("GPU0", "GPU1"): "NS", ("GPU0", "GPU2"): "NS", ("GPU1", "GPU2"): "U"}


def test_it_leaves_out_what_nvml_cannot_tell_about_pairs(install):
    unsupported = {
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetCpuAffinity",
    }
    install(FakeNvml(gpus=[FakeGpu(), FakeGpu()], unsupported=unsupported))
    topology = NvmlSource().topology()
    assert topology.links == [] and topology.p2p == {}
    assert topology.gpus[0].cpu_affinity is None and topology.gpus[0].numa_affinity == "0"


def mask_words(cpus: set[int], words: int) -> list[int]:
    return [sum(1 << (cpu - 64 * w) for cpu in cpus if 64 * w <= cpu < 64 * (w + 1)) for w in range(words)]


def test_it_prints_cpu_and_numa_affinity_like_nvidia_smi(install, monkeypatch):
    # The two NUMA halves of fixture 036 (8x H100, 224 CPUs): masks span four 64-bit words.
    monkeypatch.setattr(nvml_source.os, "cpu_count", lambda: 224)
    socket0 = set(range(0, 56)) | set(range(112, 168))
    socket1 = set(range(56, 112)) | set(range(168, 224))
    gpus = [
        FakeGpu(cpu_mask=mask_words(socket0, 4), numa_mask=[0b01]),
        FakeGpu(cpu_mask=mask_words(socket1, 4), numa_mask=[0b10]),
    ]
    install(FakeNvml(gpus=gpus))
    topology = NvmlSource().topology()
    assert [g.name for g in topology.gpus] == ["GPU0", "GPU1"]
    assert [g.cpu_affinity for g in topology.gpus] == ["0-55,112-167", "56-111,168-223"]
    assert [g.numa_affinity for g in topology.gpus] == ["0", "1"]


def test_it_formats_affinity_masks_as_ranges():
    assert mask_to_ranges([(1 << 28) - 1 | ((1 << 28) - 1) << 56, ((1 << 28) - 1) >> 8]) == "0-27,56-83"
    assert mask_to_ranges([0b1011]) == "0-1,3"
    assert mask_to_ranges([0, 1]) == "64"
    assert mask_to_ranges([0]) is None


def test_it_fakes_only_names_and_values_the_real_pynvml_has():
    real = importlib.import_module("pynvml")
    fake = FakeNvml(gpus=[]).module()
    for name in dir(fake):
        if name.startswith(("NVML", "nvml")):
            assert hasattr(real, name), f"real pynvml has no {name}"
            value = getattr(fake, name)
            if isinstance(value, int | tuple):
                assert getattr(real, name) == value, f"{name}: fake {value!r} != real {getattr(real, name)!r}"
    assert real.NVMLError_NotSupported.__name__ == fake.NVMLError_NotSupported.__name__


def test_it_reads_a_real_gpu_through_the_real_pynvml(monkeypatch):
    real = importlib.import_module("pynvml")
    try:
        real.nvmlInit()
    except real.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU or driver here: nvmlInit raised {type(exc).__name__} ({exc})")
    real.nvmlShutdown()
    monkeypatch.setitem(sys.modules, "pynvml", real)
    source = NvmlSource()
    try:
        inventory = source.inventory()
        samples = source.sample()
        topology = source.topology()
    finally:
        source.close()
    assert inventory and len(samples) == len(inventory) == len(topology.gpus)
    assert all(s.mem_used_mib + s.mem_free_mib > 0 for s in samples)

"""The simulated GPU source: presets built from real pastes, reproducible plausible samples, bad specs."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from agents import protocol
from agents.gpus import make_source
from agents.gpus.base import GpuSourceError
from agents.sim.gpus import MODELS, PRESETS, TOPOLOGY_DIR, SimSource
from tests.fixtures import fixture_files, read_fixture

PRESET_FIXTURES = {"a30x4": "007_*", "h100x8": "036_*", "rtx4090x2": "016_*"}


def gpu_pairs(topology, labels=None) -> dict[tuple[str, str], str]:
    links = topology.links if labels is None else topology.p2p[labels]
    return {(x.a, x.b): x.link for x in links if x.a.startswith("GPU") and x.b.startswith("GPU")}


def run(source: SimSource, steps: int) -> list[list[protocol.GpuReading]]:
    return [source.sample() for _ in range(steps)]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_it_ships_each_preset_paste_verbatim(preset):
    _, body = read_fixture(fixture_files("topo", PRESET_FIXTURES[preset])[0])
    assert (TOPOLOGY_DIR / PRESETS[preset].topology_file).read_text(encoding="utf-8") == body


def test_it_simulates_the_seed_a30_server_all_sys_without_p2p():
    source = make_source("sim:a30x4")
    assert source.kind == "sim" and source.simulated is True
    inventory = source.inventory()
    assert [g.name for g in inventory] == ["NVIDIA A30"] * 4
    assert {g.memory_total_mib for g in inventory} == {24576}
    topology = source.topology()
    assert len(gpu_pairs(topology)) == 6 and set(gpu_pairs(topology).values()) == {"SYS"}
    assert [n.device for n in topology.nics] == ["mlx5_0", "mlx5_1"]
    assert set(gpu_pairs(topology, "r").values()) == set(gpu_pairs(topology, "w").values()) == {"NS"}
    assert {g.cpu_affinity for g in topology.gpus} == {"0-127"}


def test_it_simulates_an_nvswitch_h100_node_with_nv18_and_p2p():
    source = make_source("sim:h100x8")
    topology = source.topology()
    assert len(gpu_pairs(topology)) == 28 and set(gpu_pairs(topology).values()) == {"NV18"}
    assert all(set(gpu_pairs(topology, mode).values()) == {"OK"} for mode in ("r", "w", "n"))
    assert [g.numa_node for g in source.inventory()] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topology.gpus[4].cpu_affinity == "56-111,168-223"
    assert len(topology.nics) == 13
    assert source.inventory()[0].name == "NVIDIA H100 80GB HBM3"


def test_it_simulates_a_geforce_box_on_one_host_bridge_without_p2p():
    topology = make_source("sim:rtx4090x2").topology()
    assert topology.links == [protocol.TopoLink(a="GPU0", b="GPU1", link="PHB")]
    assert gpu_pairs(topology, "r") == {("GPU0", "GPU1"): "GNS"}
    assert gpu_pairs(topology, "n") == {("GPU0", "GPU1"): "NS"}


def test_it_repeats_exactly_with_the_same_seed():
    first, second = SimSource("h100x8,seed=7"), SimSource("sim:h100x8,seed=7")
    assert first.inventory() == second.inventory()
    assert run(first, 300) == run(second, 300)


def test_it_differs_with_another_seed():
    first, second = SimSource("a30x4,seed=1"), SimSource("a30x4,seed=2")
    assert {g.uuid for g in first.inventory()}.isdisjoint(g.uuid for g in second.inventory())
    assert run(first, 20) != run(second, 20)


def test_it_gives_unique_stable_ids_within_a_node():
    inventory = SimSource("h100x8").inventory()
    assert len({g.uuid for g in inventory}) == len({g.pci_bus_id for g in inventory}) == 8
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == 40 for g in inventory)
    assert [g.pci_bus_id for g in inventory] == sorted(g.pci_bus_id for g in inventory)


def test_it_keeps_samples_within_physical_bounds():
    for preset in PRESETS:
        source = SimSource(preset)
        model = MODELS[PRESETS[preset].model]
        for step in run(source, 400):
            for s in step:
                assert s.mem_used_mib + s.mem_free_mib == model.memory_mib
                assert model.temp_c[0] - 3 <= s.temp_c <= model.temp_c[1] + 3
                assert 0 < s.power_w <= s.power_limit_w == model.tdp_w
                assert model.sm_clock_mhz[0] <= s.sm_clock_mhz <= model.sm_clock_mhz[1]
                assert (s.ecc_corrected is None) is (not model.ecc)


def test_it_builds_frames_the_server_accepts():
    source = SimSource("h100x8")
    message = protocol.Samples(type="samples", v=1, seq=1, t=1.0, gpus=source.sample())
    assert protocol.parse_agent_message(protocol.dump(message)) == message
    hello = protocol.Hello(
        type="hello",
        v=1,
        agent_version="test",
        hostname="sim",
        boot_id="0123456789",
        interval_s=1,
        gpu_source="sim",
        simulated=True,
        gpus=source.inventory(),
        topology=source.topology(),
    )
    assert len(protocol.dump(hello)) < protocol.MAX_FRAME_BYTES
    assert protocol.parse_agent_message(protocol.dump(hello)) == hello


def test_it_moves_utilization_smoothly_with_bursts():
    steps = run(SimSource("h100x8,seed=3"), 600)
    for index in range(8):
        util = [step[index].util_gpu for step in steps]
        assert statistics.pstdev(util) > 3, "utilization should move"
        jumps = [abs(b - a) for a, b in zip(util, util[1:], strict=False)]
        assert statistics.median(jumps) < 8, "a random walk, not white noise"
    assert max(step[i].util_gpu for step in steps for i in range(8)) >= 90, "bursts reach full load"


def test_it_changes_memory_slowly():
    steps = run(SimSource("a30x4,seed=5"), 600)
    for index in range(4):
        used = [step[index].mem_used_mib for step in steps]
        assert max(abs(b - a) for a, b in zip(used, used[1:], strict=False)) < 0.05 * 24576
        assert len(set(used)) > 10


def test_it_makes_power_and_temperature_follow_utilization():
    source = SimSource("rtx4090x2")
    source.set_load(0, util=100)
    source.set_load(1, util=0)
    hot, cold = run(source, 80)[-1]
    assert hot.temp_c > cold.temp_c + 20
    assert hot.power_w > 400 > 30 > cold.power_w
    assert hot.sm_clock_mhz > cold.sm_clock_mhz
    assert cold.throttle_reasons & 0x1 and not hot.throttle_reasons & 0x1
    util = [s[0].util_gpu for s in run(SimSource("rtx4090x2,seed=9"), 300)]
    power = [s[0].power_w for s in run(SimSource("rtx4090x2,seed=9"), 300)]
    assert statistics.correlation(util, power) > 0.9


def test_it_lets_callers_pin_load_like_a_server_filling_memory():
    source = SimSource("a30x4")
    source.set_load(2, util=0, mem_used_mib=23000)
    for _ in range(5):
        sample = source.sample()[2]
        assert (sample.util_gpu, sample.mem_used_mib, sample.mem_free_mib) == (0, 23000, 1576)
        assert sample.processes[0].used_mib > 22000
    source.set_load(2, util=55)
    assert (source.sample()[2].util_gpu, source.sample()[2].mem_used_mib) == (55, 23000)
    source.clear_load(2)
    assert [s[2].util_gpu for s in run(source, 30)] != [55] * 30


def test_it_reports_an_idle_gpu_without_processes():
    source = SimSource("h100x8")
    source.set_load(0, util=0, mem_used_mib=0)
    assert source.sample()[0].processes == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.set_load(4, util=10), "no simulated GPU 4"),
        (lambda s: s.set_load(0, util=101), "utilization must be 0-100"),
        (lambda s: s.set_load(0, mem_used_mib=30000), "memory used must be 0-24576"),
        (lambda s: s.inject_xid(0, 0), "positive integer"),
        (lambda s: s.inject_ecc_errors(0, corrected=-1), "only grow"),
    ],
)
def test_it_rejects_impossible_load(call, message):
    with pytest.raises(ValueError, match=message):
        call(SimSource("a30x4"))


def test_it_reports_injected_xids_once_on_their_gpu():
    source = SimSource("h100x8")
    source.inject_xid(3, 79)
    source.inject_xid(3, 43)
    first = source.sample()
    assert first[3].xids == [79, 43]
    assert all(s.xids == [] for i, s in enumerate(first) if i != 3)
    assert source.sample()[3].xids == []


def test_it_counts_injected_ecc_errors_on_their_gpu_from_then_on():
    source = SimSource("a30x4")
    assert source.sample()[1].ecc_corrected == 0
    source.inject_ecc_errors(1, corrected=3, uncorrected=1)
    source.inject_ecc_errors(1, corrected=2)
    for _ in range(2):
        readings = source.sample()
        assert (readings[1].ecc_corrected, readings[1].ecc_uncorrected) == (5, 1)
        assert (readings[0].ecc_corrected, readings[0].ecc_uncorrected) == (0, 0)


def test_it_refuses_ecc_errors_on_a_gpu_without_ecc():
    source = SimSource("rtx4090x2")
    with pytest.raises(ValueError, match="has no ECC memory"):
        source.inject_ecc_errors(0, corrected=1)
    assert source.sample()[0].ecc_corrected is None


def test_it_builds_a_custom_spec_from_a_topology_file(tmp_path):
    _, body = read_fixture(fixture_files("topo", "059_*")[0])
    path = tmp_path / "l40s.txt"
    path.write_text(body)
    source = make_source(f"sim:l40s,4,{path},seed=4")
    assert {g.name for g in source.inventory()} == {"NVIDIA L40S"}
    pairs = gpu_pairs(source.topology())
    assert pairs[("GPU0", "GPU1")] == "NODE" and pairs[("GPU0", "GPU2")] == "SYS"
    assert gpu_pairs(source.topology(), "r")[("GPU0", "GPU1")] == "OK"
    assert make_source(f"sim:RTX 4090,4,{path}").inventory()[0].name == "NVIDIA GeForce RTX 4090"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:a30x5", "unknown sim preset 'a30x5': valid presets are a30x4, h100x8, rtx4090x2"),
        (
            "sim:V100,4,{a30}",
            "unknown sim GPU model 'V100': valid models are A30, H100, A100-80GB, L40S, RTX4090",
        ),
        ("sim:A30,8,{a30}", "the matrix has 4 GPUs but the spec asks for 8"),
        ("sim:A30,four,{a30}", "GPU count must be a whole number"),
        ("sim:A30,4,{missing}", "cannot read topology file"),
        ("sim:A30,2,{p2p}", "expected nvidia-smi topo -m output, got a p2p paste"),
        ("sim:A30,2,{junk}", "not a readable nvidia-smi topo -m paste"),
        ("sim:a30x4,seed=x", "seed must be an integer"),
        ("sim:a30x4,speed=2", "unknown option 'speed'"),
        ("sim:A30,4", "expected a preset"),
        ("cuda", "unknown GPU source 'cuda': use nvml or sim:SPEC"),
    ],
)
def test_it_rejects_bad_specs_naming_what_is_valid(spec, message, tmp_path):
    p2p = tmp_path / "p2p.txt"
    p2p.write_text(read_fixture(fixture_files("topo", "017_*")[0])[1])
    junk = tmp_path / "junk.txt"
    junk.write_text("hello world\n")
    spec = spec.format(a30=TOPOLOGY_DIR / "a30x4.txt", missing=tmp_path / "nope.txt", p2p=p2p, junk=junk)
    with pytest.raises(GpuSourceError, match=message.replace("(", r"\(")):
        make_source(spec)


def test_it_reads_presets_only_from_its_own_package(monkeypatch):
    read: list[Path] = []
    original = Path.read_text

    def recording_read_text(self, *args, **kwargs):
        read.append(self.resolve())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", recording_read_text)
    for preset in PRESETS:
        SimSource(preset)
    assert read and all(path.parent == TOPOLOGY_DIR.resolve() for path in read)

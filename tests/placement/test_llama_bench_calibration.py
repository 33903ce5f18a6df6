"""llama.cpp decode against public llama-bench tables (tests/data/fixtures/placement/llamabench_*.txt).

Each fixture is one machine's llama-bench run (Llama 3 8B and 70B, Q4_K_M and F16, default layer split over
all its GPUs). Files marked `use: fit` fix LLAMA_CPP_EFFICIENCY and LLAMA_CPP_LAYER_MS; files marked
`use: holdout` (other GPU models and GPU counts) are never fitted on and give the accuracy docs/placement.md
quotes. Run with `-s` to print the held-out table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pytest

from placement import PlacementError, Request, load_cluster, load_model, plan
from placement.calibration import BenchRow, DecodeSample, fit_decode_constants, parse_llama_bench, within
from placement.cluster import GPU
from placement.dtypes import weight_format
from placement.perf import (
    HBM_FAMILIES,
    LLAMA_CPP_EFFICIENCY,
    LLAMA_CPP_LAYER_MS,
    STEP_OVERHEAD_MS,
    Perf,
    bandwidth_efficiency,
)
from placement.weights import weight_bytes
from tests.fixtures import fixture_files, read_fixture

MODELS = {"llama 8B": "Llama-3.1-8B-Instruct", "llama 70B": "Llama-3.1-70B-Instruct"}  # Llama 3 geometry
GENERATED = (512, 4096)  # tg512 and tg4096: decode at ~256 and ~2048 tokens of context
MEMORY_GIB = {"A100": 80, "H100": 80, "L40S": 48}


@dataclass(frozen=True)
class Run:
    file: str
    gpu: str
    count: int
    use: str
    row: BenchRow


@cache
def runs() -> tuple[Run, ...]:
    found = []
    for path in fixture_files("placement", "llamabench_*.txt"):
        header, body = read_fixture(path)
        for row in parse_llama_bench(body):
            if row.test == "tg" and row.tokens in GENERATED:
                found.append(Run(path.name, header["gpu"], int(header["count"]), header["use"], row))
    return tuple(found)


def _memory_mib(gpu: str) -> int:
    return next((gib for key, gib in MEMORY_GIB.items() if key in gpu), 24) * 1024


@cache
def predict(run: Run) -> tuple[Perf, str]:
    gpus = [{"index": i, "name": run.gpu, "memory_total_mib": _memory_mib(run.gpu)} for i in range(run.count)]
    cluster = load_cluster({"nodes": [{"name": "bench", "gpus": gpus}]})
    request = Request(
        backend="llama.cpp",
        dtype=run.row.quant,
        pp=run.count,
        max_model_len=run.row.tokens + 512,
        decode_context=run.row.tokens // 2,
    )
    result = plan(load_model(MODELS[run.row.model]), cluster, request)
    assert result.plans, [p.message for c in result.rejected for p in c.problems]
    best = result.plans[0]
    assert best.perf is not None
    return best.perf, best.layout.gpus[0].model


def ratio(run: Run) -> float:
    """Predicted over measured tokens/s."""
    return predict(run)[0].decode_tok_s / run.row.tok_s


def sample(run: Run) -> DecodeSample:
    perf, gpu_model = predict(run)
    step = perf.step
    efficiency = LLAMA_CPP_EFFICIENCY["hbm" if gpu_model.startswith(HBM_FAMILIES) else "gddr"]
    full = sum(s.hbm_ms for s in step.stages) * efficiency
    fixed = step.handoff_ms + STEP_OVERHEAD_MS["llama.cpp"]
    layers = load_model(MODELS[run.row.model]).num_layers
    return DecodeSample(full, fixed, layers, 1000 / run.row.tok_s)


def test_it_reads_every_llama_bench_fixture() -> None:
    files = {r.file for r in runs()}
    assert len(files) == 16
    assert {r.use for r in runs()} == {"fit", "holdout"}
    first = next(r for r in runs() if r.file == "llamabench_3090.txt")
    assert first.row == BenchRow("llama 8B", "Q4_K_M", 4.58, 8.03, "tg", 512, 115.42)


def test_it_refuses_a_llama_bench_line_of_an_unknown_type() -> None:
    line = "| llama 8B IQ9_Z - Weird | 4.58 GiB | 8.03 B | CUDA | 99 | tg 512 | 115.42 ± 0.41 |"
    with pytest.raises(PlacementError, match="unknown file type 'IQ9_Z - Weird'"):
        parse_llama_bench(line)


def test_it_keeps_the_llama_cpp_constants_at_their_fitted_values() -> None:
    fit = [r for r in runs() if r.use == "fit"]
    groups = {
        kind: [sample(r) for r in fit if predict(r)[1].startswith(HBM_FAMILIES) == (kind == "hbm")]
        for kind in ("hbm", "gddr")
    }
    efficiency, layer_ms = fit_decode_constants(groups)
    assert efficiency["hbm"] == pytest.approx(LLAMA_CPP_EFFICIENCY["hbm"], abs=0.01)
    assert efficiency["gddr"] == pytest.approx(LLAMA_CPP_EFFICIENCY["gddr"], abs=0.01)
    assert layer_ms == pytest.approx(LLAMA_CPP_LAYER_MS, abs=0.005)


def test_it_predicts_held_out_llama_bench_rows_within_1_5x() -> None:
    held = [r for r in runs() if r.use == "holdout"]
    ratios = [ratio(r) for r in held]
    for r, value in zip(held, ratios, strict=True):
        print(f"{r.file:26s} {r.row.model:9s} {r.row.quant:6s} tg{r.row.tokens:<5d} ratio {value:.2f}")
    print(
        f"held out: {len(held)} rows, within 1.5x {within(ratios, 1.5):.0%}, within 2x {within(ratios, 2):.0%}, "
        f"min {min(ratios):.2f}, max {max(ratios):.2f}"
    )
    assert len(held) == 42
    assert within(ratios, 1.5) == 1.0


def test_it_uses_the_gddr_efficiency_for_a_gddr_gpu() -> None:
    run = next(r for r in runs() if r.file == "llamabench_l40s.txt")
    perf, gpu_model = predict(run)
    assert gpu_model == "L40S"
    assert "94% of peak" in " ".join(perf.assumes)
    assert bandwidth_efficiency("vllm", _gpu_of(run)) == 0.60


def _gpu_of(run: Run) -> GPU:
    gpus = [{"index": 0, "name": run.gpu, "memory_total_mib": _memory_mib(run.gpu)}]
    return load_cluster({"nodes": [{"name": "bench", "gpus": gpus}]}).nodes[0].gpus[0]


def test_it_predicts_the_model_size_llama_bench_reports_within_2_percent() -> None:
    sizes = {(r.row.model, r.row.quant): r.row.size_gib for r in runs()}
    assert len(sizes) == 4
    for (model, quant), size_gib in sizes.items():
        planned = weight_bytes(load_model(MODELS[model]), weight_format(quant)).total / 2**30
        print(f"{model} {quant}: weights {planned:.2f} GiB, llama-bench {size_gib} GiB")
        assert planned == pytest.approx(size_gib, rel=0.02)

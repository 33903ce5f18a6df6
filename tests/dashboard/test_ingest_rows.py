"""Sample rows go to the database as plain tuples (a few hundred per INSERT): what is read back must be what was
sent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents import protocol
from dashboard import ingest
from dashboard.models import Gpu, GpuSample, Node

pytestmark = pytest.mark.django_db(transaction=True)  # store_batch closes old connections, as in the server


def samples_message(seq: int, t: float) -> protocol.Samples:
    gpu = {
        "index": 0,
        "util_gpu": 87.5,
        "util_mem": 40,
        "mem_used_mib": 70000,
        "mem_free_mib": 11000,
        "temp_c": 71.25,
        "power_w": 512.5,
        "power_limit_w": 700,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "throttle_reasons": 4,
        "ecc_corrected": 2,
        "ecc_uncorrected": 0,
        "xids": [79],
        "processes": [{"pid": 4242, "name": "vllm", "used_mib": 69000}],
    }
    return protocol.Samples(type="samples", v=1, seq=seq, t=t, gpus=[protocol.GpuReading(**gpu)])


def stored(rows: list[ingest.SampleRow], node: Node, seq: int) -> None:
    async def on_stored(_: int) -> None:
        return None

    ingest.store_batch([ingest.Pending(node.pk, seq, rows, [], on_stored)])


def test_it_covers_every_column_of_the_sample_model():
    columns = {f.attname for f in GpuSample._meta.concrete_fields if not f.primary_key}
    assert set(ingest.SampleRow._fields) == columns


def test_it_stores_every_value_of_a_sample_as_the_model_reads_it():
    node = Node.objects.create(name="rows")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-0", name="NVIDIA H100", memory_total_mib=81559)
    stored(ingest.sample_rows(samples_message(7, 1_700_000_000.25), {0: gpu.pk}), node, 7)
    row = GpuSample.objects.get()
    assert row.t == datetime.fromtimestamp(1_700_000_000.25, tz=UTC) and (row.gpu_id, row.seq) == (gpu.pk, 7)
    assert (row.util_gpu, row.util_mem, row.mem_used_mib, row.mem_free_mib) == (87.5, 40, 70000, 11000)
    assert (row.temp_c, row.power_w, row.power_limit_w, row.sm_clock_mhz, row.mem_clock_mhz) == (
        71.25,
        512.5,
        700,
        1980,
        2619,
    )
    assert (row.throttle_reasons, row.ecc_corrected, row.ecc_uncorrected) == (4, 2, 0)
    assert row.xids == [79] and row.processes == [{"pid": 4242, "name": "vllm", "used_mib": 69000}]
    node.refresh_from_db()
    assert node.last_seq == 7 and node.last_seen is not None


def test_it_skips_a_sample_already_stored_and_keeps_the_rest_of_the_batch():
    node = Node.objects.create(name="rows")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-0", name="NVIDIA H100", memory_total_mib=81559)
    stored(ingest.sample_rows(samples_message(1, 1_700_000_001.0), {0: gpu.pk}), node, 1)
    again = ingest.sample_rows(samples_message(1, 1_700_000_001.0), {0: gpu.pk})
    stored(again + ingest.sample_rows(samples_message(2, 1_700_000_002.0), {0: gpu.pk}), node, 2)
    assert list(GpuSample.objects.values_list("seq", flat=True)) == [1, 2]


def test_it_stores_rows_over_several_inserts_skipping_a_replay_and_refusing_a_taken_time(monkeypatch):
    monkeypatch.setattr(ingest, "rows_per_insert", lambda: 3)
    node = Node.objects.create(name="chunks")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-0", name="NVIDIA H100", memory_total_mib=81559)
    rows = [ingest.sample_rows(samples_message(s, 1_700_000_000.0 + s), {0: gpu.pk})[0] for s in range(1, 8)]
    ingest.insert_samples(rows[:5])
    ingest.insert_samples(rows)  # 1-5 again (replays, skipped), 6-7 new: three statements
    assert sorted(GpuSample.objects.values_list("seq", flat=True)) == [1, 2, 3, 4, 5, 6, 7]
    taken = rows[6]._replace(seq=99)  # another sample at seq 7's time
    with pytest.raises(ingest.SampleTimeTaken, match="already has a sample"):
        ingest.insert_samples([*rows[:2], taken])

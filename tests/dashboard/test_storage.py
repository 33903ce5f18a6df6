"""Tiered sample storage: raw rows rolled up into minute and hour buckets, retention in bounded batches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError

from dashboard import storage
from dashboard.models import Gpu, GpuHour, GpuMinute, GpuSample, Node, RollupRun

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


@pytest.fixture
def gpu() -> Gpu:
    node = Node.objects.create(name="a30-seed")
    return Gpu.objects.create(node=node, index=0, uuid="GPU-0", name="NVIDIA A30", memory_total_mib=24576)


def add_sample(gpu: Gpu, t: datetime, util: float, power: float = 100.0) -> GpuSample:
    return GpuSample.objects.create(
        gpu=gpu,
        t=t,
        seq=int(t.timestamp()),
        util_gpu=util,
        util_mem=util / 2,
        mem_used_mib=1000 + util,
        mem_free_mib=20000,
        temp_c=40,
        power_w=power,
    )


@pytest.fixture(params=["by_gpu", "by_id"])
def strategy(request, monkeypatch) -> str:
    """Raw retention's two ways, on either database: SQLite's sweeps GPU by GPU, PostgreSQL's deletes by id."""
    monkeypatch.setattr(storage, "sweeps_by_gpu", lambda: request.param == "by_gpu")
    return request.param


def past_the_sweep(run_t: datetime) -> datetime:
    """A retention cutoff at which a run at `run_t` is expired, also by a sweep's slack."""
    return run_t + timedelta(seconds=storage.RAW_SWEEP_S + 1)


def roll_twice(now: datetime) -> None:
    """The first run only notes the newest id; the second folds up to it."""
    storage.roll_up(now)
    storage.roll_up(now + timedelta(seconds=30))


def test_it_rolls_raw_samples_into_minute_and_hour_buckets(gpu):
    for second, util in ((0, 10), (20, 30), (40, 50), (70, 90)):
        add_sample(gpu, T0 + timedelta(seconds=second), util, power=100 + second)
    roll_twice(T0 + timedelta(minutes=2))
    first, second = GpuMinute.objects.filter(gpu=gpu).order_by("start")
    assert (first.start, first.n, first.util_gpu_min, first.util_gpu_avg, first.util_gpu_max) == (
        int(T0.timestamp()),
        3,
        10,
        30,
        50,
    )
    assert (first.power_w_min, first.power_w_max, second.n, second.util_gpu_avg) == (100, 140, 1, 90)
    hour = GpuHour.objects.get(gpu=gpu)
    assert (hour.start, hour.n, hour.util_gpu_avg, hour.util_gpu_max) == (int(T0.timestamp()), 4, 45, 90)


def test_it_merges_a_sample_that_arrives_after_its_minute_was_rolled_up(gpu):
    add_sample(gpu, T0, 10)
    roll_twice(T0 + timedelta(minutes=1))
    add_sample(gpu, T0 + timedelta(seconds=5), 40)  # replayed late by an agent that buffered it
    roll_twice(T0 + timedelta(minutes=2))
    minute = GpuMinute.objects.get(gpu=gpu)
    assert (minute.n, minute.util_gpu_min, minute.util_gpu_avg, minute.util_gpu_max) == (2, 10, 25, 40)
    assert GpuHour.objects.get(gpu=gpu).n == 2


def test_it_folds_each_raw_row_once_however_often_it_runs(gpu):
    add_sample(gpu, T0, 10)
    for k in range(5):
        storage.roll_up(T0 + timedelta(seconds=30 * k))
    assert GpuMinute.objects.get(gpu=gpu).n == 1 and GpuHour.objects.get(gpu=gpu).n == 1


def test_it_folds_only_ids_the_previous_run_saw(gpu):
    storage.roll_up(T0)
    add_sample(gpu, T0, 10)  # stored after the first run looked: the second run must not take it yet
    storage.roll_up(T0 + timedelta(seconds=30))
    assert not GpuMinute.objects.exists()
    storage.roll_up(T0 + timedelta(seconds=60))
    assert GpuMinute.objects.get(gpu=gpu).n == 1


def test_it_deletes_raw_rows_past_the_window_in_batches_once_rolled_up(gpu, monkeypatch, strategy):
    monkeypatch.setattr(storage, "DELETE_BATCH", 7)
    old = [add_sample(gpu, T0 + timedelta(seconds=s), 1) for s in range(25)]
    roll_twice(T0)
    young = add_sample(gpu, T0 + timedelta(minutes=90), 2)  # arrived after the runs that saw the old rows
    assert storage.prune_raw(past_the_sweep(T0 + timedelta(seconds=30))) == len(old)
    assert list(GpuSample.objects.values_list("pk", flat=True)) == [young.pk]
    assert GpuMinute.objects.get(gpu=gpu).n == 25  # the rollups keep what the raw rows said


def test_it_keeps_raw_rows_that_are_not_rolled_up_yet(gpu, strategy):
    storage.roll_up(T0)  # saw nothing
    add_sample(gpu, T0, 1)
    storage.roll_up(T0 + timedelta(seconds=30))  # saw the row, folded nothing yet
    assert storage.prune_raw(T0 + timedelta(hours=5)) == 0
    assert GpuSample.objects.count() == 1


def test_it_sweeps_raw_rows_only_once_the_oldest_are_past_the_sweep_slack(gpu, strategy):
    rows = [add_sample(gpu, T0 + timedelta(seconds=s), 1) for s in range(10)]
    roll_twice(T0)  # the run at T0 saw every row, the one at T0 + 30 s rolled them up
    early = past_the_sweep(T0) - timedelta(seconds=2)
    assert storage.prune_raw(early) == (0 if strategy == "by_gpu" else len(rows))
    assert storage.prune_raw(past_the_sweep(T0)) == (len(rows) if strategy == "by_gpu" else 0)
    assert not GpuSample.objects.exists()


def test_it_sweeps_a_few_gpus_per_transaction(gpu, monkeypatch, strategy):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(storage, "DELETE_BATCH", 20)
    monkeypatch.setattr(storage, "SWEEP_BATCH", 20)
    gaps = []
    monkeypatch.setattr(storage, "let_writers_in", lambda: gaps.append(1))
    gpus = [gpu] + [
        Gpu.objects.create(node=gpu.node, index=i, uuid=f"GPU-{i}", name="A30", memory_total_mib=1)
        for i in (1, 2, 3)
    ]
    for s in range(10):  # in time order, as the ingest stores them
        for g in gpus:
            add_sample(g, T0 + timedelta(seconds=s), 1)
    roll_twice(T0)
    with CaptureQueriesContext(connection) as queries:
        run = storage.StorageRun()
        assert storage.prune_raw(past_the_sweep(T0 + timedelta(seconds=30)), run) == 40
    deletes = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('DELETE FROM "dashboard_gpusample')
    ]
    assert len(deletes) == 2 and len(gaps) == 1  # 20 rows a transaction: 2 GPUs' or 20 ids' worth
    if strategy == "by_gpu":
        assert all('gpu_id" IN (' in sql for sql in deletes)


def test_it_keeps_a_late_replay_until_a_run_that_saw_it_is_expired(gpu, strategy):
    add_sample(gpu, T0, 1)
    roll_twice(T0)
    late = add_sample(gpu, T0 + timedelta(seconds=5), 2)  # replayed after the runs: as old, but newer
    storage.roll_up(T0 + timedelta(seconds=60))  # saw it
    assert storage.prune_raw(past_the_sweep(T0 + timedelta(seconds=30))) == 1
    assert list(GpuSample.objects.values_list("pk", flat=True)) == [late.pk]
    storage.roll_up(T0 + timedelta(seconds=90))  # rolled it up
    assert storage.prune_raw(past_the_sweep(T0 + timedelta(seconds=90))) == 1
    assert GpuMinute.objects.get(gpu=gpu).n == 2


def test_it_sweeps_no_more_often_for_a_row_timed_ahead_of_its_cutoff(gpu, monkeypatch):
    monkeypatch.setattr(storage, "sweeps_by_gpu", lambda: True)
    add_sample(gpu, T0 + timedelta(hours=12), 2)  # an agent's clock ahead: left until its time is past
    add_sample(gpu, T0, 1)
    roll_twice(T0)
    assert storage.prune_raw(past_the_sweep(T0)) == 1
    sweeps = []
    sweep = storage._sweep_by_gpu
    monkeypatch.setattr(storage, "_sweep_by_gpu", lambda *args: sweeps.append(args) or sweep(*args))
    storage.roll_up(T0 + timedelta(seconds=60))
    assert storage.prune_raw(past_the_sweep(T0) + timedelta(seconds=30)) == 0
    assert sweeps == [] and GpuSample.objects.count() == 1


def test_it_deletes_expired_minute_and_hour_buckets_only(gpu, settings):
    settings.MINUTE_RETENTION_DAYS, settings.HOUR_RETENTION_DAYS = 7, 90
    add_sample(gpu, T0, 1)
    add_sample(gpu, T0 - timedelta(days=8), 2)
    add_sample(gpu, T0 - timedelta(days=91), 3)
    roll_twice(T0)
    run = storage.maintain(T0)
    assert (run.deleted_minutes, run.deleted_hours) == (2, 1)
    assert sorted(GpuMinute.objects.values_list("util_gpu_avg", flat=True)) == [1]
    assert sorted(GpuHour.objects.values_list("util_gpu_avg", flat=True)) == [1, 2]


def test_it_forgets_runs_older_than_the_newest_expired_one(gpu, strategy):
    add_sample(gpu, T0, 1)
    for hours in (0, 1, 2, 3):
        storage.roll_up(T0 + timedelta(hours=hours))
    storage.prune_raw(T0 + timedelta(hours=2, minutes=30))
    assert sorted(RollupRun.objects.values_list("t", flat=True)) == [
        T0 + timedelta(hours=2),
        T0 + timedelta(hours=3),
    ]


def test_it_folds_again_after_a_pass_that_failed_halfway(gpu, monkeypatch):
    add_sample(gpu, T0, 1)
    storage.roll_up(T0)
    real_sql = storage._fold_sql
    monkeypatch.setattr(
        storage, "_fold_sql", lambda tier: real_sql(tier) + (" broken" if tier is GpuHour else "")
    )
    with pytest.raises(DatabaseError):
        storage.roll_up(T0 + timedelta(seconds=30))
    assert not GpuMinute.objects.exists()  # the pass's transaction rolled back, its scratch table with it
    monkeypatch.setattr(storage, "_fold_sql", real_sql)
    storage.roll_up(T0 + timedelta(seconds=60))
    assert (GpuMinute.objects.get().n, GpuHour.objects.get().n) == (1, 1)


def test_it_rolls_a_long_backlog_in_several_short_transactions(gpu, monkeypatch):
    """A backlog (after downtime, or a pass that fell behind) goes in chunks, each its own transaction, with
    no transaction open between two of them: on SQLite the ingest flushes get the write lock in the gaps.
    Each chunk reads its raw rows before its transaction, which only merges."""
    monkeypatch.setattr(storage, "ROLL_CHUNK_IDS", 5)
    from django.db import connection

    depth, gaps, reads = len(connection.atomic_blocks), [], []
    monkeypatch.setattr(storage, "let_writers_in", lambda: gaps.append(len(connection.atomic_blocks)))
    buckets_sql = storage._buckets_sql
    monkeypatch.setattr(
        storage, "_buckets_sql", lambda: reads.append(len(connection.atomic_blocks)) or buckets_sql()
    )
    rows = [add_sample(gpu, T0 + timedelta(seconds=s), s) for s in range(23)]
    storage.roll_up(T0)
    storage.roll_up(T0 + timedelta(seconds=30))
    first = rows[0].pk - 1
    rolled = sorted(RollupRun.objects.filter(rolled_id__gt=0).values_list("rolled_id", flat=True))
    assert [r - first for r in rolled] == [5, 10, 15, 20, 23]  # one run per chunk, from the first row's id
    assert gaps == [depth] * 4  # a gap between each two chunks, outside any transaction of the pass
    assert (
        reads == [depth] * 6
    )  # each chunk's raw rows read before its write transaction (and the first run's)
    minute = GpuMinute.objects.get(gpu=gpu)
    assert (minute.n, minute.util_gpu_min, minute.util_gpu_avg, minute.util_gpu_max) == (23, 0, 11, 22)

"""Tiered sample storage: raw samples for a short window, minute and hour rollups for the long charts.

At 1,000 nodes x 8 GPUs at 1 s, keeping every raw sample a day is 691 million rows. So raw rows live
SAMPLE_RETENTION_HOURS (default 1: the 15-minute live charts and hang evidence), and `roll_up` folds them,
each raw row read once, into min/avg/max per GPU per minute (kept MINUTE_RETENTION_DAYS) and per hour (kept
HOUR_RETENTION_DAYS). It works by sample id, not by time: a sample an agent replays late (it buffered while
the server was away) is merged into its minute and hour when it arrives, not lost from them.

Retention deletes in bounded batches (one short transaction each), raw rows only once they are rolled up.
On PostgreSQL raw rows go every pass, by id range. On SQLite they go in a sweep every RAW_SWEEP_S (the raw
window plus up to RAW_SWEEP_S and a pass is held), a few GPUs per transaction through the (gpu, t) index:
SQLite deletes each row's index entry with it, and deleting 30 s of rows by id range every pass rewrote
every GPU's index page in every transaction (at 8,000 GPUs: 8.6 % of a core in CPU, with the sweeps 4.2 %;
bench/README.md, "Storage").
A deployment's metric intervals (DeploymentMetric, one per scrape) are kept METRIC_RETENTION_DAYS; their
hourly averages (dashboard/metric_hours.py, run by the same beat task) HOUR_RETENTION_DAYS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max

from dashboard.models import DeploymentMetric, Gpu, GpuHour, GpuMinute, GpuSample, RollupRun
from dashboard.models.fleet import ROLLUP_METRICS, GpuRollup

# Raw ids folded per chunk (~1 min of samples at 1,000 x 8: a pass every 30 s is one chunk). On SQLite every
# write transaction holds the one write lock, and the ingest flushes wait for it: a pass of 390,000 ids in one
# transaction took up to 21.5 s under load (bench/README.md, "Full stack"). So a chunk reads and groups its raw
# rows before its write transaction, which only merges the buckets: a few per GPU, however many ids. Smaller
# chunks would not make it much shorter, and each would merge into every GPU's buckets again (chunks of 20,000
# and 50,000 ids made a pass at 1,000 x 8 cost 3-5x; 200,000, a pass in two chunks, 2-3x: bench/README.md).
ROLL_CHUNK_IDS = 500_000
DELETE_BATCH = 20_000  # raw ids deleted per transaction where retention goes by id (PostgreSQL)
# SQLite: raw rows are swept once the oldest are this far past the raw window (rows up to 1 h + 5.5 min are
# held, ~44 KB more per GPU), so that each sweep empties every GPU's oldest (gpu, t) index pages whole instead
# of taking ~30 entries from each GPU's page every pass (bench/README.md, "Storage").
RAW_SWEEP_S = 300
# SQLite: raw rows per transaction of a sweep. Deleting through the (gpu, t) index costs ~2.5-3 us of CPU a row
# at 8,000 GPUs; with 60,000 rows a transaction held the write lock up to 0.4 s, and with 20,000 a sweep at
# 8,000 GPUs spent 16 s in the gaps between its transactions (bench/README.md, "Storage").
SWEEP_BATCH = 40_000
# SQLite: the pause after each such transaction. A writer waiting for the lock (busy timeout) polls it at most
# 100 ms apart, so a shorter gap could be missed and the pass would keep the lock to itself.
SQLITE_GAP_S = 0.12
GPU_BATCH = 500  # GPUs whose expired rollups are deleted per statement
METRIC_BATCH = 20_000  # deployment metric rows deleted per transaction
TIERS = (GpuMinute, GpuHour)  # finest first: each is folded from the first one's buckets
# SQLite's page cache for a maintenance pass (KiB). A pass touches a few thousand pages spread over every
# GPU's part of the raw index and the tiers; SQLite's default cache (2 MiB) re-read them from the OS.
SQLITE_CACHE_KIB = 64 * 1024


@dataclass
class StorageRun:
    rolled: int = 0  # raw ids folded into the tiers
    deleted_raw: int = 0
    deleted_minutes: int = 0
    deleted_hours: int = 0
    deleted_metrics: int = 0
    longest_write_ms: int = 0  # the longest write transaction of the rollup and raw retention (SQLite's lock)


@contextmanager
def write_transaction(run: StorageRun | None) -> Iterator[None]:
    """A transaction of the pass; the run notes how long it held it (from its start to its commit)."""
    with transaction.atomic():
        began = time.monotonic()
        yield
    if run is not None:
        run.longest_write_ms = max(run.longest_write_ms, round((time.monotonic() - began) * 1000))


def maintain(now: datetime) -> StorageRun:
    """One periodic pass: roll up what the previous pass saw, then apply every tier's retention."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
    run = StorageRun()
    run.rolled = roll_up(now, run)
    run.deleted_raw = prune_raw(now - timedelta(hours=settings.SAMPLE_RETENTION_HOURS), run)
    run.deleted_minutes = prune_tier(GpuMinute, now - timedelta(days=settings.MINUTE_RETENTION_DAYS))
    run.deleted_hours = prune_tier(GpuHour, now - timedelta(days=settings.HOUR_RETENTION_DAYS))
    run.deleted_metrics = prune_metrics(now - timedelta(days=settings.METRIC_RETENTION_DAYS))
    return run


def roll_up(now: datetime, run: StorageRun | None = None) -> int:
    """Fold raw rows with ids up to the previous run's `seen_id` into both tiers; return how many ids.

    Not up to the newest id: on PostgreSQL an ingest transaction takes its ids before it commits, so a
    higher id can be visible while a lower one is not yet. One run later (tens of seconds) it has committed.
    """
    seen = GpuSample.objects.aggregate(top=Max("pk"))["top"] or 0
    last = RollupRun.objects.first()
    start, end = (last.rolled_id, last.seen_id) if last else (0, 0)
    low = start
    while True:
        low = _skip_missing_ids(low, end)
        high = min(low + ROLL_CHUNK_IDS, end)
        fold(low, high, RollupRun(t=now, seen_id=seen, rolled_id=high).save, run)
        if high == end:
            return end - start
        low = high
        let_writers_in()


def _skip_missing_ids(low: int, end: int) -> int:
    """Where the next chunk starts: just below the first raw id after `low`, so that a range of ids with no
    rows (the first run, ids that a sequence skipped) costs no chunks; `end` if none is left."""
    ids = GpuSample.objects.filter(pk__gt=low, pk__lte=end).order_by("pk").values_list("pk", flat=True)
    first = ids.first()
    return end if first is None else first - 1


def let_writers_in() -> None:
    """Between two of a pass's write transactions on SQLite: leave the write lock free long enough for the
    ingest flushes that wait for it (PostgreSQL locks rows, and inserting samples does not wait for a pass)."""
    if connection.vendor == "sqlite":
        time.sleep(SQLITE_GAP_S)


FOLD_TABLE = "rollup_fold"


def fold(low: int, high: int, commit: Callable[[], object], run: StorageRun | None = None) -> None:
    """Fold the raw rows with ids in (low, high] into every tier and `commit` (the run's record) in one write
    transaction. The rows are read once, before it: their buckets of the first tier go into a temporary
    table (on SQLite a write to the connection's own temporary database, which takes no lock on the main
    one), which gives that tier and, grouped coarser, the others."""
    with connection.cursor() as cursor:
        cursor.execute(_buckets_sql(), [low, high])
        try:
            with write_transaction(run):
                for tier in TIERS:
                    cursor.execute(_fold_sql(tier))
                commit()
        finally:
            cursor.execute(f"DROP TABLE {connection.ops.quote_name(FOLD_TABLE)}")


def _buckets_sql() -> str:
    """A temporary table of the raw rows' buckets of the finest tier: per GPU and bucket, n and each
    metric's min, avg and max."""
    q = connection.ops.quote_name
    select = ", ".join(f"{fn}({q(m)}) AS {m}_{stat}" for m in ROLLUP_METRICS for fn, stat in STATS)
    return (
        f"CREATE TEMPORARY TABLE {q(FOLD_TABLE)} AS "
        f"SELECT gpu_id, {bucket_sql(TIERS[0].SECONDS)} AS b, COUNT(*) AS n, {select} "
        f"FROM {q(GpuSample._meta.db_table)} WHERE id > %s AND id <= %s GROUP BY gpu_id, b"
    )


STATS = (("MIN", "min"), ("AVG", "avg"), ("MAX", "max"))


def _fold_sql(tier: type[GpuRollup]) -> str:
    """INSERT the tier's buckets from the finest ones, merging into a bucket already there (a late sample)."""
    q = connection.ops.quote_name
    table = q(tier._meta.db_table)
    stats = [f"{m}_{s}" for m in ROLLUP_METRICS for _, s in STATS]
    select = ", ".join(f"MIN({m}_min), SUM({m}_avg * n) / SUM(n), MAX({m}_max)" for m in ROLLUP_METRICS)
    bucket = f"b / {tier.SECONDS} * {tier.SECONDS}"
    return (
        f"INSERT INTO {table} (gpu_id, start, n, {', '.join(stats)}) "
        f"SELECT gpu_id, {bucket} AS tb, SUM(n), {select} FROM {q(FOLD_TABLE)} GROUP BY gpu_id, tb "
        f"ON CONFLICT (gpu_id, start) DO UPDATE SET {_merge_sql(table)}"
    )


def _merge_sql(table: str) -> str:
    least, greatest = ("LEAST", "GREATEST") if connection.vendor == "postgresql" else ("MIN", "MAX")
    merged = []
    for m in ROLLUP_METRICS:
        merged.append(f"{m}_min = {least}({table}.{m}_min, excluded.{m}_min)")
        merged.append(f"{m}_max = {greatest}({table}.{m}_max, excluded.{m}_max)")
        merged.append(
            f"{m}_avg = ({table}.{m}_avg * {table}.n + excluded.{m}_avg * excluded.n) / ({table}.n + excluded.n)"
        )
    return ", ".join([*merged, f"n = {table}.n + excluded.n"])


def tier_for(minutes: float) -> type[GpuRollup] | None:
    """The tier a chart of the last `minutes` reads: None for raw samples (within the raw window), the
    minute tier up to a day (1,440 points), else the hour tier (a week: 168 points, 90 days: 2,160)."""
    if minutes <= settings.SAMPLE_RETENTION_HOURS * 60:
        return None
    return GpuMinute if minutes <= 24 * 60 else GpuHour


def bucket_sql(seconds: int, column: str = "t") -> str:
    """SQL for the unix second at the start of the `seconds`-long bucket a time column falls in."""
    if connection.vendor == "postgresql":
        return f"(FLOOR(EXTRACT(EPOCH FROM {column}) / {seconds}) * {seconds})::integer"
    return f"(CAST(strftime('%%s', {column}) AS INTEGER) / {seconds} * {seconds})"


def prune_raw(cutoff: datetime, run: StorageRun | None = None) -> int:
    """Delete raw rows stored before `cutoff` that are rolled up, in short transactions.

    By arrival (sample id), not only by time: a row goes once a run that saw it is older than `cutoff` and
    it is rolled up, so it is kept at least the raw window after it arrived. On SQLite that takes a sweep
    every RAW_SWEEP_S, GPU by GPU (`_sweep_by_gpu`); on PostgreSQL, every pass, by id (`_delete_by_id`)."""
    expired, latest = RollupRun.objects.filter(t__lt=cutoff).first(), RollupRun.objects.first()
    if expired is None or latest is None:
        return 0
    upto = min(expired.seen_id, latest.rolled_id)
    if sweeps_by_gpu():
        first = _sweep_due(cutoff, latest)
        if first is None:
            return 0
        deleted = _sweep_by_gpu(cutoff, first, upto, run)
    else:
        deleted = _delete_by_id(upto, run)
    RollupRun.objects.filter(t__lt=expired.t).delete()  # the newest expired run is all the next pass needs
    return deleted


def sweeps_by_gpu() -> bool:
    """Whether raw retention sweeps GPU by GPU every RAW_SWEEP_S (SQLite) or deletes by id every pass."""
    return connection.vendor == "sqlite"


def _sweep_due(cutoff: datetime, latest: RollupRun) -> int | None:
    """SQLite: the id of the first row to go if a sweep is due, that is if rows stored (and rolled up) more
    than RAW_SWEEP_S before `cutoff` are left. Runs are kept from one sweep to the next for this. By the
    primary key: a row left by the last sweep (timed after its cutoff) is passed over, not a reason."""
    edge = RollupRun.objects.filter(t__lt=cutoff - timedelta(seconds=RAW_SWEEP_S)).first()
    if edge is None:
        return None
    left = GpuSample.objects.filter(pk__lte=min(edge.seen_id, latest.rolled_id), t__lt=cutoff)
    return left.order_by("pk").values_list("pk", flat=True).first()


def _sweep_by_gpu(cutoff: datetime, first: int, upto: int, run: StorageRun | None) -> int:
    """SQLite: delete the expired rows of a few GPUs per transaction (about SWEEP_BATCH rows), through the
    (gpu, t) index. SQLite deletes a row's index entry with it, and each GPU's entries are together in that
    index: a sweep empties its GPUs' index pages whole and writes each page once. Deleting by id range
    instead (time order, every GPU in each transaction) rewrote every GPU's index page in every transaction.
    `t < cutoff` bounds each GPU's index range; a row with a later time (an agent's clock ahead) goes in
    a later sweep. The rows to go are about the ids from `first` to `upto`."""
    gpu_ids = list(Gpu.objects.order_by("pk").values_list("pk", flat=True))
    per_batch = max(1, SWEEP_BATCH * len(gpu_ids) // max(1, upto - first + 1))
    deleted = 0
    for i in range(0, len(gpu_ids), per_batch):
        if i:
            let_writers_in()
        with write_transaction(run):
            rows = GpuSample.objects.filter(gpu_id__in=gpu_ids[i : i + per_batch], t__lt=cutoff, pk__lte=upto)
            deleted += rows.delete()[0]
    return deleted


def _delete_by_id(upto: int, run: StorageRun | None) -> int:
    """PostgreSQL: delete raw rows with ids up to `upto`, DELETE_BATCH ids per transaction. Ids grow with
    arrival, so this walks the primary key; PostgreSQL marks the rows deleted in the table and leaves the
    index entries to vacuum, so the (gpu, t) index's layout does not matter here."""
    first = GpuSample.objects.order_by("pk").values_list("pk", flat=True).first()
    if first is None:
        return 0
    deleted = 0
    for low in range(first - 1, upto, DELETE_BATCH):
        if low > first - 1:
            let_writers_in()
        with write_transaction(run):
            deleted += GpuSample.objects.filter(pk__gt=low, pk__lte=min(low + DELETE_BATCH, upto)).delete()[0]
    return deleted


def prune_tier(tier: type[GpuRollup], cutoff: datetime) -> int:
    """Delete a tier's buckets older than `cutoff`, GPU_BATCH GPUs per statement (their primary key range)."""
    gpu_ids = list(Gpu.objects.order_by("pk").values_list("pk", flat=True))
    deleted, before = 0, int(cutoff.timestamp())
    for i in range(0, len(gpu_ids), GPU_BATCH):
        with transaction.atomic():
            rows = tier.objects.filter(gpu_id__in=gpu_ids[i : i + GPU_BATCH], start__lt=before)
            deleted += rows.delete()[0]
    return deleted


def prune_metrics(cutoff: datetime) -> int:
    """Delete deployment metric rows older than `cutoff`, oldest first, about METRIC_BATCH per transaction
    (by time: the rows at the batch's last time go with it)."""
    deleted = 0
    while True:
        with transaction.atomic():
            expired = DeploymentMetric.objects.filter(t__lt=cutoff)
            edge = expired.order_by("t").values_list("t", flat=True)[METRIC_BATCH - 1 : METRIC_BATCH].first()
            batch = expired if edge is None else expired.filter(t__lte=edge)
            deleted += batch.delete()[0]
        if edge is None:
            return deleted

"""Tiered sample storage at the default retention (issue #13, item 1): bytes per sample and per GPU, chart times.

    .venv/bin/python bench/storage.py [--gpus 800] [--json]
    .venv/bin/python bench/storage.py --raw-hour --gpus 8000 --json     # the size after one hour at 1,000 x 8
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME .venv/bin/python bench/storage.py --gpus 800 --json

Fills a fresh database (a scratch SQLite file unless DATABASE_URL names an empty PostgreSQL database) with
the default retention's worth of generated data for that many GPUs (8 per node): raw samples for
SAMPLE_RETENTION_HOURS at 1 s, minute buckets for MINUTE_RETENTION_DAYS and hour buckets for
HOUR_RETENTION_DAYS. Values are shaped like NVML's (whole-percent utilization and temperature, memory in MiB
from bytes, power in milliwatts / 1000). Then it vacuums and measures each table with its indexes (SQLite:
dbstat; PostgreSQL: pg_total_relation_size) and the whole database, and times one node's 24 h and 7 d charts
(8 GPUs) through `fleet.gpu_history`, the function the pages call, encoded as the page embeds it.

The raw tier is filled for as long as the database holds it at most (`raw_seconds_held`: on SQLite the
raw window plus the sweep's slack and a pass, dashboard/storage.py), so the sizes are the peak.
`maintain_ms` / `maintain_cpu_ms`: the wall and CPU time of `storage.maintain` passes (roll up, then
retention of every tier; CPU: this process's and, on PostgreSQL, its server process's) in steady state
at this fleet's sample rate (GPUs x 1/s, STORAGE_EVERY_S apart),
over whole raw sweep cycles (`steady_window`); `maintain_core_share_at_8000_per_s` is their CPU time over the
time they cover, scaled linearly to 8,000 samples/s (1,000 nodes x 8 GPUs), as a fraction of one core. That scaling
is an estimate: bench/storage_steady.py measures the same at 8,000 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GPUS_PER_NODE = 8
RAW_HOUR_S = 3600


def setup(scratch: str) -> None:
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{scratch}/bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from dashboard.models import Node

    if Node.objects.exists():
        sys.exit("bench/storage.py needs an empty database: DATABASE_URL already has nodes in it")


def make_fleet(gpus: int) -> list[int]:
    from dashboard.models import Gpu, Node

    nodes = Node.objects.bulk_create(
        Node(name=f"bench-{i:04d}", interval_s=1.0)
        for i in range((gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE)
    )
    rows = [
        Gpu(node=node, index=i, uuid=f"GPU-{node.pk}-{i}", name="NVIDIA H100", memory_total_mib=81559)
        for node in nodes
        for i in range(GPUS_PER_NODE)
    ][:gpus]
    return [g.pk for g in Gpu.objects.bulk_create(rows, batch_size=1000)]


class Sql:
    """The few expressions that differ between SQLite and PostgreSQL."""

    def __init__(self, vendor: str) -> None:
        self.pg = vendor == "postgresql"

    def series(self, count: int) -> str:
        if self.pg:
            return f"(SELECT generate_series(0, {count - 1}) AS k) s"
        return f"(WITH RECURSIVE s(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM s WHERE k < {count - 1}) SELECT k FROM s) s"

    def whole(self, high: int) -> str:
        """A random whole number 0..high-1, stored as a float."""
        return f"floor(random() * {high})" if self.pg else f"(abs(random()) % {high}) * 1.0"

    def fraction(self, high: int) -> str:
        """A random number 0..high with NVML's 3 decimals (milliwatts, bytes in MiB)."""
        return (
            f"round((random() * {high})::numeric, 3)::float"
            if self.pg
            else f"(abs(random()) % {high * 1000}) / 1000.0"
        )

    def time(self, base: int) -> str:
        if self.pg:
            return f"to_timestamp({base} + s.k + 0.417)"
        return f"strftime('%Y-%m-%d %H:%M:%f', {base} + s.k, 'unixepoch') || '417'"

    def gpu_ids(self, low: int, high: int) -> str:
        return f"(SELECT id FROM dashboard_gpu WHERE id BETWEEN {low} AND {high}) g"


def fill_raw(sql: Sql, gpu_ids: list[int], seconds: int, base: int) -> int:
    from django.db import connection

    columns = "gpu_id, t, seq, util_gpu, util_mem, mem_used_mib, mem_free_mib, temp_c, power_w, power_limit_w, sm_clock_mhz, mem_clock_mhz, throttle_reasons, ecc_corrected, ecc_uncorrected, xids, processes"
    values = (
        f"g.id, {sql.time(base)}, s.k + 1, {sql.whole(101)}, {sql.whole(60)}, {sql.fraction(80000)}, "
        f"{sql.fraction(80000)}, 30 + {sql.whole(50)}, {sql.fraction(700)}, 700.0, 1980.0, 2619.0, 0, 0, 0, '[]', '[]'"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO dashboard_gpusample ({columns}) SELECT {values} "
            f"FROM {sql.series(seconds)} CROSS JOIN {sql.gpu_ids(gpu_ids[0], gpu_ids[-1])} ORDER BY s.k, g.id"
        )
    return seconds * len(gpu_ids)


def fill_tier(sql: Sql, table: str, step: int, count: int, base: int, gpu_ids: list[int]) -> int:
    from django.db import connection

    from dashboard.models.fleet import ROLLUP_METRICS

    stats, values = [], []
    for metric, high in zip(ROLLUP_METRICS, (101, 60, 80000, 80, 700), strict=True):
        low_value = sql.fraction(high) if high > 100 else sql.whole(high)
        stats += [f"{metric}_min", f"{metric}_avg", f"{metric}_max"]
        values += [low_value, sql.fraction(high), f"{high} * 1.0"]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (gpu_id, start, n, {', '.join(stats)}) "
            f"SELECT g.id, {base} + s.k * {step}, {step}, {', '.join(values)} "
            f"FROM {sql.series(count)} CROSS JOIN {sql.gpu_ids(gpu_ids[0], gpu_ids[-1])} WHERE 1 = 1"
        )
    return count * len(gpu_ids)


def table_bytes(tables: list[str]) -> dict[str, int]:
    """Each table with its indexes, after a vacuum, and the whole database under "total"."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("VACUUM ANALYZE")
            sizes = {}
            for table in tables:
                cursor.execute("SELECT pg_total_relation_size(%s)", [table])
                sizes[table] = cursor.fetchone()[0]
            cursor.execute("SELECT pg_database_size(current_database())")
            return {**sizes, "total": cursor.fetchone()[0]}
        cursor.execute("VACUUM")
        cursor.execute(
            "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d JOIN sqlite_master m ON m.name = d.name GROUP BY m.tbl_name"
        )
        sizes = dict(cursor.fetchall())
        cursor.execute("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
        return {**{t: sizes.get(t, 0) for t in tables}, "total": cursor.fetchone()[0]}


def time_chart(minutes: int, runs: int = 5) -> dict:
    from dashboard import browser_json, fleet
    from dashboard.models import Node

    node = Node.objects.order_by("pk").first()
    times, points = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        history = fleet.gpu_history(node, minutes=minutes)
        browser_json.dumps(history)
        times.append((time.perf_counter() - started) * 1000)
        points = sum(len(p) for p in history["gpus"].values())
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "points": points}


def fill_retention(sql: Sql, gpu_ids: list[int], now: datetime, raw_s: int) -> tuple[int, int, int]:
    """`raw_s` of raw samples up to `now`, and each tier for its retention; the rows of each."""
    from django.conf import settings

    end = int(now.timestamp())
    minutes, hours = int(settings.MINUTE_RETENTION_DAYS * 1440), int(settings.HOUR_RETENTION_DAYS * 24)
    return (
        fill_raw(sql, gpu_ids, raw_s, end - raw_s),
        fill_tier(sql, "dashboard_gpuminute", 60, minutes, end // 60 * 60 - minutes * 60, gpu_ids),
        fill_tier(sql, "dashboard_gpuhour", 3600, hours, end // 3600 * 3600 - hours * 3600, gpu_ids),
    )


def held_raw_s() -> int:
    """Seconds of raw samples the database holds at most: the raw window, and on SQLite the sweep's slack
    and one pass more (raw retention sweeps every RAW_SWEEP_S there: dashboard/storage.py)."""
    from django.conf import settings

    from dashboard import storage

    window = int(settings.SAMPLE_RETENTION_HOURS * 3600)
    if getattr(storage, "sweeps_by_gpu", lambda: False)():  # code from before the sweeps deletes every pass
        return window + int(storage.RAW_SWEEP_S + settings.STORAGE_EVERY_S)
    return window


def passes_per_cycle(every: int) -> int:
    """Passes from one raw sweep to the next (1 where raw retention deletes every pass)."""
    from dashboard import storage

    if not getattr(storage, "sweeps_by_gpu", lambda: False)():
        return 1
    return -(-int(storage.RAW_SWEEP_S + every) // every)


def steady_maintain(
    sql: Sql, gpu_ids: list[int], now: datetime, every: int, filled_s: int, runs: int
) -> list[Pass]:
    """Runs as if every `every` s since the filled raw rows began (`filled_s` before `now`), then `runs` more,
    each after `every` s of new samples: the steady cost (fold `every` s of rows; delete as many, on SQLite
    a sweep's worth every few passes). Each pass's wall and CPU seconds."""
    from dashboard import storage
    from dashboard.models import GpuSample, RollupRun

    ids = list(GpuSample.objects.order_by("pk").values_list("pk", flat=True)[:: len(gpu_ids)])
    for k in range(0, filled_s, every):  # the history the filled rows would have left
        top = ids[min(k + every, len(ids) - 1)] + len(gpu_ids) - 1
        RollupRun.objects.create(t=now - timedelta(seconds=filled_s - k), seen_id=top, rolled_id=top)
    passes = []
    for r in range(runs):
        fill_raw(sql, gpu_ids, every, int(now.timestamp()) + r * every)
        wall, cpu = time.perf_counter(), cpu_s()
        result = storage.maintain(now + timedelta(seconds=(r + 1) * every))
        passes.append(Pass(time.perf_counter() - wall, cpu_s() - cpu, result))
    return passes


def cpu_s() -> float:
    """CPU seconds of this process and, on PostgreSQL, of this connection's server process (same machine:
    the statements' work is done there), read from /proc in clock ticks (10 ms)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return time.process_time()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return time.process_time() + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steady_window(passes: list[Pass]) -> list[Pass]:
    """The passes that make whole raw sweep cycles: from the one after the second pass that swept (the
    first one also caught up with the filled history) to the last one that swept, which deletes what the
    passes since the one before added. Where every pass deletes (no sweeps), all passes but the first."""
    sweeps = [i for i, p in enumerate(passes) if p.result.deleted_raw]
    if len(sweeps) == len(passes) or len(sweeps) < 3:
        return passes[1:]
    return passes[sweeps[1] + 1 : sweeps[-1] + 1]


@dataclass
class Pass:
    wall_s: float
    cpu_s: float
    result: object  # storage.StorageRun


def run(gpus: int) -> dict:
    from django.conf import settings
    from django.db import connection

    gpu_ids = make_fleet(gpus)
    sql, now = Sql(connection.vendor), datetime.now(UTC).replace(microsecond=0)
    raw_s = held_raw_s()
    started = time.perf_counter()
    raw, minute_rows, hour_rows = fill_retention(sql, gpu_ids, now, raw_s)
    fill_s = time.perf_counter() - started
    tables = ["dashboard_gpusample", "dashboard_gpuminute", "dashboard_gpuhour"]
    sizes = table_bytes(tables)
    chart_24h, chart_7d = time_chart(1440), time_chart(7 * 1440)
    every = int(settings.STORAGE_EVERY_S)
    cycle = passes_per_cycle(every)
    passes = steady_maintain(sql, gpu_ids, now, every, raw_s, 1 + max(3, 3 * cycle))
    window = steady_window(passes)
    cpu_share = sum(p.cpu_s for p in window) / (len(window) * every)
    return {
        "database": connection.vendor,
        "gpus": gpus,
        "rows": {"raw": raw, "minute": minute_rows, "hour": hour_rows},
        "fill_s": round(fill_s, 1),
        "bytes": sizes,
        "bytes_per_sample_raw": round(sizes["dashboard_gpusample"] / raw, 1),
        "bytes_per_minute_row": round(sizes["dashboard_gpuminute"] / minute_rows, 1),
        "bytes_per_hour_row": round(sizes["dashboard_gpuhour"] / hour_rows, 1),
        "bytes_per_gpu_at_default_retention": round(sizes["total"] / gpus),
        "chart_24h_ms": chart_24h["median_ms"],
        "chart_7d_ms": chart_7d["median_ms"],
        "charts": {"24h": chart_24h, "7d": chart_7d},
        "raw_seconds_held": raw_s,
        "maintain_window_passes": len(window),
        "maintain_ms": [round(p.wall_s * 1000, 1) for p in passes],
        "maintain_cpu_ms": [round(p.cpu_s * 1000, 1) for p in passes],
        "longest_write_ms": max(p.result.longest_write_ms for p in passes),
        # CPU of the passes over the time they cover, scaled linearly to 8,000 samples/s: an estimate, as
        # SQLite's cost is not linear in the GPUs (bench/storage_steady.py measures it at 8,000 GPUs).
        "maintain_core_share_at_8000_per_s": round(cpu_share * 8000 / gpus, 3),
    }


def run_raw_hour(gpus: int) -> dict:
    """One simulated hour of raw samples at 1 s for `gpus` GPUs and nothing else (1,000 x 8: 28.8 million
    rows), inserted a minute at a time in time order as they arrive: the database's size after that hour."""
    from django.db import connection

    gpu_ids = make_fleet(gpus)
    sql, start = Sql(connection.vendor), int(time.time()) - RAW_HOUR_S
    started = time.perf_counter()
    raw = sum(fill_raw(sql, gpu_ids, 60, start + minute * 60) for minute in range(RAW_HOUR_S // 60))
    fill_s = time.perf_counter() - started
    sizes = table_bytes(["dashboard_gpusample"])
    return {
        "database": connection.vendor,
        "gpus": gpus,
        "seconds": RAW_HOUR_S,
        "rows": raw,
        "fill_s": round(fill_s, 1),
        "bytes": sizes,
        "bytes_per_sample_raw": round(sizes["dashboard_gpusample"] / raw, 1),
        "database_bytes_after_one_hour": sizes["total"],
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=800)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--raw-hour",
        action="store_true",
        help="only one hour of raw samples at 1 s: the database's size then",
    )
    args = parser.parse_args()
    if args.gpus < GPUS_PER_NODE:
        parser.error(f"--gpus must be at least {GPUS_PER_NODE} (one node)")
    with tempfile.TemporaryDirectory(prefix="lc-bench-storage-") as scratch:
        setup(scratch)
        result = run_raw_hour(args.gpus) if args.raw_hour else run(args.gpus)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

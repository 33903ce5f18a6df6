"""Tiered sample storage at the default retention (issue #13, item 1): bytes per sample and per GPU, chart times.

    .venv/bin/python bench/storage.py [--gpus 800] [--json]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME .venv/bin/python bench/storage.py --gpus 800 --json

Fills a fresh database (a scratch SQLite file unless DATABASE_URL names an empty PostgreSQL database) with
the default retention's worth of generated data for that many GPUs (8 per node): raw samples for
SAMPLE_RETENTION_HOURS at 1 s, minute buckets for MINUTE_RETENTION_DAYS and hour buckets for
HOUR_RETENTION_DAYS. Values are shaped like NVML's (whole-percent utilization and temperature, memory in MiB
from bytes, power in milliwatts / 1000). Then it vacuums and measures each table with its indexes (SQLite:
dbstat; PostgreSQL: pg_total_relation_size) and the whole database, and times one node's 24 h and 7 d charts
(8 GPUs) through `fleet.gpu_history`, the function the pages call, encoded as the page embeds it.

`maintain_ms`: one `storage.maintain` pass (roll up, then retention of every tier) in steady state at this
fleet's sample rate (GPUs x 1/s, STORAGE_EVERY_S apart); `maintain_core_share_at_8000_per_s` scales it
linearly to 8,000 samples/s (1,000 nodes x 8 GPUs), as a fraction of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GPUS_PER_NODE = 8


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


def steady_maintain(sql: Sql, gpu_ids: list[int], now: datetime, every: float, runs: int = 4) -> list[float]:
    """Runs as if every `every` s since the raw window began, then `runs` more, each after `every` s of
    new samples: the last ones show the steady cost (fold `every` s of rows, delete as many)."""
    from django.conf import settings

    from dashboard import storage
    from dashboard.models import GpuSample, RollupRun

    window = int(settings.SAMPLE_RETENTION_HOURS * 3600)
    ids = list(GpuSample.objects.order_by("pk").values_list("pk", flat=True)[:: len(gpu_ids)])
    for k in range(0, window, int(every)):  # the history the filled hour would have left
        top = ids[min(k + int(every), len(ids) - 1)] + len(gpu_ids) - 1
        RollupRun.objects.create(t=now - timedelta(seconds=window - k), seen_id=top, rolled_id=top)
    elapsed = []
    for r in range(runs):
        fill_raw(sql, gpu_ids, int(every), int(now.timestamp()) + r * int(every))
        started = time.perf_counter()
        storage.maintain(now + timedelta(seconds=(r + 1) * every))
        elapsed.append((time.perf_counter() - started) * 1000)
    return elapsed


def run(gpus: int) -> dict:
    from django.conf import settings
    from django.db import connection

    gpu_ids = make_fleet(gpus)
    sql, now = Sql(connection.vendor), datetime.now(UTC).replace(microsecond=0)
    raw_s = int(settings.SAMPLE_RETENTION_HOURS * 3600)
    minutes, hours = int(settings.MINUTE_RETENTION_DAYS * 1440), int(settings.HOUR_RETENTION_DAYS * 24)
    started = time.perf_counter()
    raw = fill_raw(sql, gpu_ids, raw_s, int(now.timestamp()) - raw_s)
    minute_rows = fill_tier(
        sql, "dashboard_gpuminute", 60, minutes, int(now.timestamp()) // 60 * 60 - minutes * 60, gpu_ids
    )
    hour_rows = fill_tier(
        sql, "dashboard_gpuhour", 3600, hours, int(now.timestamp()) // 3600 * 3600 - hours * 3600, gpu_ids
    )
    fill_s = time.perf_counter() - started
    tables = ["dashboard_gpusample", "dashboard_gpuminute", "dashboard_gpuhour"]
    sizes = table_bytes(tables)
    chart_24h, chart_7d = time_chart(1440), time_chart(7 * 1440)
    maintain = steady_maintain(sql, gpu_ids, now, settings.STORAGE_EVERY_S)
    steady_ms = statistics.median(maintain[1:])
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
        "maintain_ms": [round(m, 1) for m in maintain],
        "maintain_core_share_at_8000_per_s": round(
            steady_ms / 1000 / settings.STORAGE_EVERY_S * 8000 / gpus, 3
        ),
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=800)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.gpus < GPUS_PER_NODE:
        parser.error(f"--gpus must be at least {GPUS_PER_NODE} (one node)")
    with tempfile.TemporaryDirectory(prefix="lc-bench-storage-") as scratch:
        setup(scratch)
        result = run(args.gpus)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

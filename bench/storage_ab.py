"""The maintain pass before and after its SQLite changes, on one database (issue #13 storage, session 5).

    .venv/bin/python bench/storage_ab.py GPUS BLOCKS PASSES_PER_BLOCK      # e.g. 800 6 4

Fills a scratch SQLite database as bench/storage.py does, then runs storage.maintain passes 30 s of samples
apart, in alternating blocks: "before" (each tier folded from the raw rows, SQLite's default 2 MiB cache)
and "after" (the raw rows read once, a 64 MiB cache). Prints each block and the median per pass, scaled to
8,000 samples/s as bench/storage.py scales it."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import storage as bench


def old_fold(low: int, high: int, commit, run=None) -> None:
    """The fold before session 5: each tier from the raw rows (read once per tier), in one write transaction."""
    from django.db import transaction

    with transaction.atomic():
        _old_fold(low, high)
        commit()


def _old_fold(low: int, high: int) -> None:
    from django.db import connection

    from dashboard import storage
    from dashboard.models import GpuSample
    from dashboard.models.fleet import ROLLUP_METRICS

    q = connection.ops.quote_name
    for tier in storage.TIERS:
        table, raw = q(tier._meta.db_table), q(GpuSample._meta.db_table)
        stats = [f"{m}_{s}" for m in ROLLUP_METRICS for s in ("min", "avg", "max")]
        select = ", ".join(f"{fn}({q(m)})" for m in ROLLUP_METRICS for fn in ("MIN", "AVG", "MAX"))
        sql = (
            f"INSERT INTO {table} (gpu_id, start, n, {', '.join(stats)}) "
            f"SELECT gpu_id, {storage.bucket_sql(tier.SECONDS)} AS b, COUNT(*), {select} FROM {raw} "
            f"WHERE id > %s AND id <= %s GROUP BY gpu_id, b "
            f"ON CONFLICT (gpu_id, start) DO UPDATE SET {storage._merge_sql(table)}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [low, high])


def main(gpus: int, blocks: int, per_block: int) -> None:
    bench.setup(tempfile.mkdtemp(prefix="lc_storage_ab_"))
    from django.conf import settings
    from django.db import connection

    from dashboard import storage

    gpu_ids = bench.make_fleet(gpus)
    sql, now = bench.Sql(connection.vendor), datetime.now(UTC).replace(microsecond=0)
    raw_s = int(settings.SAMPLE_RETENTION_HOURS * 3600)
    t0 = time.perf_counter()
    bench.fill_retention(sql, gpu_ids, now, raw_s)
    with connection.cursor() as c:
        c.execute("VACUUM")
    print(f"fill {time.perf_counter() - t0:.1f} s", flush=True)
    every = int(settings.STORAGE_EVERY_S)
    bench.steady_maintain(sql, gpu_ids, now, every, raw_s, runs=1)  # the history, and one pass
    new_fold, new_kib = storage.fold, storage.SQLITE_CACHE_KIB
    times = {"before": [], "after": []}
    r = 1
    for block in range(blocks):
        name = "before" if block % 2 == 0 else "after"
        storage.fold, storage.SQLITE_CACHE_KIB = (old_fold, 2000) if name == "before" else (new_fold, new_kib)
        for _ in range(per_block):
            bench.fill_raw(sql, gpu_ids, every, int(now.timestamp()) + r * every)
            s = time.perf_counter()
            storage.maintain(now + timedelta(seconds=(r + 1) * every))
            times[name].append((time.perf_counter() - s) * 1000)
            r += 1
        print(name, [round(x) for x in times[name][-per_block:]], flush=True)
    for name, ms in times.items():
        med = statistics.median(ms)
        print(
            f"{name}: median {med:.0f} ms, mean {statistics.mean(ms):.0f} ms over {len(ms)} passes; "
            f"scaled to 8,000 samples/s: {med / 1000 / every * 8000 / gpus:.1%} of a core"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))

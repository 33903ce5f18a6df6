"""The steady-state cost of rollup + retention at a fleet's real size: CPU time of many passes over their window.

    .venv/bin/python bench/storage_steady.py [--gpus 8000] [--passes 33] [--raw-minutes 6] [--json]

bench/storage.py times one pass at 800 GPUs and scales it to 8,000 samples/s; that scaling is not linear
on SQLite (a delete transaction of DELETE_BATCH rows covers 25 s of 800 GPUs but 2.5 s of 8,000, and each
rewrites every GPU's index page), and a pass's wall time includes its pauses for the ingest (SQLITE_GAP_S).
This fills a scratch SQLite database (or the empty PostgreSQL database DATABASE_URL names) for GPUS GPUs at
1 sample/s, with the windows shortened so that the fill stays small: raw samples RAW_MINUTES (not 60),
minute buckets 1 h (not 7 d), hour buckets 1 d (not 90 d). A pass's work depends on the GPUs and the
samples per pass, not on how far back each tier reaches. Then it runs PASSES passes STORAGE_EVERY_S of new
samples apart (the samples inserted in time order, as the ingest does; not timed) and reports the
process's CPU time (and, on PostgreSQL, its server process's) in the passes of whole sweep cycles (bench/storage.py's `steady_window`) divided by the
simulated time they cover, as a fraction of one core; the phases' CPU seconds (this process only) are over all passes.

33 passes make 2 whole cycles of SQLite's raw sweeps at the defaults (one every 10-11 passes). LAYERCAKE_CODE=/other/checkout measures that checkout's
`dashboard` package (its storage code) with this benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import storage as bench  # noqa: E402

# The code measured: this checkout's, or another's (LAYERCAKE_CODE=/path/to/checkout) for an A/B run. Also
# the working directory: loading the Celery app puts it first on sys.path.
CODE = os.environ.get("LAYERCAKE_CODE", str(ROOT))
sys.path.insert(0, CODE)
os.chdir(CODE)

PHASES = ("roll_up", "prune_raw", "prune_tier", "prune_metrics")


def shorten_windows(raw_minutes: float) -> None:
    os.environ["SAMPLE_RETENTION_HOURS"] = str(raw_minutes / 60)
    os.environ["MINUTE_RETENTION_DAYS"] = str(1 / 24)
    os.environ["HOUR_RETENTION_DAYS"] = "1"


def fill(gpus: int, now: datetime) -> tuple[bench.Sql, list[int], int]:
    from django.db import connection

    gpu_ids = bench.make_fleet(gpus)
    sql, raw_s = bench.Sql(connection.vendor), bench.held_raw_s()
    bench.fill_retention(sql, gpu_ids, now, raw_s)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return sql, gpu_ids, raw_s


class PhaseClock:
    """CPU seconds of each phase of `storage.maintain`, and the longest write transaction of the phases that
    note theirs (the rollup, raw retention), by wrapping the module's functions it calls."""

    def __init__(self) -> None:
        from dashboard import storage

        self.cpu = {name: 0.0 for name in PHASES}
        self.longest_write_ms = {name: 0 for name in PHASES}
        for name in PHASES:
            setattr(storage, name, self._timed(name, getattr(storage, name)))

    def _timed(self, name, function):
        def timed(*args, **kwargs):
            run = args[1] if name in ("roll_up", "prune_raw") and len(args) > 1 else None  # (time, run)
            before = run.longest_write_ms if run is not None else 0
            if run is not None:
                run.longest_write_ms = 0
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.cpu[name] += time.process_time() - started
                if run is not None:
                    self.longest_write_ms[name] = max(self.longest_write_ms[name], run.longest_write_ms)
                    run.longest_write_ms = max(before, run.longest_write_ms)

        return timed


def run(gpus: int, passes: int) -> dict:
    from django.conf import settings
    from django.db import connection

    from dashboard import storage

    now = datetime.now(UTC).replace(microsecond=0)
    started = time.perf_counter()
    sql, gpu_ids, raw_s = fill(gpus, now)
    fill_s = time.perf_counter() - started
    every = int(settings.STORAGE_EVERY_S)
    clock = PhaseClock()
    done = bench.steady_maintain(sql, gpu_ids, now, every, raw_s, passes)
    window = bench.steady_window(done)
    window_s = len(window) * every
    cpu, wall = [p.cpu_s for p in window], [p.wall_s for p in window]
    return {
        "database": connection.vendor,
        "code": str(Path(storage.__file__).resolve().parent.parent),
        "gpus": gpus,
        "passes": passes,
        "window_passes": len(window),
        "window_s": window_s,
        "raw_window_s": int(settings.SAMPLE_RETENTION_HOURS * 3600),
        "raw_seconds_held": raw_s,
        "fill_s": round(fill_s, 1),
        "cpu_core_share": round(sum(cpu) / window_s, 4),
        "cpu_core_share_at_8000_per_s": round(sum(cpu) / window_s * 8000 / gpus, 4),
        "wall_core_share": round(sum(wall) / window_s, 4),
        "phase_cpu_s": {name: round(s, 2) for name, s in clock.cpu.items()},
        "pass_cpu_ms": [round(p.cpu_s * 1000) for p in done],
        "pass_wall_ms": [round(p.wall_s * 1000) for p in done],
        "median_pass_cpu_ms": round(statistics.median(cpu) * 1000),
        "window_raw_rows_added": window_s * gpus,
        "window_raw_rows_deleted": sum(p.result.deleted_raw for p in window),
        "longest_write_ms": max(p.result.longest_write_ms for p in done),
        "longest_write_ms_by_phase": {k: v for k, v in clock.longest_write_ms.items() if v},
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8000)
    parser.add_argument("--passes", type=int, default=33)
    parser.add_argument("--raw-minutes", type=float, default=6.0)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.gpus < bench.GPUS_PER_NODE or args.passes < 1 or args.raw_minutes <= 0:
        parser.error("--gpus must be at least 8, --passes at least 1, --raw-minutes above 0")
    shorten_windows(args.raw_minutes)
    with tempfile.TemporaryDirectory(prefix="lc-bench-steady-") as scratch:
        bench.setup(scratch)
        result = run(args.gpus, args.passes)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

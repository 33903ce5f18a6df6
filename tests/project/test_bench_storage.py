"""bench/storage.py run as its README gives it, on a small fleet: the figures it prints come from what it filled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_it_fills_one_hour_of_raw_samples_and_measures_the_database():
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # its own scratch SQLite file
    result = subprocess.run(
        [sys.executable, "bench/storage.py", "--raw-hour", "--gpus", "16", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["rows"] == 16 * 3600 and figures["seconds"] == 3600
    assert 0 < figures["bytes"]["dashboard_gpusample"] <= figures["database_bytes_after_one_hour"]
    assert 40 < figures["bytes_per_sample_raw"] < 400  # a 17-column row with its index, not a stray count

"""Time the periodic detection tasks at fleet size (issue #13, item 5).

    .venv/bin/python bench/periodic.py [--nodes 1000] [--deployments 200] [--runs 5] [--json]

A fleet of `--nodes` nodes (8 GPUs each), `--deployments` of them serving a model with two minutes of scraped
counters, GPU samples and stats lines (tests/storm.py). Scenarios, in turn: all healthy; every deployment
stalled (requests in flight, no tokens); every node lost at once. In each, `evaluate_fleet` runs `--runs`
times: the first run opens the alerts (a cost per new alert, once), the later ones find them open, which is
the steady state the target is about. `announce_silent_nodes` is timed in the lost scenario. Each run is
timed (wall clock) and its SQL queries counted; a scratch SQLite database (WAL, like the server's). The JSON
line gives `evaluate_fleet_ms` and `queries`: the worst steady run over all scenarios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.alerts import setup, timed_runs  # noqa: E402


def build(nodes: int, deployments: int) -> tuple[list, list]:
    from django.utils import timezone

    from tests import storm

    serving = storm.stalled_deployments(deployments, stuck_s=5.0)  # tokens 5 s ago: healthy for now
    stats_lines("42.0")
    others = storm.fleet(nodes - deployments, timezone.now(), prefix="idle", gpus=8)
    return serving, [d.node for d in serving] + others


def scenario(name: str, runs: int, before_each) -> dict:
    from dashboard.models import Alert

    results = timed_runs(runs, before_each)
    steady = results[1:] or results
    return {
        "scenario": name,
        "first_ms": results[0]["ms"],
        "steady_ms": statistics.median(r["ms"] for r in steady),
        "steady_max_ms": max(r["ms"] for r in steady),
        "queries": sorted({r["queries"] for r in steady}),
        "problems": results[-1]["problems"],
        "open_alerts": Alert.objects.unresolved().count(),
    }


def stats_lines(tokens_per_s: str) -> None:
    """Every server's stats lines say this throughput (new chunks, so the rules read the logs again)."""
    from dashboard.models import LogChunk
    from tests import storm

    for chunk in LogChunk.objects.all():
        chunk.lines = [storm.STATS_LINE.format(s=chunk.seq % 60, tps=tokens_per_s)]
        chunk.seq += 1_000_000
        chunk.pk = None
        chunk.save()


def stall_all(serving: list) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from dashboard.models import Deployment, LogChunk

    LogChunk.objects.all().delete()
    Deployment.objects.filter(pk__in=[d.pk for d in serving]).update(
        progress_at=timezone.now() - timedelta(seconds=120)
    )


def time_announce() -> dict:
    from dashboard.tasks import announce_silent_nodes

    started = time.perf_counter()
    names = announce_silent_nodes()
    return {
        "announce_silent_nodes_ms": round((time.perf_counter() - started) * 1000, 1),
        "silent": len(names),
    }


def run(nodes: int, deployments: int, runs: int) -> dict:
    from tests import storm

    serving, fleet = build(nodes, deployments)
    results = [scenario("healthy", runs, lambda: storm.report(fleet))]
    stall_all(serving)
    results.append(scenario("all deployments stalled", runs, lambda: storm.report(fleet)))
    storm.silence(fleet, 5.0)
    results.append(scenario("all nodes lost", runs, lambda: None))
    results[-1].update(time_announce())
    worst = max(results, key=lambda r: r["steady_max_ms"])
    return {
        "nodes": nodes,
        "deployments": deployments,
        "evaluate_fleet_ms": worst["steady_max_ms"],
        "queries": max(q for r in results for q in r["queries"]),
        "scenarios": results,
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--deployments", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if not 0 < args.deployments <= args.nodes:
        parser.error("--deployments must be between 1 and --nodes (one deployment per node)")
    with tempfile.TemporaryDirectory(prefix="lc-bench-periodic-") as db_dir:
        setup(db_dir)
        result = run(args.nodes, args.deployments, args.runs)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

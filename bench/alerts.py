"""Time `evaluate_fleet` when many problems are open at once (issue #10, alert storms).

    .venv/bin/python bench/alerts.py [--nodes 300] [--deployments 300] [--runs 5] [--json]

Scenario "nodes lost": N nodes report, then all go silent together; the first run after that opens the
alerts, the later runs find them open. Scenario "stalled deployments": N deployments each serve a request
that stopped producing tokens (with two minutes of scraped counters, GPU samples and stats lines); the first
run opens their stall alerts, the later runs refresh them. Each run is timed (wall clock) and its SQL queries
counted; `cpu_ms` is this process's CPU time (the database is SQLite, in-process), which a busy shared machine
inflates less than the wall clock. A scratch SQLite database (WAL, like the server's) in a temporary directory; notifications are
queued as rows but not delivered (delivery is the notify worker's job, not evaluation's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup(db_dir: str) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{db_dir}/bench.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # not one "alert opened" line per alert
    import django
    from django.conf import settings

    django.setup()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from dashboard import tasks

    tasks.queue_delivery = lambda: None  # no broker here: the rows stay queued


def timed_runs(runs: int, before_each: Callable[[], None] = lambda: None) -> list[dict]:
    from django.db import connection

    from dashboard.tasks import evaluate_fleet

    results, queries = [], []

    def count(execute, sql, *rest):
        queries.append(sql)
        return execute(sql, *rest)

    for _ in range(runs):
        before_each()
        queries.clear()
        with connection.execute_wrapper(count):
            started, cpu = time.perf_counter(), time.process_time()
            problems = evaluate_fleet()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        results.append(
            {
                "ms": round(elapsed * 1000, 1),
                "cpu_ms": round(cpu * 1000, 1),
                "queries": len(queries),
                "problems": problems,
            }
        )
    return results


def lost_nodes(count: int, runs: int) -> dict:
    from django.utils import timezone

    from dashboard.models import Alert, Node, Notification
    from tests import storm

    nodes = storm.fleet(count, timezone.now(), prefix="bench")
    healthy = timed_runs(1)
    storm.silence(nodes, 5.0)
    lost = timed_runs(runs)
    storm.report(nodes)
    back = timed_runs(1)
    result = {
        "scenario": f"{count} nodes lost together",
        "all online": healthy,
        "lost": lost,
        "back": back,
        "alerts": list(Alert.objects.values_list("kind", "status")),
        "notifications": Notification.objects.count(),
    }
    Node.objects.filter(pk__in=[n.pk for n in nodes]).delete()  # not lost again in the next scenario
    Alert.objects.all().delete()
    return result


def stalled(count: int, runs: int) -> dict:
    from dashboard.models import Alert
    from tests import storm

    deployments = storm.stalled_deployments(count)
    nodes = [d.node for d in deployments]  # their agents keep reporting: only the servers are stuck
    return {
        "scenario": f"{count} stalled deployments",
        "runs": timed_runs(runs, lambda: storm.report(nodes)),
        "alerts": Alert.objects.filter(kind="stall").count(),
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--deployments", type=int, default=300)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as db_dir:
        setup(db_dir)
        results = [lost_nodes(args.nodes, args.runs), stalled(args.deployments, args.runs)]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        print(result.pop("scenario"))
        for name, value in result.items():
            print(f"  {name}: {value}")


if __name__ == "__main__":
    main()

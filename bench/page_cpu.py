"""CPU time of the operator's pages on a fleet's database (issue #13: pages under 300 ms at 1,000 nodes).

    .venv/bin/python bench/fullstack.py --agents 1000 ... --log-dir DIR     # leaves DIR/db.sqlite3
    .venv/bin/python bench/page_cpu.py DIR/db.sqlite3 [--requests 7] [--json]

Opens each page through Django's test client in this process, on a copy of the database (so it can run while
nothing writes to it), and gives each page's median and least CPU time per request (`time.thread_time`: less
sensitive than wall time to the rest of a shared machine) and its size. The fleet's state is the one the run
left (nodes shown stale by then: the same page work).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import setup_django  # noqa: E402


def pages() -> dict[str, str]:
    from dashboard.models import Deployment, Node

    node = Node.objects.order_by("name").first()
    found = {
        "fleet": "/",
        "node": f"/nodes/{node.name}/",
        "api_nodes": "/api/v1/nodes/",
        "alerts": "/alerts/",
    }
    deployment = Deployment.objects.first()
    if deployment is not None:
        found["deployment"] = f"/deployments/{deployment.pk}/"
    return found


def cpu_per_request(client, path: str, requests: int) -> dict:
    client.get(path)  # the first request warms the templates and caches
    used, size = [], 0
    for _ in range(requests):
        began = time.thread_time()
        response = client.get(path)
        used.append((time.thread_time() - began) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}")
        size = len(response.content)
    return {
        "cpu_ms_median": round(statistics.median(used), 1),
        "cpu_ms_min": round(min(used), 1),
        "bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("--requests", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lc-page-cpu-") as scratch:
        copy = Path(scratch) / "db.sqlite3"
        shutil.copyfile(args.database, copy)
        os.environ["LAYERCAKE_VAR"] = scratch
        setup_django(copy)
        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.test.utils import setup_test_environment

        setup_test_environment()
        client = Client()
        client.force_login(get_user_model().objects.filter(is_superuser=True).first())
        result = {name: cpu_per_request(client, path, args.requests) for name, path in pages().items()}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()

"""The fleet page in headless Chromium at fleet size (issue #13, item 3).

    .venv/bin/python bench/fleet_page.py --nodes 1000 [--gpus 8] [--seconds 10] [--json]

A fresh SQLite database with `--nodes` nodes of `--gpus` GPUs, each with a newest sample; the real Redis and
uvicorn; a logged-in Debian Chromium (Playwright) opens the fleet page. Then fleet ticks carrying every GPU's
point go to the "fleet" group twice a second (utilization walking by up to 3 % a tick; `--jumpy`: any
value each tick, so that every heatmap cell changes colour) (what the ingest fan-out sends when every agent reports, built
by the same `live.fleet_update`; no agents run, so the machine's CPU goes to the server and the browser).
Gives `first_render_s` (navigation start to the load event), `html_kb`, `dom_nodes`, `main_thread_busy`
(Chromium's TaskDuration over the tick window, a fraction of the wall time) and the server's CPU share over
that window (`server_cpu`, fraction of one core).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"


def setup(db_dir: str, redis_url: str) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{db_dir}/bench.sqlite3"
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_fleet(nodes: int, gpus: int) -> dict[int, list[int]]:
    """Node id -> its GPU ids, every GPU with one sample of now."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from dashboard.models import Gpu, GpuSample
    from tests import storm

    fleet = storm.fleet(nodes, timezone.now(), prefix="bench", gpus=gpus)
    now = timezone.now()
    rows = [
        GpuSample(
            gpu=g,
            t=now,
            seq=1,
            util_gpu=random.randint(0, 100),
            util_mem=5,
            mem_used_mib=4096,
            mem_free_mib=20480,
            temp_c=50,
            power_w=200,
        )
        for g in Gpu.objects.all()
    ]
    GpuSample.objects.bulk_create(rows, batch_size=5000)
    get_user_model().objects.create_user("bench", password="bench-pw-123")
    return {n.pk: list(n.gpus.values_list("pk", flat=True)) for n in fleet}


async def tick(fleet: dict[int, list[int]], seconds: float, jumpy: bool) -> int:
    """Every node's GPUs in one fleet.update, twice a second, through the real channel layer."""
    from channels.layers import get_channel_layer

    from dashboard.live import FLEET_GROUP, fleet_update

    layer, sent, start = get_channel_layer(), 0, time.monotonic()
    utils = {g: random.uniform(0, 100) for gpus in fleet.values() for g in gpus}
    while time.monotonic() - start < seconds:
        for g, util in utils.items():  # a walk, as loads move; --jumpy: any value each tick (the worst case)
            utils[g] = random.uniform(0, 100) if jumpy else min(100.0, max(0.0, util + random.uniform(-3, 3)))
        nodes = [
            {"node": node, "t": time.time(), "gpus": points(gpus, utils)} for node, gpus in fleet.items()
        ]
        await layer.group_send(FLEET_GROUP, fleet_update(nodes, []))
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * 0.5 - time.monotonic()))
    return sent


def points(gpus: list[int], utils: dict[int, float]) -> dict:
    from dashboard.live import GpuPoint

    return {str(g): GpuPoint(round(utils[g], 1), 4096.0, 24576.0, 50.0, 200.0, 5.0) for g in gpus}


def task_seconds(cdp) -> float:
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return metrics["TaskDuration"]


def measure(url: str, fleet: dict[int, list[int]], seconds: float, server_pid: int, jumpy: bool) -> dict:
    from playwright.sync_api import sync_playwright

    from bench.ingest import cpu_seconds

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.goto(url + "/accounts/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", "bench-pw-123")
        page.click("button[type=submit]")
        page.wait_for_url(url + "/")
        page.goto(url + "/", wait_until="load")
        timing = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
        navigation = json.loads(timing)
        dom_nodes = page.evaluate("document.getElementsByTagName('*').length")
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.wait_for_timeout(1000)
        busy, wall, cpu = task_seconds(cdp), time.monotonic(), cpu_seconds(server_pid)
        with ThreadPoolExecutor(1) as pool:  # Playwright's sync API runs its own loop in this thread
            ticks = pool.submit(asyncio.run, tick(fleet, seconds, jumpy)).result()
        page.wait_for_timeout(500)
        elapsed = time.monotonic() - wall
        result = {
            "first_render_s": round(navigation["loadEventEnd"] / 1000, 2),
            "html_kb": round(navigation["transferSize"] / 1024, 1),
            "html_decoded_kb": round(navigation["decodedBodySize"] / 1024, 1),
            "dom_nodes": dom_nodes,
            "ticks": ticks,
            "main_thread_busy": round((task_seconds(cdp) - busy) / elapsed, 3),
            "server_cpu": round((cpu_seconds(server_pid) - cpu) / elapsed, 3),
        }
        browser.close()
    return result


def run(args: argparse.Namespace) -> dict:
    from dashboard import stack

    with tempfile.TemporaryDirectory(prefix="lc-bench-fleet-") as tmp:
        log = Path(tmp)
        redis_port, port = stack.free_port(), stack.free_port()
        services = [stack.redis_service(redis_port, log).start()]
        try:
            stack.wait_for_port(redis_port)
            setup(tmp, f"redis://127.0.0.1:{redis_port}/0")
            fleet = make_fleet(args.nodes, args.gpus)
            env = {"REDIS_URL": os.environ["REDIS_URL"], "DATABASE_URL": os.environ["DATABASE_URL"]}
            services.append(stack.asgi_service(port, env, log).start())
            stack.wait_for_port(port)
            result = measure(
                f"http://127.0.0.1:{port}", fleet, args.seconds, services[-1].proc.pid, args.jumpy
            )
        finally:
            for service in reversed(services):
                service.stop()
    return {"nodes": args.nodes, "gpus_per_node": args.gpus, "jumpy": args.jumpy, **result}


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--jumpy", action="store_true", help="every GPU's utilization jumps each tick")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.nodes < 1 or args.gpus < 1:
        parser.error("--nodes and --gpus must be at least 1")
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""The fleet page in headless Chromium at fleet size (issue #13, item 3).

    .venv/bin/python bench/fleet_page.py --nodes 1000 [--gpus 8] [--seconds 10] [--pages 1] [--jumpy] [--json]

A fresh SQLite database with `--nodes` nodes of `--gpus` GPUs, each with a newest sample; the real Redis and
uvicorn; a logged-in Debian Chromium (Playwright) opens the fleet page. Then ticks carrying every GPU's
point go to the server processes' hubs twice a second (utilization walking by up to 3 % a tick; `--jumpy`:
any value each tick, so that every heatmap cell changes colour), published by the same `live.publish_tick` as
the ingest fan-out's when every agent reports; no agents run, so the machine's CPU goes to the server and
the browser. Gives `first_render_s` (navigation start to the load event), `html_kb`, `dom_nodes`; the
main thread's share over the tick window from Chromium's counters: `main_thread_busy` (TaskDuration: wall
time of its tasks, which on a loaded machine counts waiting for a core), `main_thread_cpu` (ThreadTime: CPU
only), its script, style and layout parts, and `main_thread_cpu_without_ticks` (3 s before the ticks);
`watched_nodes` (the nodes the page subscribed to: the cards near the screen, `--scroll-to-cards` scrolls the
first into view); and the server's CPU share (fraction of one core) over a window of ticks with no page open
(`server_cpu_no_page`) and with the page open: `server_cpu_first_page` is the difference (it includes the
process's hub starting to take the ticks), and with `--pages N`, `server_cpu_per_further_page` is what
each further page adds. The fan-out's part is this process's (it plays the fan-out):
`publish_cpu_ms_per_tick` is the CPU time it spends building and sending one tick (Redis's own is not counted).
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


async def tick(fleet: dict[int, list[int]], seconds: float, jumpy: bool) -> tuple[int, float]:
    """Every node's GPUs in one tick, twice a second, through the real channel layer and Redis (as live.FleetFanout)."""
    from dashboard.live import Publisher, publish_tick

    sent, start, publisher, publishing = 0, time.monotonic(), Publisher(), 0.0
    utils = {g: random.uniform(0, 100) for gpus in fleet.values() for g in gpus}
    while time.monotonic() - start < seconds:
        for g, util in utils.items():  # a walk, as loads move; --jumpy: any value each tick (the worst case)
            utils[g] = random.uniform(0, 100) if jumpy else min(100.0, max(0.0, util + random.uniform(-3, 3)))
        nodes = [
            {"node": node, "t": time.time(), "gpus": points(gpus, utils)} for node, gpus in fleet.items()
        ]
        cpu = time.thread_time()
        await publish_tick(nodes, publisher)
        publishing += time.thread_time() - cpu  # building and sending the tick, not simulating it
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * 0.5 - time.monotonic()))
    return sent, publishing


def points(gpus: list[int], utils: dict[int, float]) -> dict:
    from dashboard.live import GpuPoint

    return {str(g): GpuPoint(round(utils[g], 1), 4096.0, 24576.0, 50.0, 200.0, 5.0) for g in gpus}


MAIN_THREAD = {"busy": "TaskDuration", "cpu": "ThreadTime", "script": "ScriptDuration"} | {
    "style": "RecalcStyleDuration",
    "layout": "LayoutDuration",
}


def main_thread_seconds(cdp) -> dict[str, float]:
    """Chromium's main-thread counters: `busy` is the wall time of its tasks (on a loaded machine that counts
    time spent waiting for a core), `cpu` its CPU time; script, style and layout are parts of `busy`."""
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return {key: metrics[name] for key, name in MAIN_THREAD.items()}


def main_thread_shares(cdp, before: dict[str, float], elapsed: float) -> dict[str, float]:
    after = main_thread_seconds(cdp)
    return {f"main_thread_{key}": round((after[key] - before[key]) / elapsed, 3) for key in before}


def open_page(context, url: str, scroll_to_cards: bool):
    page = context.new_page()
    page.goto(url + "/", wait_until="load")
    if scroll_to_cards:
        page.locator("section.node").first.scroll_into_view_if_needed()
    return page


def server_share(server_pid: int, fleet: dict[int, list[int]], seconds: float, jumpy: bool) -> tuple:
    """(ticks sent, server CPU as a fraction of a core, wall seconds, CPU ms per tick to publish it) over one
    window of ticks."""
    from bench.ingest import cpu_seconds

    wall, cpu = time.monotonic(), cpu_seconds(server_pid)
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API runs its own loop in this thread
        ticks, publishing = pool.submit(asyncio.run, tick(fleet, seconds, jumpy)).result()
    time.sleep(0.5)
    elapsed = time.monotonic() - wall
    return ticks, (cpu_seconds(server_pid) - cpu) / elapsed, elapsed, 1000 * publishing / max(1, ticks)


def measure(url: str, fleet: dict[int, list[int]], args: argparse.Namespace, server_pid: int) -> dict:
    """Ticks with no page open (the server's own share), with one fleet page open, then with `--pages`."""
    from playwright.sync_api import sync_playwright

    _, idle_cpu, _, _ = server_share(server_pid, fleet, args.seconds, args.jumpy)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context()
        page = context.new_page()
        page.goto(url + "/accounts/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", "bench-pw-123")
        page.click("button[type=submit]")
        page.wait_for_url(url + "/")
        page.goto(url + "/", wait_until="load")
        timing = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
        navigation = json.loads(timing)
        dom_nodes = page.evaluate("document.getElementsByTagName('*').length")
        if args.scroll_to_cards:  # the cards on screen are watched (static/js/live.js), not the heatmap's top
            page.locator("section.node").first.scroll_into_view_if_needed()
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.wait_for_timeout(1000)
        quiet = main_thread_seconds(cdp)
        page.wait_for_timeout(3000)
        without_ticks = main_thread_shares(cdp, quiet, 3.0)["main_thread_cpu"]
        before = main_thread_seconds(cdp)
        ticks, cpu, elapsed, publish_ms = server_share(server_pid, fleet, args.seconds, args.jumpy)
        result = {
            "first_render_s": round(navigation["loadEventEnd"] / 1000, 2),
            "html_kb": round(navigation["transferSize"] / 1024, 1),
            "html_decoded_kb": round(navigation["decodedBodySize"] / 1024, 1),
            "dom_nodes": dom_nodes,
            "ticks": ticks,
            **main_thread_shares(cdp, before, elapsed),
            "main_thread_cpu_without_ticks": without_ticks,
            "server_cpu_no_page": round(idle_cpu, 4),
            "server_cpu_one_page": round(cpu, 4),
            "server_cpu_first_page": round(cpu - idle_cpu, 4),
            "publish_cpu_ms_per_tick": round(publish_ms, 2),
            "watched_nodes": page.evaluate("(window.layercakeSubscribed || {nodes: []}).nodes.length"),
            "chromium": browser.version,
        }
        if args.pages > 1:  # what each further page adds, once the process's hub is running
            for _ in range(args.pages - 1):
                open_page(context, url, args.scroll_to_cards)
            _, more, _, _ = server_share(server_pid, fleet, args.seconds, args.jumpy)
            result["pages"] = args.pages
            result["server_cpu_per_further_page"] = round((more - cpu) / (args.pages - 1), 4)
        browser.close()
    return result


def run(args: argparse.Namespace) -> dict:
    from bench.ingest import versions
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
            result = measure(f"http://127.0.0.1:{port}", fleet, args, services[-1].proc.pid)
        finally:
            for service in reversed(services):
                service.stop()
    load = Path("/proc/loadavg").read_text().split()[:3]
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "jumpy": args.jumpy,
        "scroll_to_cards": args.scroll_to_cards,
        **result,
        "loadavg": " ".join(load),
        "versions": {**versions(), "chromium": result.pop("chromium")},
    }


def main() -> None:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pages", type=int, default=1, help="fleet pages open at once (server CPU per page)")
    parser.add_argument("--jumpy", action="store_true", help="every GPU's utilization jumps each tick")
    parser.add_argument("--scroll-to-cards", action="store_true", help="scroll the first node card into view")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.nodes < 1 or args.gpus < 1 or args.pages < 1:
        parser.error("--nodes, --gpus and --pages must be at least 1")
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

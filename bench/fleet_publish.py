"""What one fleet tick costs the fan-out that publishes it: every node's values in the tick (the old way) against
the values in a Redis hash and a small tick (`live.publish_tick`), alternating, on one real Redis.

    .venv/bin/python bench/fleet_publish.py [--nodes 1000] [--gpus 8] [--ticks 20] [--json]

Every GPU's utilization is random each tick (every heatmap cell changes). One channel is in the tick group and
takes each tick, as one hub would; for `publish_tick_ms` that hub shows 50 nodes (a fleet page's cards,
declared in live.Watching), for `publish_tick_no_hub_ms` no hub is declared (no page open anywhere: the fan-out
sends no tick). Gives the CPU time (ms) per tick of each form in this process: encoding, the heatmap cells,
and the Redis client's work (Redis's own CPU is not counted).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FANOUT_S = 0.5  # settings' fan-out period: one tick of each form per period
sys.path.insert(0, str(ROOT))


async def whole_tick(layer, nodes: list[dict], colours) -> None:
    """The tick as it was until 2026-12-01: every node's encoded values in the message itself."""
    from dashboard.live import TICKS_GROUP, _node_json

    encoded = {str(node["node"]): _node_json(node) for node in nodes}
    message = {"type": "live.tick", "sent": time.time(), "nodes": encoded, "cells": colours.changed(nodes)}
    await layer.group_send(TICKS_GROUP, message)


async def measure(args: argparse.Namespace) -> dict[str, float]:
    from channels.layers import get_channel_layer

    from dashboard.live import TICKS_GROUP, Colours, Publisher, Watching

    layer = get_channel_layer()
    hub = await layer.new_channel()
    await layer.group_add(TICKS_GROUP, hub)
    gpus = {n: range(n * args.gpus, (n + 1) * args.gpus) for n in range(1, args.nodes + 1)}
    cards = frozenset(str(n) for n in range(1, min(50, args.nodes) + 1))
    forms = {"whole_tick_ms": (whole_tick, None), "publish_tick_ms": (published, cards)}
    forms["publish_tick_no_hub_ms"] = (published, False)
    state, cpu = {"whole_tick_ms": Colours()}, dict.fromkeys(forms, 0.0)
    state |= {name: Publisher() for name in forms if name != "whole_tick_ms"}
    for _ in range(args.ticks):
        round_at = time.monotonic()  # a round each fan-out period: live.Publisher's refreshes go by the clock
        for name, (send, shown) in forms.items():
            if shown is not None:  # the hub's declaration, as a page's hub makes it (not timed)
                await (
                    Watching(layer).withdraw("bench")
                    if shown is False
                    else Watching(layer).declare("bench", shown)
                )
            nodes = [{"node": n, "t": time.time(), "gpus": points(ids)} for n, ids in gpus.items()]
            start = time.thread_time()
            await send(layer, nodes, state[name])
            cpu[name] += time.thread_time() - start
            if shown is not False:
                await layer.receive(hub)
        await asyncio.sleep(max(0.0, round_at + FANOUT_S - time.monotonic()))
    return {name: round(1000 * seconds / args.ticks, 1) for name, seconds in cpu.items()}


async def published(layer, nodes: list[dict], publisher) -> None:
    from dashboard.live import publish_tick

    await publish_tick(nodes, publisher)


def points(ids: range) -> dict:
    from dashboard.live import GpuPoint

    return {
        str(g): GpuPoint(round(random.uniform(0, 100), 1), 4096.0, 24576.0, 50.0, 200.0, 5.0) for g in ids
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if min(args.nodes, args.gpus, args.ticks) < 1:
        parser.error("--nodes, --gpus and --ticks must be at least 1")
    from bench.cleanup import exit_on_sigterm
    from dashboard import stack

    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="lc-bench-publish-") as tmp:
        port = stack.free_port()
        redis = stack.redis_service(port, Path(tmp)).start()
        try:
            stack.wait_for_port(port)
            os.environ["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
            os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/unused.sqlite3"
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "layercake.settings")
            import django

            django.setup()
            result = {"nodes": args.nodes, "gpus_per_node": args.gpus, **asyncio.run(measure(args))}
        finally:
            redis.stop()
    result["loadavg"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

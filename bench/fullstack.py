"""The whole product under a simulated fleet (issue #13's headline target).

    .venv/bin/python bench/fullstack.py --agents 1000 --gpus 8 --interval 1 --seconds 90 [--agent-process] --json

Starts `manage.py runstack` as `./run.sh` does (embedded Redis, uvicorn, the Celery workers of the default,
detect and notify queues, beat, and with `--demo` the demo agents and deployment) on a fresh SQLite database
in a temporary var directory, then N simulated agents (bench/ingest.py's agents process), a logged-in browser
client on /ws/fleet/ and an operator opening pages. Once every node is announced online in the browser, the
agents sample for `--seconds`: the steady window every figure below is taken over:
- p50/p99 sample time to browser receipt; nodes announced stale/offline in the browser (flapping);
- the agents' connection losses by cause (handshake timeouts, keepalive ping timeouts);
- alerts opened (node-lost and the incident grouping them); evaluate_fleet runs from the detect worker's log;
- each page's response time (request to last byte) and the CPU share of every process of the stack.
With `--agent-process` the agents (the bench's and the demo's) connect to an ASGI process of their own
(`runstack --agent-port`); the browser client and the pages use the main one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import (  # noqa: E402
    WAVE_TIMEOUT_S,
    agents_argv,
    cpu_seconds,
    make_fleet,
    percentile,
    setup_django,
    versions,
)
from bench.storm import Browser  # noqa: E402

RUNNING_LINE = "layercake is running"
NOT_ONLINE = ("stale", "offline")
TAIL_S = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8, choices=[2, 4, 8])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=90.0, help="the steady window")
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds between every node online and the window"
    )
    parser.add_argument(
        "--demo", action="store_true", help="with the demo agents and deployment, as ./run.sh"
    )
    parser.add_argument(
        "--quiet-wave",
        action="store_true",
        help="agents sample only once every node is online (as bench/ingest.py), not from their start",
    )
    parser.add_argument(
        "--agent-process",
        action="store_true",
        help="the agents' websockets on an ASGI process of their own (runstack --agent-port)",
    )
    parser.add_argument("--page-every", type=float, default=1.0, help="seconds between two page requests")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--log-dir", default="", help="keep the var directory (logs, database) here")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.seconds <= 0:
        parser.error("--agents must be at least 1 and --seconds positive")
    return args


# ---- the browser: live feed and pages ------------------------------------------------------------------------
class Feed(Browser):
    """bench/storm.py's reconnecting browser client, noting every value's latency and every node status."""

    def __init__(self, url: str, sessionid: str) -> None:
        super().__init__(url, sessionid)
        self.latencies: list[tuple[float, float]] = []  # (received, ms since the sample)
        # (received, ms from the sample to the fan-out's send of its tick, ms from that send to receipt)
        self.legs: list[tuple[float, float, float]] = []
        self.statuses: list[tuple[float, int, str]] = []  # (received, node, status)
        self.bench_online: set[int] = set()  # the simulated fleet's nodes announced online (not the demo's)
        self.connections = 0

    async def listen(self, ws, counts: bool) -> None:
        self.connections += 1
        await super().listen(ws, counts)

    def note(self, message: dict, counts: bool) -> None:
        now, kind = time.time(), message["type"]
        if kind == "fleet.update":
            self.latencies.extend((now, (now - n["t"]) * 1000) for n in message["nodes"])
            sent = message["sent"]
            self.legs.extend((now, (sent - n["t"]) * 1000, (now - sent) * 1000) for n in message["nodes"])
        elif kind in ("fleet.node", "fleet.nodes"):
            for node in message.get("nodes", [message]):
                self.statuses.append((now, node["node"], node["status"]))
                if node["status"] == "online" and node["name"].startswith("bench-"):
                    self.bench_online.add(node["node"])


def page_times(
    base: str, sessionid: str, pages: dict[str, str], every: float, until: float, stop: threading.Event
) -> dict:
    """Open the pages in turn, one every `every` seconds, until the wall clock passes `until` (or `stop`: a
    SIGTERM, whose cleanup would otherwise wait for this thread until the window's end)."""
    times: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    while time.time() < until and not stop.is_set():
        for name, path in pages.items():
            cookie = "" if name == "login" else f"sessionid={sessionid}"
            began = time.monotonic()
            if fetch(base + path, cookie):
                times[name].append((time.monotonic() - began) * 1000)
            else:
                errors[name] += 1
            if stop.wait(every) or time.time() >= until:
                break
    return {name: page_summary(times.get(name, []), errors[name]) for name in pages}


def fetch(url: str, cookie: str) -> bool:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def page_summary(ms: list[float], errors: int) -> dict:
    return {
        "n": len(ms),
        "p50_ms": _round(percentile(ms, 0.5)),
        "max_ms": _round(max(ms, default=None)),
        "errors": errors,
    }


# ---- processes and their CPU ---------------------------------------------------------------------------------
def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def process_label(pid: int, agent_port: int | None = None) -> str:
    """What a process of the stack is, from its command line (a Celery pool child is named as its worker)."""
    return label_for(
        Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"), agent_port
    )


def label_for(argv: list[str], agent_port: int | None = None) -> str:
    line = " ".join(argv)
    if agent_port is not None and "uvicorn" in line and f"--port {agent_port} " in line:
        return "asgi-agents"
    for needle, label in (
        ("redis-server", "redis"),
        ("uvicorn", "asgi"),
        ("runstack", "runstack"),
        (" beat", "celery-beat"),
        ("-Q detect", "celery-detect"),
        ("-Q notify", "celery-notify"),
        (" worker", "celery-worker"),
        ("mailsink", "smtp-sink"),
        ("--role agents", "bench-agents"),
        ("agents run", "demo-agents"),
        ("agents.sim", "demo-inference-servers"),
    ):
        if needle in line:
            return label
    return "other: " + " ".join(argv[:3])[:60]


def cpu_snapshot(roots: list[int], agent_port: int | None = None) -> dict[int, tuple[str, float]]:
    snapshot = {}
    for pid in (p for root in roots for p in descendants(root)):
        try:
            snapshot[pid] = (process_label(pid, agent_port), cpu_seconds(pid))
        except (OSError, IndexError):
            continue
    return snapshot


def cpu_shares(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall: float
) -> dict:
    """% of one core per kind of process over the window (a process started inside it counts from 0)."""
    used: Counter[str] = Counter()
    for pid, (label, seconds) in after.items():
        used[label] += seconds - before.get(pid, (label, 0.0))[1]
    return {label: round(100 * s / wall, 1) for label, s in sorted(used.items())}


# ---- the detect worker's log ---------------------------------------------------------------------------------
TASK_LINE = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:]+),\d+: \w+/[\w-]+\] Task dashboard\.tasks\.evaluate_fleet\[[^]]+\] succeeded in (?P<s>[\d.e-]+)s: (?P<result>\S+)"
)
LOG_TIME = re.compile(r"^\[(?P<at>[\d-]+ [\d:]+),\d+:")


def evaluate_fleet_runs(log: Path, start: float, end: float) -> dict:
    """evaluate_fleet's runs in the window, from the detect worker's log (Celery prints each task's duration)."""
    ms, skipped, discarded = [], 0, 0
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        stamp = LOG_TIME.match(line)
        if not stamp or not start <= datetime.fromisoformat(stamp["at"]).timestamp() <= end:
            continue
        if (run := TASK_LINE.match(line)) and run["result"] != "None":
            ms.append(float(run["s"]) * 1000)
        elif "evaluate_fleet: the previous run is still going" in line:
            skipped += 1
        elif "evaluate_fleet" in line and ("revoked" in line or "expired" in line):
            discarded += 1
    return {
        "runs": len(ms),
        "p50_ms": _round(percentile(ms, 0.5)),
        "p99_ms": _round(percentile(ms, 0.99)),
        "max_ms": _round(max(ms, default=None)),
        "skipped": skipped,
        "expired": discarded,
    }


# ---- the run ---------------------------------------------------------------------------------------------------
def start_stack(var: Path, port: int, demo: bool, agent_port: int | None = None):
    from dashboard import stack

    argv = [sys.executable, "manage.py", "runstack", "--port", str(port), *([] if demo else ["--no-demo"])]
    argv += [] if agent_port is None else ["--agent-port", str(agent_port)]
    env = {"LAYERCAKE_VAR": str(var), "DATABASE_URL": os.environ["DATABASE_URL"]}
    service = stack.Service("runstack", argv, env, var / "runstack.out").start()
    deadline = time.monotonic() + 300
    while RUNNING_LINE not in service.log_since_start():
        if service.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"runstack did not start:\n{service.log_tail()}")
        time.sleep(0.5)
    return service


def operator_pages(demo: bool) -> dict[str, str]:
    from dashboard.models import Deployment

    pages = {"login": "/accounts/login/", "fleet": "/", "node": "/nodes/bench-0000/", "alerts": "/alerts/"}
    deployment = Deployment.objects.first() if demo else None
    if deployment is not None:
        pages["deployment"] = f"/deployments/{deployment.pk}/"
    return {**pages, "api_nodes": "/api/v1/nodes/"}


async def measure(
    args: argparse.Namespace, base: str, sessionid: str, var: Path, stack_pid: int, pages: dict[str, str]
) -> dict:
    feed = Feed(base, sessionid)
    watcher = asyncio.create_task(feed.run())
    # The agents sample on past the window: their goodbyes (nodes shown stale) fall outside it.
    ready, sampling = var / "ready", args.settle + args.seconds + TAIL_S
    agent_base = f"http://127.0.0.1:{args.agent_port}" if args.agent_port else base
    argv = agents_argv(
        agent_base, var / "tokens", ready, args.gpus, args.interval, sampling, not args.quiet_wave
    )
    agents = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, cwd=ROOT)
    pages_stop = threading.Event()
    try:
        began = time.time()
        while len(feed.bench_online) < args.agents and time.time() - began < WAVE_TIMEOUT_S:
            if agents.returncode is not None:
                raise RuntimeError(f"the agents process exited: {len(feed.bench_online)} nodes online")
            await asyncio.sleep(0.1)
        ready.touch()  # after the timeout too: the window then measures a fleet that never came up
        window = {"wave_s": round(time.time() - began, 1), "online_after_wave": len(feed.bench_online)}
        await asyncio.sleep(args.settle)
        window["start"], cpu_before = time.time(), cpu_snapshot([stack_pid, agents.pid], args.agent_port)
        until = window["start"] + args.seconds
        window["pages"] = await asyncio.to_thread(
            page_times, base, sessionid, pages, args.page_every, until, pages_stop
        )
        await asyncio.sleep(max(0.0, until - time.time()))
        window["end"] = until
        after = cpu_snapshot([stack_pid, agents.pid], args.agent_port)
        window["cpu_pct"] = cpu_shares(cpu_before, after, time.time() - window["start"])
        out, _ = await agents.communicate()
    finally:  # SIGTERM (bench/cleanup.py) cancels this: the agents go too
        pages_stop.set()
        if agents.returncode is None:
            agents.kill()
            await agents.wait()
        feed.stop.set()
        await watcher
    return {**window, "agents_out": json.loads(out), "feed": feed}


def feed_figures(feed: Feed, start: float, end: float) -> dict:
    latencies = [ms for at, ms in feed.latencies if start <= at <= end]
    to_tick = [a for at, a, _ in feed.legs if start <= at <= end]
    tick_to_browser = [b for at, _, b in feed.legs if start <= at <= end]
    not_online = [
        (node, status) for at, node, status in feed.statuses if start <= at <= end and status in NOT_ONLINE
    ]
    return {
        "p50_to_browser_ms": _round(percentile(latencies, 0.5)),
        "p99_to_browser_ms": _round(percentile(latencies, 0.99)),
        "browser_node_updates": len(latencies),
        # where the time goes: sample -> the fan-out's send (agent, ingest, flush, tick wait), then -> browser
        "p50_sample_to_tick_ms": _round(percentile(to_tick, 0.5)),
        "p99_sample_to_tick_ms": _round(percentile(to_tick, 0.99)),
        "p50_tick_to_browser_ms": _round(percentile(tick_to_browser, 0.5)),
        "p99_tick_to_browser_ms": _round(percentile(tick_to_browser, 0.99)),
        "browser_reconnects": max(0, feed.connections - 1),
        "nodes_shown_stale_or_offline": len({node for node, _ in not_online}),
        "stale_or_offline_announcements": len(not_online),
    }


def database_figures(start: float, end: float) -> dict:
    from django.db.models import Count

    from dashboard.models import Alert, GpuSample

    since = datetime.fromtimestamp(start).astimezone()
    opened = Alert.objects.filter(opened__gte=since, opened__lte=datetime.fromtimestamp(end).astimezone())
    kinds = dict(opened.values("kind").annotate(n=Count("pk")).values_list("kind", "n"))
    grouped = sum(len(a.member_nodes()) for a in opened.filter(kind="nodes-lost"))
    stored = GpuSample.objects.filter(gpu__node__name__startswith="bench-").count()
    return {"alerts_opened": kinds, "nodes_in_lost_incidents": grouped, "stored": stored}


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="lc-bench-fullstack-") as tmp:
        var = Path(args.log_dir or tmp).resolve()
        var.mkdir(parents=True, exist_ok=True)
        # The stack reads its secret key from there: the bench's session cookie is valid in it.
        os.environ["LAYERCAKE_VAR"] = str(var)
        setup_django(var / "db.sqlite3")
        from dashboard import stack

        tokens, sessionid = make_fleet(args.agents)
        (var / "tokens").write_text("\n".join(tokens))
        port, load_before = stack.free_port(), loadavg()
        args.agent_port = stack.free_port() if args.agent_process else None
        service = start_stack(var, port, args.demo, args.agent_port)
        try:
            base, pages = f"http://127.0.0.1:{port}", operator_pages(args.demo)
            outcome = asyncio.run(measure(args, base, sessionid, var, service.proc.pid, pages))
            figures = database_figures(outcome["start"], outcome["end"])
            detect = evaluate_fleet_runs(var / "log" / "celery-detect.log", outcome["start"], outcome["end"])
            restarts = service.log_since_start().count(" restarted (pid")
        finally:
            service.stop(timeout=30)
    return summarize(args, outcome, figures, detect, restarts, load_before)


def summarize(args, outcome: dict, figures: dict, detect: dict, restarts: int, load_before: str) -> dict:
    agents = outcome["agents_out"]
    losses = agents["connection_losses"]
    return {
        "agents": args.agents,
        "gpus_per_agent": args.gpus,
        "interval_s": args.interval,
        "seconds": args.seconds,
        "settle_s": args.settle,
        "demo": args.demo,
        "agent_process": args.agent_process,
        "samples_in_wave": not args.quiet_wave,
        "connect_s": agents["connect_s"],
        "wave_s": outcome["wave_s"],
        "online_after_wave": outcome["online_after_wave"],
        "connected_after_wave": agents["connected_after_wave"],
        **feed_figures(outcome["feed"], outcome["start"], outcome["end"]),
        "handshake_timeouts": sum(n for cause, n in losses.items() if "handshake" in cause),
        "agent_connection_losses": losses,
        "agent_connection_losses_in_wave": agents["connection_losses_in_wave"],
        "alerts_opened": figures["alerts_opened"],
        "nodes_in_lost_incidents": figures["nodes_in_lost_incidents"],
        "evaluate_fleet": detect,
        "pages": outcome["pages"],
        "cpu_pct": outcome["cpu_pct"],
        "sent": agents["sent_gpu_samples"],
        "stored": figures["stored"],
        "lost": agents["sent_gpu_samples"] - figures["stored"],
        "unacked_frames_at_end": agents["unacked_frames"],  # still in the agents' outboxes when they stopped
        "stack_restarts": restarts,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "versions": {**versions(), "celery": _version("celery")},
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main(argv: list[str] | None = None) -> int:
    from bench.cleanup import exit_on_sigterm

    exit_on_sigterm()
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scrape-cost benchmark: /metrics of the real server with N simulated agents x G GPUs sending every interval.

    .venv/bin/python bench/metrics.py --nodes 1000 --gpus 8 --json

Starts an embedded Redis and the ASGI server on a fresh database with a scrape token, connects N agents (the
real agent code with simulated GPUs, all in one helper process: bench/ingest.py's agents role), waits until
every node has sent samples, then scrapes /metrics through the real endpoint once every --period seconds, as a
Prometheus would (asking for gzip, unless --plain; a server that does not gzip answers plain text), either on
the main port through Django (`--route django`) or on the web process's own metrics listener (`--route
listener`, LAYERCAKE_METRICS_LISTEN: a thread that does not go through the event loop). Prints, for
the first (cold: the inventory and topology read and every family rendered) and the later scrapes: the wall time
of the scrape (request to last byte), the time to the response's headers, the bytes (unzipped and on the wire)
and series, the CPU the server's render thread spent (`layercake_metrics_render_cpu_seconds_total`, which the
server measures with time.thread_time around its database reads and rendering) as a share of one core at one
scrape per period, and the CPU of the server (its process and any child process of it) and of the agents'
process over each period.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import SPEC_BY_GPUS, make_fleet, setup_django  # noqa: E402

TOKEN = "bench-scrape-token-0123456789"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8, choices=sorted(SPEC_BY_GPUS))
    parser.add_argument("--interval", type=float, default=1.0, help="the agents' sampling interval, s")
    parser.add_argument("--period", type=float, default=15.0, help="seconds between scrapes")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--plain", action="store_true", help="scrape without Accept-Encoding: gzip (Prometheus asks for gzip)"
    )
    parser.add_argument("--log-dir", default="", help="keep the servers' logs here (default: a temp dir)")
    parser.add_argument(
        "--route",
        choices=("django", "listener"),
        default="django",
        help="scrape /metrics on the main port (Django) or on the metrics listener (LAYERCAKE_METRICS_LISTEN)",
    )
    return parser.parse_args(argv)


def scrape(url: str) -> tuple[float, bytes]:
    return timed_scrape(url)[::2]


def timed_scrape(url: str, compressed: bool = False) -> tuple[float, float, bytes, int]:
    """Request to last byte, request to the response's headers, the body (unzipped) and its size on the wire."""
    headers = {"Authorization": f"Bearer {TOKEN}"} | ({"Accept-Encoding": "gzip"} if compressed else {})
    began = time.monotonic()
    with urllib.request.urlopen(
        urllib.request.Request(url + "/metrics", headers=headers), timeout=60
    ) as response:
        headers_s = time.monotonic() - began
        body = response.read()
        zipped = response.headers.get("Content-Encoding") == "gzip"
    wall = time.monotonic() - began
    return wall, headers_s, gzip.decompress(body) if zipped else body, len(body)


def sample_value(body: bytes, name: bytes) -> float:
    """The value of an unlabelled sample in the exposition text."""
    for line in body.splitlines():
        if line.startswith(name + b" "):
            return float(line.split()[1])
    raise ValueError(f"{name.decode()} not in the scrape")


def count_lines(body: bytes, prefix: bytes) -> int:
    return sum(1 for line in body.splitlines() if line.startswith(prefix))


def wait_for_samples(url: str, expected_gpus: int, timeout: float) -> None:
    """Until every GPU has a reading in the live state (the scrape shows them all)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count_lines(scrape(url)[1], b"layercake_gpu_temperature_celsius{") >= expected_gpus:
            return
        time.sleep(2.0)
    raise TimeoutError(f"not every one of {expected_gpus} GPUs reported within {timeout} s")


def wait_for_hellos(count: int, timeout: float, agents: subprocess.Popen, log: Path) -> float:
    from dashboard.models import Node

    began = time.monotonic()
    while Node.objects.filter(connected=True).count() < count:
        if agents.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"the agents' process ended ({agents.returncode}) before every hello:\n{tail}")
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"not every one of {count} agents said hello within {timeout} s")
        time.sleep(1.0)
    return time.monotonic() - began


def cpu_seconds(pid: int) -> float:
    """The CPU seconds of the server and of its live child processes (the /metrics render process)."""
    return sum(_stat_cpu(stat) for stat in (_stat(pid), *_child_stats(pid)) if stat) / os.sysconf(
        "SC_CLK_TCK"
    )


def _stat(pid: int | str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
        return []


def _child_stats(pid: int) -> list[list[str]]:
    stats = (_stat(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [stat for stat in stats if stat and int(stat[1]) == pid]  # stat[1]: the parent's pid


def _stat_cpu(stat: list[str]) -> int:
    return int(stat[11]) + int(stat[12])  # utime + stime, in clock ticks


RENDER_COUNTER = b"layercake_metrics_render_cpu_seconds_total"
LOAD_AT_START = os.getloadavg()  # uptime's three figures when the benchmark started


def cold_scrape(url: str) -> dict:
    """The first scrape once every node said hello: the inventory and topology are read, every family rendered.
    A scrape's exposition counts the render CPU of the scrapes before it, so the next one tells this one's."""
    wall, body = scrape(url)
    after = scrape(url)[1]
    return {
        "wall_s": wall,
        "render_cpu_s": sample_value(after, RENDER_COUNTER) - sample_value(body, RENDER_COUNTER),
    }


def measure(args: argparse.Namespace, url: str, server_pid: int, agents_pid: int) -> list[dict]:
    """One scrape every period: each one's wall time, bytes, series, render CPU and the server's and the
    agents' CPU meanwhile (the agents share this machine's cores with the server in this benchmark)."""
    rows: list[dict] = []
    for n in range(args.scrapes + 1):  # the last one only reads the render CPU of the one before
        began, cpu_before, agents_before = time.monotonic(), cpu_seconds(server_pid), cpu_seconds(agents_pid)
        wall, headers_s, body, wire = timed_scrape(url, not args.plain)
        rows.append({"wall_s": wall, "headers_s": headers_s, "bytes": len(body), "wire_bytes": wire,
                     "series": count_lines(body, b"layercake_"),
                     "counter": sample_value(body, RENDER_COUNTER)})  # fmt: skip
        if n == args.scrapes:
            break
        time.sleep(max(0.0, began + args.period - time.monotonic()))
        rows[-1]["server_cpu_s"] = cpu_seconds(server_pid) - cpu_before
        rows[-1]["agents_cpu_s"] = cpu_seconds(agents_pid) - agents_before
    for row, following in zip(rows, rows[1:], strict=False):
        row["render_cpu_s"] = following["counter"] - row["counter"]
    return rows[:-1]


def run(args: argparse.Namespace) -> dict:
    from dashboard import stack

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(args.log_dir or tmp)
        log.mkdir(parents=True, exist_ok=True)
        setup_django(log / "bench.sqlite3")
        redis_port, port, metrics_port = stack.free_port(), stack.free_port(), stack.free_port()
        services = [stack.redis_service(redis_port, log).start()]
        stack.wait_for_port(redis_port)
        env = {
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "DATABASE_URL": os.environ["DATABASE_URL"],
            "LAYERCAKE_METRICS_TOKEN": TOKEN,
        } | ({"LAYERCAKE_METRICS_LISTEN": f"127.0.0.1:{metrics_port}"} if args.route == "listener" else {})
        server = stack.asgi_service(port, env, log).start()
        services.append(server)
        url = f"http://127.0.0.1:{port}"
        scrape_url = url if args.route == "django" else f"http://127.0.0.1:{metrics_port}"
        try:
            stack.wait_for_port(port)
            stack.wait_for_port(metrics_port if args.route == "listener" else port)
            tokens, _ = make_fleet(args.nodes)
            (log / "tokens").write_text("\n".join(tokens))
            agents = start_agents(args, url, log)
            hellos_s = wait_for_hellos(args.nodes, 600, agents, log / "agents.log")
            cold = cold_scrape(scrape_url)
            (log / "ready").touch()
            wait_for_samples(scrape_url, args.nodes * args.gpus, timeout=120)
            scrapes = measure(args, scrape_url, server.proc.pid, agents.pid)
            agents.wait(timeout=args.scrapes * args.period + 120)
        finally:
            for service in reversed(services):
                service.stop()
    return summarize(args, cold, scrapes, hellos_s)


def start_agents(args: argparse.Namespace, url: str, log: Path) -> subprocess.Popen:
    seconds = args.scrapes * args.period + 60  # past the last scrape
    argv = [
        sys.executable, str(ROOT / "bench" / "ingest.py"), "--role", "agents", "--server", url,
        "--tokens", str(log / "tokens"), "--ready-file", str(log / "ready"), "--agents", str(args.nodes),
        "--gpus", str(args.gpus), "--interval", str(args.interval), "--seconds", str(seconds),
    ]  # fmt: skip
    with (log / "agents.log").open("ab") as out:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def summarize(args: argparse.Namespace, cold: dict, scrapes: list[dict], hellos_s: float) -> dict:
    render = [s["render_cpu_s"] for s in scrapes]
    return {
        "route": args.route,
        "load_at_start": [round(x, 2) for x in LOAD_AT_START],
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "agent_interval_s": args.interval,
        "scrape_period_s": args.period,
        "hellos_s": round(hellos_s, 1),
        "series": scrapes[0]["series"],
        "bytes": scrapes[0]["bytes"],
        "wire_bytes": scrapes[0]["wire_bytes"],
        "cold_scrape_s": round(cold["wall_s"], 3),
        "cold_render_cpu_s": round(cold["render_cpu_s"], 3),
        "scrape_s": [round(s["wall_s"], 3) for s in scrapes],
        "headers_s": [round(s["headers_s"], 3) for s in scrapes],
        "render_cpu_s": [round(r, 3) for r in render],
        "max_scrape_s": round(max(s["wall_s"] for s in scrapes), 3),
        "render_core_share_pct": round(100 * statistics.mean(render) / args.period, 2),
        "server_core_share_pct": round(
            100 * statistics.mean(s["server_cpu_s"] for s in scrapes) / args.period, 1
        ),
        "agents_core_share_pct": round(
            100 * statistics.mean(s["agents_cpu_s"] for s in scrapes) / args.period, 1
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scrapes < 1 or args.nodes < 1:
        raise SystemExit("--scrapes and --nodes must be at least 1")
    print(json.dumps(run(args), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m agents run --server URL --token TOKEN [--interval S] [--gpu-source nvml|sim:SPEC]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from agents.gpus import make_source
from agents.gpus.base import GpuSourceError
from agents.ring import OutboxBusy
from agents.runner import Agent, AgentRejected, LogTailer, default_run_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agents", description="layercake node agent")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="sample this node's GPUs and push them to the server")
    run.add_argument("--server", required=True, help="dashboard URL, e.g. http://10.0.0.5:8000")
    run.add_argument("--token", default=os.environ.get("LAYERCAKE_TOKEN", ""),
                     help="agent token from `manage.py agent_token NODE` (or $LAYERCAKE_TOKEN)")
    run.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    run.add_argument("--gpu-source", default="nvml", help="nvml (default) or sim:SPEC, e.g. sim:a30x4")
    run.add_argument("--buffer-seconds", type=float, default=600.0,
                     help="how much to keep while the server is unreachable (default 600)")
    run.add_argument("--log", action="append", default=[], metavar="SOURCE=PATH",
                     help="tail a log file and send its lines under SOURCE (repeatable)")
    run.add_argument("--model-dir", action="append", default=[], type=Path, metavar="DIR",
                     help="models may only be launched from under these directories (repeatable)")
    run.add_argument("--run-dir", type=Path, default=default_run_dir(),
                     help="where supervised inference servers keep their logs and state "
                          "(default ~/.local/state/layercake-agent)")
    run.add_argument("--disk-outbox", action="store_true",
                     help="keep unsent samples in RUN_DIR/outbox.sqlite3, so that they survive a restart of "
                          "the agent (bounded like --buffer-seconds)")
    return parser


def parse_tailers(specs: list[str]) -> list[LogTailer]:
    tailers = []
    for spec in specs:
        source, sep, path = spec.partition("=")
        if not sep or not source or not path:
            raise ValueError(f"--log expects SOURCE=PATH, got {spec!r}")
        tailers.append(LogTailer(source=source, path=Path(path)))
    return tailers


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not args.token:
        print("error: --token is required (or set LAYERCAKE_TOKEN)", file=sys.stderr)
        return 1
    if not 0.05 <= args.interval <= 3600:
        print("error: --interval must be between 0.05 and 3600 seconds", file=sys.stderr)
        return 1
    try:
        tailers = parse_tailers(args.log)
        source = make_source(args.gpu_source)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except GpuSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        agent = Agent(args.server, args.token, source, args.interval, args.buffer_seconds, tailers,
                      model_dirs=args.model_dir, run_dir=args.run_dir, disk_outbox=args.disk_outbox)
        asyncio.run(agent.run())
    except OutboxBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except AgentRejected as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 0
    finally:
        source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

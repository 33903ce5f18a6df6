"""`layercake-agent run` (or `python -m agents run`): sample this node's GPUs and push them to the server.

Every option can also come from a LAYERCAKE_* variable or an `--env-file` (see agents/config.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from agents.config import ConfigError, Setting, boolean, environment, resolve, seconds, url
from agents.gpus import make_source
from agents.gpus.base import GpuSourceError
from agents.ring import OutboxBusy
from agents.runner import Agent, AgentRejected, LogTailer, default_run_dir


def log_tailer(spec: str) -> LogTailer:
    source, sep, path = spec.partition("=")
    if not sep or not source or not path:
        raise ValueError(f"expected SOURCE=PATH, got {spec!r}")
    return LogTailer(source=source, path=Path(path))


SETTINGS = (
    Setting(
        "server",
        "--server",
        "LAYERCAKE_SERVER",
        url,
        required=True,
        metavar="URL",
        help="dashboard URL, e.g. http://10.0.0.5:8000",
    ),
    Setting(
        "token",
        "--token",
        "LAYERCAKE_TOKEN",
        str,
        required=True,
        help="agent token from `manage.py agent_token NODE`",
    ),
    Setting(
        "interval",
        "--interval",
        "LAYERCAKE_INTERVAL",
        seconds,
        lambda: 1.0,
        bounds=(0.05, 3600),
        metavar="S",
        help="seconds between samples (default 1)",
    ),
    Setting(
        "gpu_source",
        "--gpu-source",
        "LAYERCAKE_GPU_SOURCE",
        str,
        lambda: "nvml",
        help="nvml (default) or sim:SPEC, e.g. sim:a30x4 (needs layercake-agent-sim)",
    ),
    Setting(
        "buffer_seconds",
        "--buffer-seconds",
        "LAYERCAKE_BUFFER_SECONDS",
        seconds,
        lambda: 600.0,
        bounds=(0, 7 * 86400),
        metavar="S",
        help="how much to keep while the server is unreachable (default 600)",
    ),
    Setting(
        "log",
        "--log",
        "LAYERCAKE_LOG",
        log_tailer,
        list,
        many=True,
        metavar="SOURCE=PATH",
        help="tail a log file and send its lines under SOURCE (repeatable)",
    ),
    Setting(
        "model_dir",
        "--model-dir",
        "LAYERCAKE_MODEL_DIRS",
        Path,
        list,
        many=True,
        metavar="DIR",
        help="models may only be launched from under these directories (repeatable)",
    ),
    Setting(
        "run_dir",
        "--run-dir",
        "LAYERCAKE_RUN_DIR",
        Path,
        default_run_dir,
        metavar="DIR",
        help="where supervised inference servers keep their logs and state "
        "(default ~/.local/state/layercake-agent)",
    ),
    Setting(
        "disk_outbox",
        "--disk-outbox",
        "LAYERCAKE_DISK_OUTBOX",
        boolean,
        lambda: False,
        help="keep unsent samples in RUN_DIR/outbox.sqlite3, so that they survive a restart of the agent "
        "(bounded like --buffer-seconds)",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    prog = "layercake-agent" if Path(sys.argv[0]).name == "layercake-agent" else "python -m agents"
    parser = argparse.ArgumentParser(prog=prog, description="layercake node agent")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="sample this node's GPUs and push them to the server",
        description="Flags win over --env-file, which wins over the environment.",
    )
    for setting in SETTINGS:
        setting.add_to(run)
    run.add_argument(
        "--env-file",
        type=Path,
        metavar="PATH",
        help="read LAYERCAKE_* settings from KEY=VALUE lines (no shell evaluation)",
    )
    return parser


def configure(args: argparse.Namespace) -> None:
    """Complete the parsed flags from the env file and the environment; ConfigError if a value is wrong."""
    values = environment(os.environ, args.env_file, {setting.env for setting in SETTINGS})
    resolve(args, SETTINGS, values)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        configure(args)
        source = make_source(args.gpu_source)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except GpuSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        agent = Agent(
            args.server,
            args.token,
            source,
            args.interval,
            args.buffer_seconds,
            args.log,
            model_dirs=args.model_dir,
            run_dir=args.run_dir,
            disk_outbox=args.disk_outbox,
        )
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

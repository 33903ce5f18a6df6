"""SIGTERM (what `timeout` and systemd send) ends a benchmark the way Ctrl-C does: its `finally` blocks run, so
the Redis, uvicorn, echo server and agent processes it started stop with it instead of running on."""

from __future__ import annotations

import signal
import sys
from types import FrameType


def exit_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)

"""A benchmark ended by SIGTERM (what `timeout` sends) stops every process it started (issue #13)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import wait_until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent.parent


def children_of(pid: int) -> set[int]:
    """Every living process whose parent is `pid`, and theirs."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_it_stops_redis_uvicorn_echo_and_agents_when_the_ingest_benchmark_gets_sigterm(tmp_path):
    argv = ["bench/ingest.py", "--agents", "2", "--gpus", "2", "--seconds", "60", "--processes", "2"]
    # redis, two uvicorn processes, the echo server and the agents' helper process
    assert_sigterm_stops_all(argv, tmp_path, at_least=5)


def test_it_stops_the_whole_stack_and_agents_when_the_full_stack_benchmark_gets_sigterm(tmp_path):
    argv = ["bench/fullstack.py", "--agents", "2", "--gpus", "2", "--seconds", "120", "--settle", "0"]
    # runstack, redis, uvicorn, three Celery workers (each with its pool process), beat, the agents process;
    # in its window, with the operator's pages being opened (their thread waited for the window's end)
    assert_sigterm_stops_all(argv, tmp_path, at_least=10, after_ready_s=3)


def assert_sigterm_stops_all(
    argv: list[str], tmp_path: Path, at_least: int, after_ready_s: float = 0
) -> None:
    bench = subprocess.Popen(
        [sys.executable, *argv, "--log-dir", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), timeout=120, what="the agents running")
        time.sleep(after_ready_s)
        started = children_of(bench.pid)
        assert len(started) >= at_least, started
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while started & alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not started & alive(), [Path(f"/proc/{p}/cmdline").read_text() for p in started & alive()]
    finally:
        bench.kill()
        for pid in children_of(bench.pid):
            os.kill(pid, signal.SIGKILL)


def alive() -> set[int]:
    return {int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if _running(p)}


def _running(stat: Path) -> bool:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

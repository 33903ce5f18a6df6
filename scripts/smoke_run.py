"""The README's first command, run as a new user would: `./run.sh` in this checkout, then check the stack.

Usage: python3 scripts/smoke_run.py [--timeout 600]   (stdlib only: it runs before any virtualenv exists)

Checks, each within the time limit: the login page answers 200, the Celery worker answers a ping, beat has
run a periodic task, the demo nodes are online, the demo deployment reaches Ready; then SIGTERM stops the
whole stack within 10 s. A failure names the component, prints its log tail and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "var" / "log"
RUN_OUTPUT = Path(tempfile.gettempdir()) / "layercake-smoke-run.log"
DEMO_NODES = 4
STOP_WITHIN_S = 10

# One query for everything the checks read from the database, through the stack's own virtualenv.
STATE_QUERY = """
import json
from dashboard.models import Deployment, Node
print(json.dumps({
    "online": sorted(n.name for n in Node.objects.all() if n.status() == "online"),
    "deployments": {d.name: d.state for d in Deployment.objects.all()},
}))
"""


class SmokeFailure(Exception):
    def __init__(self, component: str, message: str) -> None:
        super().__init__(f"{component}: {message}")
        self.component = component


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_stack(port: int) -> subprocess.Popen:
    output = open(RUN_OUTPUT, "w")  # noqa: SIM115 - lives as long as the stack
    return subprocess.Popen(
        ["./run.sh", "--port", str(port)],
        cwd=REPO,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PIP_NO_CACHE_DIR": "1"},
    )


def wait_until(
    component: str, what: str, check: Callable[[], bool], deadline: float, stack: subprocess.Popen
) -> None:
    while time.monotonic() < deadline:
        if stack.poll() is not None:
            raise SmokeFailure(component, f"./run.sh exited with {stack.returncode} before {what}")
        try:
            if check():
                print(f"ok   {component}: {what}", flush=True)
                return
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
        time.sleep(2)
    raise SmokeFailure(component, f"not {what} in time")


def login_page_answers(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=5) as response:
        return response.status == 200


def venv_run(*args: str, timeout: float = 60) -> str:
    env = {**os.environ, **redis_env()}
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), *args],
        cwd=REPO,
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def redis_env() -> dict[str, str]:
    """The stack's Redis URL as the stack recorded it (the embedded Redis is on a port of its choosing)."""
    recorded = REPO / "var" / "redis-url.txt"
    if "REDIS_URL" in os.environ or not recorded.exists():
        return {}
    return {"REDIS_URL": recorded.read_text().strip()}


def worker_answers_ping() -> bool:
    return "pong" in venv_run("-m", "celery", "-A", "layercake", "inspect", "ping", "--timeout", "5")


def periodic_tasks_run() -> int:
    """Runs of beat-only tasks the worker has executed (django-celery-beat writes its own counts only every
    few minutes, so the worker's statistics are the prompt evidence that beat is sending)."""
    stats = json.loads(
        venv_run("-m", "celery", "-A", "layercake", "inspect", "stats", "--json", "--timeout", "5")
    )
    return sum(
        count
        for worker in stats.values()
        for name, count in worker.get("total", {}).items()
        if name.endswith((".evaluate_fleet", ".announce_silent_nodes"))
    )


def stack_state() -> dict:
    return json.loads(venv_run("manage.py", "shell", "-c", STATE_QUERY).strip().splitlines()[-1])


def run_checks(port: int, stack: subprocess.Popen, deadline: float) -> None:
    wait_until("uvicorn", "login page answers 200", lambda: login_page_answers(port), deadline, stack)
    wait_until("celery-worker", "answers a ping", worker_answers_ping, deadline, stack)
    wait_until("celery-beat", "ran a periodic task", lambda: periodic_tasks_run() > 0, deadline, stack)
    wait_until(
        "agents",
        f"{DEMO_NODES} demo nodes online",
        lambda: len(stack_state()["online"]) == DEMO_NODES,
        deadline,
        stack,
    )
    wait_until(
        "deploy-demo",
        "demo deployment Ready",
        lambda: "ready" in stack_state()["deployments"].values(),
        deadline,
        stack,
    )


def stop_stack(stack: subprocess.Popen) -> None:
    """SIGTERM to run.sh (runstack) alone, as systemd or kill would: it must take its whole stack down."""
    started = descendants(stack.pid)
    stack.send_signal(signal.SIGTERM)
    try:
        stack.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired as exc:
        raise SmokeFailure("runstack", f"still running {STOP_WITHIN_S} s after SIGTERM") from exc
    time.sleep(0.5)
    left = [command_line(pid) for pid in started if running(pid)]
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        raise SmokeFailure("runstack", f"processes left after SIGTERM: {left}")
    print(f"ok   runstack: stopped everything within {STOP_WITHIN_S} s of SIGTERM", flush=True)


def descendants(root: int) -> list[int]:
    """Every process below `root` (its children start sessions of their own, so a session id misses them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
        except OSError:
            continue
        children.setdefault(int(rest.rsplit(") ", 1)[1].split()[1]), []).append(int(pid))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return sorted(found)


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child its parent has not reaped yet is gone for our purpose)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[1].split()[0] not in ("Z", "X")


def command_line(pid: int) -> str:
    try:
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return str(pid)


def kill_everything(stack: subprocess.Popen) -> None:
    """After a failure leave nothing running: run.sh and every process below it, whatever its session."""
    for pid in [*descendants(stack.pid), stack.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def print_log_tails(component: str) -> None:
    named = sorted(LOGS.glob(f"{component}*.log")) if LOGS.is_dir() else []
    for path in [RUN_OUTPUT, *named]:
        if path.exists():
            print(f"--- last lines of {path} ---", file=sys.stderr)
            print("\n".join(path.read_text(errors="replace").splitlines()[-40:]), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds for install, start and every check"
    )
    args = parser.parse_args()
    port, started = free_port(), time.monotonic()
    stack = start_stack(port)
    try:
        run_checks(port, stack, started + args.timeout)
        stop_stack(stack)
    except SmokeFailure as failure:
        print(f"FAIL {failure}", file=sys.stderr)
        print_log_tails(failure.component)
        kill_everything(stack)
        return 1
    print(f"fresh-machine smoke test passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's first command: `manage.py runstack` (what ./run.sh execs after setup) brings up the whole stack."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from dashboard import stack
from dashboard.management.commands.runstack import DEMO_FLEET
from tests.e2e import login

pytestmark = pytest.mark.slow


def read_until(proc: subprocess.Popen, pattern: str, timeout: float = 90) -> re.Match:
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        match = re.search(pattern, seen)
        if match:
            return match
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"runstack did not print {pattern!r}; it printed:\n{seen}")


def test_it_runs_the_stack_with_an_embedded_redis_and_a_demo_fleet(tmp_path):
    port = stack.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env |= {"DATABASE_URL": f"sqlite:///{tmp_path / 'run.sqlite3'}", "PYTHONUNBUFFERED": "1",
            "LAYERCAKE_VAR": str(tmp_path / "var")}
    proc = subprocess.Popen([sys.executable, "manage.py", "runstack", "--port", str(port)], cwd=stack.BASE_DIR,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        read_until(proc, r"embedded Redis on 127\.0\.0\.1:\d+")
        read_until(proc, r"demo deployment \w+: Qwen3-VL-32B-Instruct (as vllm TP=1 PP=4|already \w+) on a30-seed")
        read_until(proc, rf"layercake is running: http://127\.0\.0\.1:{port}/")
        creds = read_until(proc, r"log in as (\S+) / (\S+)")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            login(client, creds[1], creds[2])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                page = client.get("/").text
                if page.count(">Online<") == len(DEMO_FLEET):
                    break
                time.sleep(0.5)
        assert all(f">{name}<" in page for name, _ in DEMO_FLEET)
        assert page.count(">Online<") == len(DEMO_FLEET) == page.count("simulated</span>") == 4
        assert "Qwen3-VL-32B-Instruct" in page  # the demo deployment, listed with its state
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        kill_supervised_servers(tmp_path / "var" / "agents")
    assert proc.returncode == 0


def kill_supervised_servers(run_dirs) -> None:
    """Inference servers outlive their agents by design; the test ends the demo's."""
    for state in run_dirs.glob("*/*.json"):
        pid = json.loads(state.read_text()).get("pid")
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

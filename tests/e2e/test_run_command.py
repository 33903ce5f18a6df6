"""The README's first command: `manage.py runstack` (what ./run.sh execs after setup) brings up the whole stack,
checks each part is up before it says so, keeps its secrets and files private, and restarts a part that dies
without taking the others (the agents above all) down with it."""

import contextlib
import json
import os
import re
import signal
import smtplib
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis

from dashboard import stack
from dashboard.management.commands.runstack import DEMO_FLEET
from tests.harness import login

pytestmark = pytest.mark.slow


@dataclass
class RunStack:
    """`manage.py runstack` as a child process; its output is collected by a thread as it comes."""

    proc: subprocess.Popen
    var: Path
    database: Path
    port: int
    lines: list[str] = field(default_factory=list)

    def collect(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output)
            if match:
                return match
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the last lines
                match = re.search(pattern, self.output)
                if match:
                    return match
                break
            time.sleep(0.1)
        raise AssertionError(f"runstack did not print {pattern!r}; it printed:\n{self.output}")

    def children(self) -> dict[int, str]:
        """pid -> command line of runstack's child processes."""
        found = {}
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, IndexError):
                if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(
                    self.proc.pid
                ):
                    found[int(entry.name)] = (entry / "cmdline").read_text().replace("\0", " ")
        return found

    def child(self, needle: str) -> int:
        (pid,) = [pid for pid, cmd in self.children().items() if needle in cmd]
        return pid


def start_runstack(tmp_path: Path, port: int, *options: str) -> RunStack:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "SECRET_KEY")}
    database = tmp_path / "run.sqlite3"
    env |= {
        "DATABASE_URL": f"sqlite:///{database}",
        "PYTHONUNBUFFERED": "1",
        "LAYERCAKE_VAR": str(tmp_path / "var"),
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--port", str(port), *options],
        cwd=stack.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    running = RunStack(proc, tmp_path / "var", database, port)
    threading.Thread(target=running.collect, daemon=True).start()
    return running


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One demo stack for the tests below, in order: they look at it, then break parts of it."""
    tmp_path, port = tmp_path_factory.mktemp("runstack"), stack.free_port()
    running = start_runstack(tmp_path, port)
    try:
        running.wait_for(rf"layercake is running: http://127\.0\.0\.1:{port}/", timeout=240)
        yield running
    finally:
        if running.proc.poll() is None:
            os.killpg(running.proc.pid, signal.SIGINT)
            running.proc.wait(timeout=30)
        kill_supervised_servers(tmp_path / "var" / "agents")


def test_it_runs_the_stack_with_an_embedded_redis_and_a_demo_fleet(demo):
    demo.wait_for(r"embedded Redis on 127\.0\.0\.1:\d+")
    demo.wait_for(r"demo deployment \w+: Qwen3-VL-32B-Instruct (as vllm TP=1 PP=4|already \w+) on a30-seed")
    creds = demo.wait_for(r"log in as (\S+) / (\S+)")
    with httpx.Client(base_url=f"http://127.0.0.1:{demo.port}") as client:
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
    # Every part was up before it said so: the worker answered a ping and beat had sent a task.
    assert "Sending due task" in (demo.var / "log" / "celery-beat.log").read_text()


def test_it_runs_an_smtp_sink_for_the_demo_and_lists_what_it_received(demo):
    demo.wait_for(r"demo mail: alert mails to admin@localhost are listed at /demo/mails/")
    port = sink_port(demo)
    message = "Subject: [layercake] sink check\r\nTo: admin@localhost\r\n\r\nkept for the demo page\r\n"
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail("layercake@localhost", ["admin@localhost"], message)
    creds = demo.wait_for(r"log in as (\S+) / (\S+)")
    with httpx.Client(base_url=f"http://127.0.0.1:{demo.port}") as client:
        login(client, creds[1], creds[2])
        page = client.get("/demo/mails/").text
    assert "[layercake] sink check" in page and "kept for the demo page" in page


def sink_port(demo) -> int:
    command = demo.children()[demo.child("dashboard.mailsink")].split()
    return int(command[command.index("--port") + 1])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_it_keeps_var_the_database_the_logs_and_its_secrets_private(demo):
    assert mode(demo.var) == 0o700
    assert mode(demo.database) == 0o600
    logs = sorted((demo.var / "log").glob("*.log"))
    assert {"asgi.log", "celery-worker.log", "agent-a30-seed.log", "redis.log"} <= {p.name for p in logs}
    assert {p.name: mode(p) for p in logs} == {p.name: 0o640 for p in logs}
    for secret in ("secret-key", "redis-password", "redis.conf", "admin-login.txt"):
        assert mode(demo.var / secret) == 0o600, secret
    password = (demo.var / "admin-login.txt").read_text().strip()
    assert password not in (demo.var / "log" / "runstack.log").read_text()


def test_it_protects_the_embedded_redis_with_a_password_every_child_has(demo):
    port = int(demo.wait_for(r"embedded Redis on 127\.0\.0\.1:(\d+)")[1])
    with redis.Redis(port=port, socket_timeout=5) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    url = f"redis://:{(demo.var / 'redis-password').read_text().strip()}@127.0.0.1:{port}/0"
    assert stack.redis_answers(url)
    for needle in (
        "uvicorn",
        "worker -Q celery",
        "worker -Q detect",
        "worker -Q notify",
        "celery -A layercake beat",
    ):
        environ = Path(f"/proc/{demo.child(needle)}/environ").read_bytes().split(b"\0")
        assert f"REDIS_URL={url}".encode() in environ, needle  # Channels layer, Celery broker and results
    assert (demo.var / "redis-password").read_text().strip() not in " ".join(demo.children().values())


def samples_per_node(database: Path, since: float) -> dict[str, list[float]]:
    """Sample times of each node's GPU 0 since `since` (epoch seconds)."""
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT n.name, s.t FROM dashboard_gpusample s JOIN dashboard_gpu g ON s.gpu_id = g.id "
            'JOIN dashboard_node n ON g.node_id = n.id WHERE g."index" = 0 ORDER BY s.t'
        ).fetchall()
    times: dict[str, list[float]] = {}
    for name, t in rows:
        epoch = datetime.fromisoformat(t).replace(tzinfo=UTC).timestamp()
        if epoch >= since:
            times.setdefault(name, []).append(epoch)
    return times


def test_it_restarts_a_killed_redis_and_the_agents_keep_running_and_lose_nothing(demo):
    old_redis = demo.child("redis-server")
    agents = {pid for pid, cmd in demo.children().items() if "-m agents run" in cmd}
    assert len(agents) == len(DEMO_FLEET)
    before = time.time() - 5
    os.kill(old_redis, signal.SIGKILL)
    demo.wait_for(r"redis exited \(signal 9\); restarting in 1 s \(restart 1\)", timeout=30)
    new_redis = int(demo.wait_for(r"redis restarted \(pid (\d+)\)", timeout=30)[1])
    assert new_redis != old_redis and demo.child("redis-server") == new_redis
    time.sleep(15)  # the agents reconnect (the server's consumers lost Redis) and replay
    assert demo.proc.poll() is None
    assert agents <= set(demo.children()), "an agent was stopped or restarted"
    times = samples_per_node(demo.database, before)
    assert sorted(times) == sorted(name for name, _ in DEMO_FLEET)
    for name, sampled in times.items():
        gaps = [b - a for a, b in zip(sampled, sampled[1:], strict=False)]
        # One sample a second (AGENT_INTERVAL): a sample lost anywhere leaves a gap of two seconds or more.
        assert max(gaps) < 1.9, f"{name}: a {max(gaps):.1f} s gap in its samples around the Redis restart"
        assert sampled[-1] > time.time() - 5, f"{name}: no samples since Redis came back"


def test_it_stops_every_child_on_sigterm(demo):
    children = demo.children()
    started = time.monotonic()
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 10
    assert not set(children) & set(demo.children()) and not any(alive(pid) for pid in children)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_it_exits_naming_the_part_that_failed_to_start_and_never_says_running(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()  # something else holds the port: uvicorn exits at start
        running = start_runstack(tmp_path, squatter.getsockname()[1])
        assert running.proc.wait(timeout=180) == 1
    running.wait_for(r"layercake did not start: asgi exited \(code \d+\) during start-up")
    assert "address already in use" in running.output  # the last lines of asgi.log
    assert "layercake is running" not in running.output and "log in as" not in running.output
    assert not processes_with(f"LAYERCAKE_VAR={tmp_path / 'var'}"), "the Redis it started is still running"


def processes_with(variable: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and variable.encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def kill_supervised_servers(run_dirs) -> None:
    """Inference servers outlive their agents by design; the test ends the demo's."""
    for state in run_dirs.glob("*/*.json"):
        pid = json.loads(state.read_text()).get("pid")
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_it_gives_the_agents_an_asgi_process_of_their_own_when_asked(tmp_path):
    port, agent_port = stack.free_port(), stack.free_port()
    running = start_runstack(tmp_path, port, "--agent-port", str(agent_port))
    try:
        running.wait_for(rf"agents connect to http://127\.0\.0\.1:{agent_port}/", timeout=240)
        creds = running.wait_for(r"log in as (\S+) / (\S+)", timeout=240)
        servers = [
            cmd.split("--port ")[1].split()[0] for cmd in running.children().values() if "uvicorn" in cmd
        ]
        assert sorted(servers) == sorted([str(port), str(agent_port)])
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:  # the pages' process
            login(client, creds[1], creds[2])
            page = client.get("/").text
        assert page.count(">Online<") == len(DEMO_FLEET)
        assert (established(agent_port), established(port)) == (len(DEMO_FLEET), 0)  # every agent's socket
    finally:
        os.killpg(running.proc.pid, signal.SIGINT)
        running.proc.wait(timeout=30)
        kill_supervised_servers(tmp_path / "var" / "agents")


def established(port: int) -> int:
    """Open TCP connections to a local listening port (/proc/net/tcp: local address, then state 01)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        count += state == "01" and int(local.split(":")[1], 16) == port
    return count

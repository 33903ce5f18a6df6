"""`python manage.py runstack`: Redis (embedded unless REDIS_URL), the ASGI server, Celery workers (the
default queue, the detect queue for hang detection and the notify queue for alert delivery) and beat, and a demo fleet of simulated agents. Each is
checked ready before the stack says it is running; a child that exits later is restarted with backoff. Ctrl-C
stops everything."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from agents.supervisor import Child
from dashboard import roles, stack
from dashboard.models import AgentToken, Node
from dashboard.supervise import Component, Keeper, StartupFailed
from layercake.settings import private_secret

DEMO_FLEET = [
    (
        "a30-seed",
        "sim:a30x4,workload=idle",
    ),  # the field report's server: 4x A30, every pair SYS, no P2P; dedicated
    ("h100-nvlink", "sim:h100x8"),
    ("rtx4090-box", "sim:rtx4090x2"),
    ("rtx4090-box-b", "sim:rtx4090x2,workload=idle"),  # its twin: models too big for one box plan across both
]
# Logs may be read by the operator's group; nothing the stack writes is readable by other users.
STACK_UMASK = 0o027
DEMO_ADMIN_EMAIL = "admin@localhost"  # the demo admin's alert mail goes to the local sink
BEAT_SETTLE_S = 20.0


@dataclass
class StackContext:
    """What the components are built from and checked against."""

    port: int
    var_dir: Path
    log_dir: Path
    agent_port: int | None = None  # set: the agents' websockets have an ASGI process of their own there
    env: dict[str, str] = field(default_factory=dict)  # for every child: REDIS_URL of the embedded Redis
    redis_port: int | None = None  # set when the stack runs its own Redis
    redis_config: Path | None = None
    mail_port: int | None = None  # set when the demo runs its own SMTP sink (dashboard.mailsink)
    started: datetime = field(default_factory=timezone.now)

    @property
    def redis_url(self) -> str:
        return self.env.get("REDIS_URL") or os.environ["REDIS_URL"]


def mail_sink_answers(context: StackContext, service: stack.Service) -> bool:
    return stack.port_answers(context.mail_port)


def login_page_answers(context: StackContext, service: stack.Service) -> bool:
    return stack.http_answers(f"http://127.0.0.1:{context.port}/accounts/login/")


def agent_process_answers(context: StackContext, service: stack.Service) -> bool:
    return stack.http_answers(f"http://127.0.0.1:{context.agent_port}/accounts/login/")


def web_env(context: StackContext) -> dict[str, str]:
    """With the agents on their own process, the pages' process runs no /metrics listener: the listener shows
    its process's agents' readings, so the agents' process takes it."""
    return {**context.env, "LAYERCAKE_METRICS_LISTEN": ""} if context.agent_port else context.env


def redis_answers(context: StackContext, service: stack.Service) -> bool:
    return stack.redis_answers(context.redis_url)


def worker_answers(context: StackContext, service: stack.Service) -> bool:
    return stack.celery_worker_answers(context.redis_url, service)


def beat_is_beating(context: StackContext, service: stack.Service) -> bool:
    """It sent a periodic task (the shortest schedule is at most 10 s), or it has run for a while: with long
    intervals nothing may be due yet."""
    log = service.log_since_start()
    return "Sending due task" in log or ("beat: Starting" in log and service.up_for() >= BEAT_SETTLE_S)


def agent_connected(node: str):
    def connected(context: StackContext, service: stack.Service) -> bool:
        return Node.objects.filter(name=node, connected=True, last_seen__gte=context.started).exists()

    return connected


# The stack, in start-up order. A component is one line; `blocking` ones must answer before the next starts.
SERVER_COMPONENTS = [
    Component(
        "redis",
        lambda c: stack.redis_service(c.redis_port, c.log_dir, c.redis_config),
        redis_answers,
        blocking=True,
        when=lambda c: c.redis_port is not None,
    ),
    Component(
        "smtp-sink",
        lambda c: stack.mail_sink_service(c.mail_port, Path(c.env["DEMO_MAIL_DIR"]), c.log_dir),
        mail_sink_answers,
        blocking=True,
        when=lambda c: c.mail_port is not None,
    ),
    Component(
        "asgi", lambda c: stack.asgi_service(c.port, web_env(c), c.log_dir), login_page_answers, blocking=True
    ),
    # At a fleet's size (hundreds of agents, each frame every second) pages in the agents' process waited for
    # the interpreter lock behind their frames: the fleet page's worst request at 1,000 x 8 was 320-330 ms
    # for ~80 ms of its own work (bench/README.md). `--agent-port` gives the agents a process of their own.
    Component(
        "asgi-agents",
        lambda c: stack.asgi_service(c.agent_port, c.env, c.log_dir, name="asgi-agents"),
        agent_process_answers,
        blocking=True,
        when=lambda c: c.agent_port is not None,
    ),
    Component("celery-worker", lambda c: stack.celery_worker_service(c.env, c.log_dir), worker_answers),
    Component(
        "celery-detect", lambda c: stack.celery_detect_worker_service(c.env, c.log_dir), worker_answers
    ),
    Component(
        "celery-notify", lambda c: stack.celery_notify_worker_service(c.env, c.log_dir), worker_answers
    ),
    Component("celery-beat", lambda c: stack.celery_beat_service(c.env, c.log_dir), beat_is_beating),
]


class Command(BaseCommand):
    help = "Run the whole layercake stack with a demo fleet of simulated agents."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true", help="start no simulated agents")
        parser.add_argument(
            "--agent-port",
            type=int,
            default=os.environ.get("AGENT_PORT")
            or None,  # a string default goes through `type`: a bad one is named
            help="serve the agents' websockets from an ASGI process of their own on this port (large fleets)",
        )

    def handle(self, port: int, no_demo: bool, agent_port: int | None = None, **options):
        # `kill`, systemd and `timeout` send SIGTERM: stop the stack as Ctrl-C does, not leave it orphaned.
        signal.signal(signal.SIGTERM, stop_like_ctrl_c)
        os.umask(STACK_UMASK)
        if agent_port == port:
            raise CommandError(f"--agent-port must differ from --port ({port})")
        context = self.prepare(port, demo_mail=not no_demo and not os.environ.get("EMAIL_HOST"))
        context.agent_port = agent_port
        keeper = Keeper(context, self.say)
        try:
            self.start(keeper, context, no_demo)
            keeper.run_forever()
        except StartupFailed as exc:
            raise CommandError(f"layercake did not start: {exc}") from None
        except KeyboardInterrupt:
            self.say("stopping…")
        finally:
            keeper.stop_all()
            stop_demo_servers(context.var_dir)

    def prepare(self, port: int, demo_mail: bool = False) -> StackContext:
        var_dir, log_dir = settings.VAR_DIR, settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0)
        protect_files(var_dir, sqlite_path())
        context = StackContext(port, var_dir, log_dir)
        if not os.environ.get("REDIS_URL"):
            context.redis_port = stack.free_port()
            password = private_secret(var_dir / "redis-password")
            context.redis_config = write_private(var_dir / "redis.conf", f"requirepass {password}\n")
            context.env["REDIS_URL"] = f"redis://:{password}@127.0.0.1:{context.redis_port}/0"
            # For tools beside the stack (`celery inspect`, scripts/smoke_run.py): the embedded Redis moves each run.
            write_private(var_dir / "redis-url.txt", context.env["REDIS_URL"] + "\n")
        if demo_mail:  # alert mail goes to a local sink; /demo/mails/ lists what it received
            context.mail_port = stack.free_port()
            mail = {"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(context.mail_port)}
            context.env.update({**mail, "DEMO_MAIL_DIR": str(var_dir / "mail")})
        return context

    def start(self, keeper: Keeper, context: StackContext, no_demo: bool) -> None:
        components = SERVER_COMPONENTS + ([] if no_demo else demo_agents(context))
        keeper.start_all(components)
        if context.redis_port is not None:
            self.say(
                f"embedded Redis on 127.0.0.1:{context.redis_port} (password in {context.var_dir}/redis-password)"
            )
        if not no_demo:
            deploy_demo_model(context.env, context.log_dir, self.say)
        keeper.check_all_alive()
        protect_files(context.var_dir, sqlite_path())  # the files the children created since
        username, password = ensure_admin(context.var_dir / "admin-login.txt")
        if context.mail_port is not None:
            get_user_model().objects.filter(username=username, email="").update(email=DEMO_ADMIN_EMAIL)
            self.say(f"demo mail: alert mails to {DEMO_ADMIN_EMAIL} are listed at /demo/mails/")
        if settings.METRICS_LISTEN:  # the asgi child inherits LAYERCAKE_METRICS_LISTEN and listens there
            host, listen_port = settings.METRICS_LISTEN
            host = f"[{host}]" if ":" in host else host
            self.say(
                f"Prometheus: /metrics also on http://{host}:{listen_port}/metrics (LAYERCAKE_METRICS_LISTEN)"
            )
        if context.agent_port is not None:
            self.say(f"agents connect to http://127.0.0.1:{context.agent_port}/ (their own ASGI process)")
        self.stdout.write(self.style.SUCCESS(f"\nlayercake is running: http://127.0.0.1:{context.port}/"))
        # Not through say(): the password stays out of the logs.
        self.stdout.write(
            login_line(username, password, context.var_dir / "admin-login.txt")
            + f"   (logs in {context.log_dir}; Ctrl-C stops)\n"
        )

    def say(self, line: str) -> None:
        """To the terminal and to var/log/runstack.log."""
        self.stdout.write(line)
        self.stdout.flush()
        with (settings.VAR_DIR / "log" / "runstack.log").open("a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line.strip()}\n")


def stop_like_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable by this user only from the first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def sqlite_path() -> Path | None:
    database = settings.DATABASES["default"]
    return Path(database["NAME"]) if database["ENGINE"].endswith("sqlite3") else None


def protect_files(var_dir: Path, database: Path | None) -> None:
    """var/ 0700, the SQLite database 0600, logs 0640 (files from before the umask included)."""
    var_dir.chmod(0o700)
    if database is not None:
        for path in (database.with_name(database.name + suffix) for suffix in ("", "-wal", "-shm")):
            if path.exists():
                path.chmod(0o600)
    for log in var_dir.rglob("*.log"):
        log.chmod(0o640)


def ensure_admin(password_file: Path) -> tuple[str, str | None]:
    """An admin login for the operator, kept in var/ (mode 600). The password is returned only when it was
    made now (first run, or its file was deleted): later runs say where it is kept instead."""
    user_model, username = get_user_model(), "admin"
    user = user_model.objects.filter(username=username).first()
    if user is not None and password_file.exists():
        roles.assign_role(user, roles.ADMIN)  # made before there were roles: it joins the admin role
        return username, None
    password = secrets.token_urlsafe(12)
    user = user or user_model(username=username, is_staff=True, is_superuser=True)
    user.set_password(password)
    user.save()
    roles.assign_role(user, roles.ADMIN)
    write_private(password_file, password + "\n")
    return username, password


def login_line(username: str, password: str | None, password_file: Path) -> str:
    if password is not None:
        return f"log in as {username} / {password}"
    return f"log in as {username} (password in {password_file})"


def demo_agents(context: StackContext) -> list[Component]:
    server = f"http://127.0.0.1:{context.agent_port or context.port}"
    return [
        Component(f"agent {name}", agent_builder(server, name, spec, context.var_dir), agent_connected(name))
        for name, spec in DEMO_FLEET
    ]


def demo_servers(var_dir: Path) -> list[Child]:
    """The inference servers the demo agents started, as their state files record them (pid and start time,
    so a pid reused by another process is left alone)."""
    servers = []
    for state_file in (var_dir / "agents").glob("*/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            state = json.loads(state_file.read_text())
            servers.append(Child(int(state["pid"]), state["start_ticks"]))
    return [server for server in servers if not server.exited()]


def stop_demo_servers(var_dir: Path, grace_s: float = 1.5) -> None:
    """Agents leave their inference servers running on purpose (a restarted agent re-attaches to them); the
    demo stops them with the stack, after the agents, so that no agent reports them as crashed."""
    servers = demo_servers(var_dir)
    for server in servers:
        server.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not all(server.exited() for server in servers):
        time.sleep(0.1)
    for server in servers:
        if not server.exited():
            server.signal_group(signal.SIGKILL)


def agent_builder(server: str, name: str, spec: str, var_dir: Path):
    def build(context: StackContext) -> stack.Service:
        # The demo agents all run on this machine: the other nodes reach a multi-node head on loopback.
        node, _ = Node.objects.get_or_create(name=name, defaults={"address": "127.0.0.1"})
        node.tokens.filter(revoked=None).update(revoked=timezone.now())
        _, token = AgentToken.issue(node)
        run_dir = var_dir / "agents" / name  # one per agent: an agent adopts the servers in its dir
        extra = ["--run-dir", str(run_dir), "--model-dir", str(var_dir / "models"), "--disk-outbox"]
        return stack.agent_service(
            server, token, spec, settings.AGENT_INTERVAL, context.log_dir / f"agent-{name}.log", extra
        )

    return build


def deploy_demo_model(env: dict[str, str], log_dir: Path, say) -> None:
    """Plan and deploy the field report's model on the demo A30 node (a child process, so that it talks
    to the same Redis as the stack)."""
    demo = stack.Service(
        "deploy-demo", [sys.executable, "manage.py", "deploy_demo"], env, log_dir / "deploy-demo.log"
    ).start()
    try:
        demo.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        demo.stop()
        say(f"the demo deployment did not finish within 120 s (see {demo.log_path})")
        return
    say(demo.log_tail(1))

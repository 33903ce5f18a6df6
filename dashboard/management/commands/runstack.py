"""`python manage.py runstack`: Redis (embedded unless REDIS_URL), the ASGI server, Celery workers (the
default queue, and the notify queue for alert delivery) and beat, and a demo fleet of simulated agents.
Ctrl-C stops everything."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.utils import timezone

from dashboard import stack
from dashboard.models import AgentToken, Node

DEMO_FLEET = [
    ("a30-seed", "sim:a30x4,workload=idle"),  # the field report's server: 4x A30, every pair SYS, no P2P; dedicated
    ("h100-nvlink", "sim:h100x8"),
    ("rtx4090-box", "sim:rtx4090x2"),
    ("rtx4090-box-b", "sim:rtx4090x2,workload=idle"),  # its twin: models too big for one box plan across both
]


class Command(BaseCommand):
    help = "Run the whole layercake stack with a demo fleet of simulated agents."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true", help="start no simulated agents")

    def handle(self, port: int, no_demo: bool, **options):
        # `kill`, systemd and `timeout` send SIGTERM: stop the stack as Ctrl-C does, not leave it orphaned.
        signal.signal(signal.SIGTERM, stop_like_ctrl_c)
        log_dir = settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        call_command("migrate", verbosity=0)
        username, password = ensure_admin(settings.VAR_DIR / "admin-login.txt")
        services, env = self.start_redis(log_dir)
        services += self.start_server(port, env, log_dir)
        if not no_demo:
            services += start_demo_agents(f"http://127.0.0.1:{port}", log_dir)
            deploy_demo_model(env, log_dir)
        self.stdout.write(self.style.SUCCESS(f"\nlayercake is running: http://127.0.0.1:{port}/"))
        self.stdout.write(f"log in as {username} / {password}   (logs in {log_dir}; Ctrl-C stops)\n")
        self.wait(services)

    def start_redis(self, log_dir: Path) -> tuple[list[stack.Service], dict[str, str]]:
        """Use REDIS_URL when given; otherwise start the embedded Redis and point the children at it."""
        if os.environ.get("REDIS_URL"):
            return [], {}
        port = stack.free_port()
        service = stack.redis_service(port, log_dir).start()
        stack.wait_for_port(port, proc=service.proc)
        self.stdout.write(f"embedded Redis on 127.0.0.1:{port}")
        return [service], {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}

    def start_server(self, port: int, env: dict[str, str], log_dir: Path) -> list[stack.Service]:
        asgi = stack.asgi_service(port, env, log_dir).start()
        stack.wait_for_port(port, proc=asgi.proc)
        worker = stack.celery_worker_service(env, log_dir).start()
        notify = stack.celery_notify_worker_service(env, log_dir).start()
        beat = stack.celery_beat_service(env, log_dir).start()
        return [asgi, worker, notify, beat]

    def wait(self, services: list[stack.Service]) -> None:
        try:
            while all(s.proc.poll() is None for s in services):
                time.sleep(1)
            dead = [s.name for s in services if s.proc.poll() is not None]
            self.stderr.write(f"stopping: {', '.join(dead)} exited (see var/log/)")
        except KeyboardInterrupt:
            self.stdout.write("stopping…")
        finally:
            for service in reversed(services):
                service.stop()


def stop_like_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def ensure_admin(password_file: Path) -> tuple[str, str]:
    """An admin login for the operator; the password is kept in var/ (mode 600) so reruns can print it."""
    user_model, username = get_user_model(), "admin"
    user = user_model.objects.filter(username=username).first()
    if user is not None and password_file.exists():
        return username, password_file.read_text().strip()
    password = secrets.token_urlsafe(12)
    user = user or user_model(username=username, is_staff=True, is_superuser=True)
    user.set_password(password)
    user.save()
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    return username, password


def start_demo_agents(server: str, log_dir: Path) -> list[stack.Service]:
    services = []
    for name, spec in DEMO_FLEET:
        # The demo agents all run on this machine: the other nodes reach a multi-node head on loopback.
        node, _ = Node.objects.get_or_create(name=name, defaults={"address": "127.0.0.1"})
        node.tokens.filter(revoked=None).update(revoked=timezone.now())
        _, token = AgentToken.issue(node)
        run_dir = settings.VAR_DIR / "agents" / name  # one per agent: an agent adopts the servers in its dir
        extra = ["--run-dir", str(run_dir), "--model-dir", str(settings.VAR_DIR / "models")]
        agent = stack.agent_service(server, token, spec, settings.AGENT_INTERVAL, log_dir / f"agent-{name}.log",
                                    extra)
        services.append(agent.start())
    return services


def deploy_demo_model(env: dict[str, str], log_dir: Path) -> None:
    """Plan and deploy the field report's model on the demo A30 node (a child process, so that it talks
    to the same Redis as the stack)."""
    demo = stack.Service("deploy-demo", [sys.executable, "manage.py", "deploy_demo"], env,
                         log_dir / "deploy-demo.log").start()
    demo.proc.wait(timeout=120)
    print((log_dir / "deploy-demo.log").read_text().strip().splitlines()[-1])

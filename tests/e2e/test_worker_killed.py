"""A Celery worker killed in the middle of launching a deployment (issue #4): the launch is delivered again
(acks late, reject on worker lost, the broker's visibility timeout) and the agent still runs exactly one
inference server for the deployment. Real Redis, real `celery worker` subprocesses, the real ASGI server
and a real agent on a simulated node.

The seam: the channel layer runs on a Redis of its own, which the test freezes with SIGSTOP. The launch
task then marks the deployment launching and blocks in its first channel-layer call, before the launch
command reaches the agent, and the test kills the worker right there. The broker is the session's Redis,
which keeps running, so the unacked message survives the kill."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from dashboard import deploy, stack
from dashboard.models import Deployment, DeploymentEvent
from dashboard.tasks import launch_deployment
from tests.conftest import point_celery_at
from tests.dashboard.test_deploy import planned
from tests.e2e.test_e2e_deploy import served_model, state_of
from tests.harness import node_with_token, start_agent, wait_until

pytestmark = pytest.mark.slow

VISIBILITY_TIMEOUT_S = 2
MODEL = "Qwen3-VL-32B-Instruct"  # planned onto the simulated 4x A30 node, run by the simulated backend


# ---- processes, as /proc shows them -----------------------------------------------------------------------
def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def servers_started_in(run_dir: Path) -> list[int]:
    """Live inference servers the agent started with their output in `run_dir`: the leaders of their own
    sessions (the supervisor starts each server in one) whose stdout is a file there."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stdout = os.readlink(entry / "fd" / "1")
            leader = os.getsid(pid) == pid
        except OSError:
            continue
        if leader and stdout.startswith(f"{run_dir}/") and alive(pid):
            found.append(pid)
    return found


def pool_children(worker_pid: int) -> list[int]:
    text = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text()
    return [int(p) for p in text.split()]


def end_process_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# ---- the stack ----------------------------------------------------------------------------------------------
@dataclass
class Rig:
    """ASGI server, agent and Celery workers: broker on the session's Redis, channel layer on its own Redis."""

    env: dict[str, str]
    broker: redis.Redis
    channels_redis: stack.Service
    run_dir: Path
    log_dir: Path
    services: list[stack.Service] = field(default_factory=list)
    agent: stack.Service | None = None

    def start(self, service: stack.Service) -> stack.Service:
        self.services.append(service.start())
        return service

    def start_worker(self, name: str, **env: str) -> stack.Service:
        (self.log_dir / name).mkdir()
        return self.start(
            stack.celery_worker_service({**self.env, **env}, self.log_dir / name, queues="celery,detect")
        )

    def worker_log(self, name: str) -> str:
        return (self.log_dir / name / "celery-worker.log").read_text()

    def agent_log(self) -> str:
        return self.agent.log_path.read_text()

    def freeze(self, service: stack.Service) -> None:
        os.kill(service.proc.pid, signal.SIGSTOP)

    def thaw(self, service: stack.Service) -> None:
        os.kill(service.proc.pid, signal.SIGCONT)

    def unacked(self, task_id: str) -> bool:
        return self.unacked_for(task_id) is not None

    def unacked_for(self, task_id: str) -> float | None:
        """Seconds since the broker delivered the task's message to a worker that has not acked it yet."""
        for tag, raw in self.broker.hgetall("unacked").items():
            if json.loads(raw)[0]["headers"]["id"] == task_id:
                return time.time() - self.broker.zscore("unacked_index", tag)
        return None

    def queued(self, task_id: str) -> bool:
        return any(json.loads(raw)["headers"]["id"] == task_id for raw in self.broker.lrange("celery", 0, -1))

    def spawns(self, deployment: Deployment) -> int:
        """How many times the agent started a server for the deployment (its log says so for each)."""
        return self.agent_log().count(f"deployment {deployment.pk}: started pid")

    def stop(self) -> None:
        for service in self.services:  # a frozen process would sit on its SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.proc.pid, signal.SIGCONT)
        for service in reversed(self.services):
            service.stop()
        for pid in servers_started_in(self.run_dir):  # servers outlive the agent by design
            end_process_group(pid)
        self.broker.close()


@pytest.fixture
def rig(server_env, settings, tmp_path) -> Iterator[Rig]:
    channels_port, asgi_port = stack.free_port(), stack.free_port()
    (tmp_path / "redis").mkdir()
    channels_redis = stack.redis_service(channels_port, tmp_path / "redis")
    env = {
        **server_env,
        "REDIS_URL": f"redis://127.0.0.1:{channels_port}/0",
        "CELERY_BROKER_URL": server_env["REDIS_URL"],
        "CELERY_RESULT_BACKEND": server_env["REDIS_URL"],
    }
    point_celery_at(server_env["REDIS_URL"], settings)
    running = Rig(
        env, redis.Redis.from_url(server_env["REDIS_URL"]), channels_redis, tmp_path / "run", tmp_path
    )
    try:
        stack.wait_for_port(channels_port, proc=running.start(channels_redis).proc)
        stack.wait_for_port(asgi_port, proc=running.start(stack.asgi_service(asgi_port, env, tmp_path)).proc)
        node, token = node_with_token("a30-seed")
        running.agent = start_agent(
            f"http://127.0.0.1:{asgi_port}",
            token,
            "sim:a30x4,workload=idle",
            tmp_path,
            interval=0.5,
            run_dir=running.run_dir,
        )
        running.services.append(running.agent)
        wait_until(lambda: node.gpus.count() == 4, what="agent hello")
        yield running
    finally:
        running.stop()


@pytest.fixture
def deployment(rig, alice) -> Deployment:
    return deploy.create_deployment(planned(MODEL), 0, alice)


def assert_one_server_serving(rig: Rig, deployment: Deployment) -> None:
    wait_until(
        lambda: state_of(deployment) in ("ready", "serving", "failed"), timeout=60, what="server ready"
    )
    assert deployment.state != "failed", deployment.detail
    assert rig.spawns(deployment) == 1, rig.agent_log()
    assert servers_started_in(rig.run_dir) == [deployment.pid]
    assert served_model(deployment.port) == MODEL


def kill_mid_launch(rig: Rig, deployment: Deployment, worker: stack.Service, victim: str) -> str:
    """Send the launch task and kill `victim` of `worker` while the task waits on the frozen channel layer."""
    rig.freeze(rig.channels_redis)
    task_id = launch_deployment.delay(deployment.pk).id
    wait_until(
        lambda: DeploymentEvent.objects.filter(deployment=deployment, state="launching").exists(),
        timeout=60,
        what="the task to mark the deployment launching",
    )
    assert rig.unacked(task_id), "the task should be running, its message delivered but not acked"
    if victim == "pool child":
        [child] = pool_children(worker.proc.pid)
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: not alive(child), timeout=10, what="the pool child to die")
    else:
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(10)
    rig.thaw(rig.channels_redis)  # only now: the killed run never got to send the launch command
    return task_id


def test_it_launches_once_when_the_pool_child_is_killed_mid_launch(rig, deployment):
    worker = rig.start_worker("worker")
    task_id = kill_mid_launch(rig, deployment, worker, victim="pool child")
    # reject_on_worker_lost: the worker puts the message back at once and a fresh pool child runs it again
    assert launch_deployment.AsyncResult(task_id).get(timeout=60) == "launching"  # it sent the launch itself
    assert_one_server_serving(rig, deployment)
    log = rig.worker_log("worker")
    assert "WorkerLostError" in log and f"launch_deployment[{task_id}] succeeded" in log, log[-3000:]
    assert worker.proc.poll() is None
    assert not rig.unacked(task_id) and not rig.queued(task_id)


def test_it_launches_once_when_the_whole_worker_is_killed_mid_launch(rig, deployment):
    first = rig.start_worker("first")
    task_id = kill_mid_launch(rig, deployment, first, victim="whole worker")
    assert rig.unacked(task_id), "a worker killed outright acks nothing and rejects nothing"
    # A worker puts back messages left unacked for longer than the visibility timeout when it starts (and
    # then every 100 s): the second worker comes up once the killed worker's message is that old.
    wait_until(
        lambda: rig.unacked_for(task_id) > VISIBILITY_TIMEOUT_S,
        timeout=VISIBILITY_TIMEOUT_S + 5,
        what="the message to outlast the visibility timeout",
    )
    rig.start_worker("second", CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT_S))
    assert launch_deployment.AsyncResult(task_id).get(timeout=90) == "launching"
    assert_one_server_serving(rig, deployment)
    assert f"launch_deployment[{task_id}] succeeded" in rig.worker_log("second")
    assert not rig.unacked(task_id) and not rig.queued(task_id)


def test_it_starts_one_server_when_the_launch_is_delivered_twice(rig, deployment):
    rig.start_worker("worker")
    rig.freeze(
        rig.agent
    )  # both launch commands wait in the agent's socket: neither run can see the other's effect
    first, second = launch_deployment.delay(deployment.pk), launch_deployment.delay(deployment.pk)
    assert [first.get(timeout=60), second.get(timeout=60)] == ["launching", "launching"]  # each sent a launch
    rig.thaw(rig.agent)
    assert_one_server_serving(rig, deployment)
    assert deployment.detail == "already running"  # the agent's answer to the second launch

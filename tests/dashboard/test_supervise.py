"""runstack's keeper: a component that fails at start-up is fatal and named; after start-up a child that
exits is restarted with capped exponential backoff, and the others are left alone."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from dashboard import stack
from dashboard.management.commands.runstack import BEAT_SETTLE_S, beat_is_beating
from dashboard.supervise import Component, Keeper, StartupFailed

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]


def program(
    name: str, argv: list[str], tmp_path, ready=lambda context, service: True, **options
) -> Component:
    return Component(
        name, lambda context: stack.Service(name, argv, log_path=tmp_path / f"{name}.log"), ready, **options
    )


def log_said_up(context, service: stack.Service) -> bool:
    return "up" in service.log_since_start()


@pytest.fixture
def keeper():
    said: list[str] = []
    keeper = Keeper(context=None, say=said.append, base_delay=0.1, max_delay=0.4, stable_after=60)
    keeper.said = said
    yield keeper
    keeper.stop_all(timeout=2)


def run_ticks(keeper: Keeper, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        keeper.tick()
        time.sleep(0.02)


def test_it_names_a_component_that_dies_at_start_with_the_end_of_its_log(keeper, tmp_path):
    crash = [sys.executable, "-c", "import sys; print('ModuleNotFoundError: packaging'); sys.exit(3)"]
    components = [
        program("redis", SLEEPER, tmp_path, log_said_up, blocking=True),
        program("celery-worker", crash, tmp_path, ready=lambda c, s: False),
        program("celery-beat", SLEEPER, tmp_path, log_said_up),
    ]
    with pytest.raises(StartupFailed) as failed:
        keeper.start_all(components)
    message = str(failed.value)
    assert message.startswith("celery-worker exited (code 3) during start-up")
    assert "ModuleNotFoundError: packaging" in message and "celery-worker.log" in message
    assert [c.service.name for c in keeper.children] == ["redis", "celery-worker", "celery-beat"]


def test_it_gives_up_on_a_component_that_never_answers_and_says_why(keeper, tmp_path):
    def refused(context, service):
        raise ConnectionRefusedError("nothing on port 8000")

    with pytest.raises(StartupFailed) as failed:
        keeper.start_all([program("asgi", SLEEPER, tmp_path, refused, timeout=0.5)])
    assert str(failed.value).startswith(
        "asgi did not become ready within 0.5 s (last check: ConnectionRefusedError: nothing on port 8000)"
    )
    assert "up" in str(failed.value)  # its log


def test_it_waits_for_a_blocking_component_before_starting_the_next(keeper, tmp_path):
    redis_log_when_asgi_was_built: list[str] = []

    def build_asgi(context):
        redis_log_when_asgi_was_built.append(keeper.children[0].service.log_since_start())
        return stack.Service("asgi", SLEEPER)

    keeper.start_all(
        [
            program("redis", SLEEPER, tmp_path, log_said_up, blocking=True),
            Component("asgi", build_asgi, lambda context, service: True),
        ]
    )
    assert redis_log_when_asgi_was_built == ["up\n"]


def test_it_leaves_out_a_component_not_wanted(keeper, tmp_path):
    keeper.start_all(
        [program("redis", SLEEPER, tmp_path, when=lambda context: False), program("asgi", SLEEPER, tmp_path)]
    )
    assert [c.service.name for c in keeper.children] == ["asgi"]


def test_it_restarts_a_killed_child_with_capped_exponential_backoff_and_leaves_the_others(keeper, tmp_path):
    keeper.start_all([program("redis", SLEEPER, tmp_path), program("agent a30-seed", SLEEPER, tmp_path)])
    redis, agent = (c.service for c in keeper.children)
    agent_pid = agent.proc.pid
    for restart, delay in [(1, "0.1"), (2, "0.2"), (3, "0.4"), (4, "0.4")]:
        killed = redis.proc.pid
        os.kill(killed, signal.SIGKILL)
        run_ticks(keeper, 0.7)
        assert keeper.said[-2:] == [
            f"redis exited (signal 9); restarting in {delay} s (restart {restart})",
            f"redis restarted (pid {redis.proc.pid})",
        ]
        assert redis.proc.pid != killed and redis.proc.poll() is None
    assert agent.proc.pid == agent_pid and agent.proc.poll() is None
    assert len(keeper.said) == 8


def test_it_waits_out_the_backoff_before_restarting(keeper, tmp_path):
    keeper.base_delay, keeper.max_delay = 1.0, 30.0
    keeper.start_all([program("celery-beat", [sys.executable, "-c", "import sys; sys.exit(1)"], tmp_path)])
    beat = keeper.children[0].service
    beat.proc.wait()
    run_ticks(keeper, 0.5)
    assert keeper.said == ["celery-beat exited (code 1); restarting in 1 s (restart 1)"]
    run_ticks(keeper, 0.7)
    assert keeper.said[1].startswith("celery-beat restarted (pid ")


def test_it_resets_the_backoff_of_a_child_that_stayed_up(keeper, tmp_path):
    keeper.stable_after = 0.3
    keeper.start_all([program("asgi", SLEEPER, tmp_path)])
    asgi = keeper.children[0].service
    os.kill(asgi.proc.pid, signal.SIGKILL)
    run_ticks(keeper, 0.3)
    run_ticks(keeper, 0.5)  # up longer than stable_after
    os.kill(asgi.proc.pid, signal.SIGKILL)
    run_ticks(keeper, 0.3)
    assert [line for line in keeper.said if "exited" in line] == [
        "asgi exited (signal 9); restarting in 0.1 s (restart 1)",
        "asgi exited (signal 9); restarting in 0.1 s (restart 1)",
    ]


def test_it_stops_all_children_together_within_one_timeout(keeper, tmp_path):
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(600)",
    ]
    keeper.start_all([program(f"worker-{i}", stubborn, tmp_path, log_said_up) for i in range(3)])
    started = time.monotonic()
    keeper.stop_all(timeout=1.0)
    took = time.monotonic() - started
    assert all(c.service.proc.returncode == -signal.SIGKILL for c in keeper.children)
    assert took < 2.0, f"stopping three stubborn children took {took:.1f} s: one timeout after another"


@pytest.mark.parametrize(
    ("log", "up_for", "ready"),
    [
        (
            "beat: Starting...\nScheduler: Sending due task evaluate-fleet (dashboard.tasks.evaluate_fleet)\n",
            1,
            True,
        ),
        ("beat: Starting...\n", 1, False),
        ("beat: Starting...\n", BEAT_SETTLE_S + 1, True),  # nothing due yet with long intervals, but it runs
        ("Traceback (most recent call last):\n", BEAT_SETTLE_S + 1, False),
    ],
)
def test_it_takes_beat_as_up_once_it_sent_a_task_or_ran_a_while(tmp_path, log, up_for, ready):
    beat = stack.Service("celery-beat", SLEEPER, log_path=tmp_path / "celery-beat.log")
    beat.log_path.write_text(log)
    beat.started_at = time.monotonic() - up_for
    assert beat_is_beating(None, beat) is ready

"""The full-stack benchmark's readings: the detect worker's log, the agents' connection losses, process names."""

from __future__ import annotations

from datetime import datetime

from agents.runner import log as agent_log
from bench.fullstack import evaluate_fleet_runs, label_for
from bench.ingest import ConnectionLosses

LOG = """\
[2026-12-01 17:00:00,100: INFO/MainProcess] Task dashboard.tasks.evaluate_fleet[a1] received
[2026-12-01 17:00:00,200: INFO/ForkPoolWorker-1] Task dashboard.tasks.evaluate_fleet[a1] succeeded in 0.04s: 0
[2026-12-01 17:00:01,200: INFO/ForkPoolWorker-1] Task dashboard.tasks.evaluate_fleet[a2] succeeded in 1.5s: 3
[2026-12-01 17:00:02,200: INFO/ForkPoolWorker-1] evaluate_fleet: the previous run is still going; this one skips
[2026-12-01 17:00:02,210: INFO/ForkPoolWorker-1] Task dashboard.tasks.evaluate_fleet[a3] succeeded in 0.01s: None
[2026-12-01 17:00:03,000: INFO/ForkPoolWorker-1] Task dashboard.tasks.announce_silent_nodes[b1] succeeded in 0.2s: []
[2026-12-01 17:05:00,200: INFO/ForkPoolWorker-1] Task dashboard.tasks.evaluate_fleet[a4] succeeded in 9.0s: 0
"""


def at(clock: str) -> float:
    return datetime.fromisoformat(f"2026-12-01 {clock}").timestamp()


def test_it_reads_evaluate_fleet_durations_and_skips_in_the_window_only(tmp_path):
    log = tmp_path / "celery-detect.log"
    log.write_text(LOG)
    runs = evaluate_fleet_runs(log, at("17:00:00"), at("17:01:00"))
    assert runs["runs"] == 2  # the skipped run (None) is not a run; the one at 17:05 is outside
    assert runs["max_ms"] == 1500.0
    assert runs["skipped"] == 1


def test_it_gives_no_runs_for_a_missing_log(tmp_path):
    assert evaluate_fleet_runs(tmp_path / "absent.log", 0, 1)["runs"] == 0


def test_it_counts_the_agents_connection_losses_by_cause():
    losses = ConnectionLosses.attach()
    try:
        agent_log.warning(
            "connection to %s lost: %s", "http://x", TimeoutError("timed out during opening handshake")
        )
        before = losses.snapshot()
        agent_log.warning(
            "connection to %s lost: %s", "http://x", TimeoutError("timed out during opening handshake")
        )
        agent_log.warning("connection to %s lost: %s", "http://x", OSError("refused"))
        agent_log.warning("reconnecting in %.1f s", 1.0)
    finally:
        agent_log.removeHandler(losses)
    assert before == {"TimeoutError: timed out during opening handshake": 1}
    assert losses.since(before) == {
        "TimeoutError: timed out during opening handshake": 1,
        "OSError: refused": 1,
    }


def test_it_names_a_process_of_the_stack_from_its_command_line(tmp_path):
    from dashboard import stack

    env: dict[str, str] = {}
    assert label_for(stack.celery_detect_worker_service(env, tmp_path).argv) == "celery-detect"
    assert label_for(stack.celery_worker_service(env, tmp_path).argv) == "celery-worker"
    assert label_for(stack.celery_beat_service(env, tmp_path).argv) == "celery-beat"
    assert label_for(stack.asgi_service(8000, env, tmp_path).argv) == "asgi"
    assert label_for(["python", "-m", "something"]) == "other: python -m something"

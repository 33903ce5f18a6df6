"""The agent's disk-backed outbox (`--disk-outbox`, under `--run-dir`): what the server has not acked
survives a restart of the agent itself, bounded like the in-memory ring."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import time

import pytest
from django.utils import timezone

from agents.__main__ import build_parser, configure
from agents.config import ConfigError
from agents.ring import Outbox, OutboxBusy, outbox_owner
from dashboard import stack
from dashboard.models import GpuSample, Node
from tests.e2e.test_e2e_fleet import seqs_per_gpu
from tests.harness import node_with_token, wait_until

OWNER = outbox_owner("http://dashboard:8000", "lc_token-of-a30-seed")


def fill(outbox: Outbox, count: int) -> None:
    for _ in range(count):
        outbox.add(lambda seq: f"frame-{seq}")


def rows_on_disk(path) -> list[int]:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return [seq for (seq,) in db.execute("SELECT seq FROM frames ORDER BY seq")]
    except sqlite3.OperationalError:  # no agent has created it yet
        return []


def test_it_keeps_unacked_frames_their_sequence_and_stream_across_a_restart(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    first = Outbox.on_disk(path, capacity=10, owner=OWNER)
    fill(first, 5)
    first.ack(2)
    stream = first.stream_id
    first.close()

    again = Outbox.on_disk(path, capacity=10, owner=OWNER)
    assert list(again.frames) == [(3, "frame-3"), (4, "frame-4"), (5, "frame-5")]
    assert again.stream_id == stream  # the server's replay watermark for this stream still applies
    assert again.add(lambda seq: f"frame-{seq}") == 6
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again.close()


def test_it_keeps_the_sequence_when_everything_was_acked(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    first = Outbox.on_disk(path, capacity=10, owner=OWNER)
    fill(first, 3)
    first.ack(3)
    first.close()
    again = Outbox.on_disk(path, capacity=10, owner=OWNER)
    assert not again.frames and again.add(str) == 4
    again.close()


def test_it_holds_no_more_on_disk_than_the_ring(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    outbox = Outbox.on_disk(path, capacity=3, owner=OWNER)
    fill(outbox, 7)
    assert rows_on_disk(path) == [5, 6, 7] and outbox.dropped == 4
    outbox.close()
    smaller = Outbox.on_disk(path, capacity=2, owner=OWNER)  # restarted with a shorter --buffer-seconds
    assert [seq for seq, _ in smaller.frames] == [6, 7]
    smaller.close()


def test_it_drops_frames_kept_for_another_token_and_starts_a_new_stream(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    first = Outbox.on_disk(path, capacity=10, owner=OWNER)
    fill(first, 4)
    first.close()
    other = Outbox.on_disk(path, capacity=10, owner=outbox_owner("http://dashboard:8000", "lc_another-node"))
    assert other.discarded == 4 and not other.frames and rows_on_disk(path) == []
    assert other.stream_id != first.stream_id and other.add(str) == 1
    other.close()


def test_it_refuses_a_second_agent_on_the_same_outbox(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    first = Outbox.on_disk(path, capacity=10, owner=OWNER)
    with pytest.raises(OutboxBusy, match="own --run-dir"):
        Outbox.on_disk(path, capacity=10, owner=OWNER)
    first.close()


def start_agent_with_disk_outbox(server: str, token: str, log_dir, run_dir) -> stack.Service:
    return stack.agent_service(
        server,
        token,
        "sim:rtx4090x2",
        0.2,
        log_dir / "agent-disk-outbox.log",
        ["--run-dir", str(run_dir), "--disk-outbox"],
    ).start()


@pytest.mark.slow
def test_it_sends_what_it_sampled_before_a_restart_while_the_server_was_down(live_stack, log_dir, tmp_path):
    node, token = node_with_token("rtx4090-box")
    live_stack.stop_server()
    agents = [start_agent_with_disk_outbox(live_stack.url, token, log_dir, tmp_path)]
    try:
        wait_until(
            lambda: len(rows_on_disk(tmp_path / "outbox.sqlite3")) >= 8, what="samples taken with no server"
        )
        agents[0].proc.send_signal(signal.SIGKILL)
        agents[0].proc.wait()
        killed_at = timezone.now()
        agents.append(start_agent_with_disk_outbox(live_stack.url, token, log_dir, tmp_path))
        time.sleep(1.0)
        live_stack.start_server()
        wait_until(lambda: Node.objects.get(pk=node.pk).last_seq >= 25, what="replay of both runs")
    finally:
        for agent in agents:  # a failed wait must not leave an agent running past the test
            agent.stop()
    seqs = seqs_per_gpu(node)
    assert set(seqs) == {0, 1}
    for gpu_seqs in seqs.values():
        assert gpu_seqs == list(range(1, len(gpu_seqs) + 1)), "a gap or a duplicate"
    before_the_kill = GpuSample.objects.filter(gpu__node=node, gpu__index=0, t__lt=killed_at).count()
    assert before_the_kill >= 8, f"only {before_the_kill} samples of the first run were stored"


@pytest.mark.parametrize(
    ("argv", "variable", "on"),
    [
        ([], None, False),
        (["--disk-outbox"], None, True),
        ([], "true", True),
        ([], "no", False),
        (["--disk-outbox"], "false", True),  # the flag wins
    ],
)
def test_it_is_switched_on_by_the_flag_or_the_variable(monkeypatch, argv, variable, on):
    for key in [key for key in os.environ if key.startswith("LAYERCAKE_")]:
        monkeypatch.delenv(key)
    if variable is not None:
        monkeypatch.setenv("LAYERCAKE_DISK_OUTBOX", variable)
    args = build_parser().parse_args(["run", "--server", "http://dash:8000", "--token", "lc_x", *argv])
    configure(args)
    assert args.disk_outbox is on


def test_it_names_the_variable_when_its_value_is_not_a_boolean(monkeypatch):
    monkeypatch.setenv("LAYERCAKE_DISK_OUTBOX", "sometimes")
    args = build_parser().parse_args(["run", "--server", "http://dash:8000", "--token", "lc_x"])
    with pytest.raises(ConfigError, match="LAYERCAKE_DISK_OUTBOX .*expected true or false, got 'sometimes'"):
        configure(args)

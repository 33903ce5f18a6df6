from __future__ import annotations

from agents import runner
from agents.ring import Outbox
from agents.runner import Agent
from agents.sim.gpus import SimSource


def test_it_keeps_frames_until_acked_and_replays_in_order():
    box = Outbox(capacity=10)
    for _ in range(5):
        box.add(lambda seq: f"frame-{seq}")
    box.ack(2)
    assert [s for s, _ in box.after(0)] == [3, 4, 5]
    assert box.after(4) == [(5, "frame-5")]


def test_it_drops_the_oldest_frames_when_full_and_counts_them():
    box = Outbox(capacity=3)
    for _ in range(5):
        box.add(str)
    assert [s for s, _ in box.frames] == [3, 4, 5]
    assert box.dropped == 2


def test_it_stops_sending_a_frame_the_server_refused_for_good(tmp_path, monkeypatch):
    """Its clock stood still: three samples frames with one time. The server stores the first and refuses the
    second (`store_refused`, seq 2); the agent drops it, keeps the third, and does so on disk too."""
    monkeypatch.setattr(runner.time, "time", lambda: 1_800_000_000.0)
    agent = Agent("http://127.0.0.1:9", "lc_x", SimSource("sim:a30x4"), run_dir=tmp_path, disk_outbox=True)
    for _ in range(3):
        agent.collect()
    agent.on_server_message({"type": "ack", "v": 1, "seq": 1})
    agent.on_server_message(
        {"type": "error", "v": 1, "code": "store_refused", "message": "seq 2 was not stored: ...", "seq": 2}
    )
    assert [seq for seq, _ in agent.outbox.after(0)] == [3]
    agent.outbox.close()
    restarted = Agent(
        "http://127.0.0.1:9", "lc_x", SimSource("sim:a30x4"), run_dir=tmp_path, disk_outbox=True
    )
    assert [seq for seq, _ in restarted.outbox.after(0)] == [3]
    restarted.outbox.close()


def test_it_keeps_a_frame_an_error_does_not_refuse_for_good():
    agent = Agent("http://127.0.0.1:9", "lc_x", SimSource("sim:a30x4"))
    agent.collect()
    agent.on_server_message({"type": "error", "v": 1, "code": "store_failed", "message": "...", "seq": 1})
    agent.on_server_message({"type": "error", "v": 1, "code": "store_refused", "message": "...", "seq": True})
    assert [seq for seq, _ in agent.outbox.after(0)] == [1]

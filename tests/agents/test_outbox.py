from agents.ring import Outbox


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

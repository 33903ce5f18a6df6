"""The agent's outbox: every sequenced message waits here until the server acks it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Outbox:
    """A bounded ring of (seq, frame). When full the oldest frame is dropped and counted."""

    capacity: int
    frames: deque[tuple[int, str]] = field(default_factory=deque)
    dropped: int = 0
    next_seq: int = 1

    def add(self, build: callable) -> int:
        """Append `build(seq)` under the next sequence number; return that number."""
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        if len(self.frames) >= self.capacity:
            self.frames.popleft()
            self.dropped += 1
        self.frames.append((seq, build(seq)))
        return seq

    def ack(self, seq: int) -> None:
        """The server stored everything up to and including `seq`."""
        while self.frames and self.frames[0][0] <= seq:
            self.frames.popleft()

    def after(self, seq: int) -> list[tuple[int, str]]:
        return [(s, frame) for s, frame in self.frames if s > seq]

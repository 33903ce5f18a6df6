"""The agent's outbox: every sequenced message waits here until the server acks it.

In memory by default. With a journal (`--disk-outbox`) every frame is also kept in SQLite under the
agent's run dir until acked, with the next sequence number and the stream id, so that an agent restarted
while the server is unreachable sends what its previous run had not delivered. The journal holds what the
ring holds (the same bound); frames written for another server or token are dropped, and said so.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS frames (seq INTEGER PRIMARY KEY, frame TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class OutboxBusy(RuntimeError):
    """Another agent process holds this outbox."""


class Journal:
    """Unacked frames on disk (SQLite, WAL: a commit survives the process being killed)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = _lock_exclusively(path.with_name(path.name + ".lock"))
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # samples and log lines: owner only
        self.db = sqlite3.connect(path)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def get(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, value: str) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def frames(self) -> list[tuple[int, str]]:
        return self.db.execute("SELECT seq, frame FROM frames ORDER BY seq").fetchall()

    def record(self, seq: int, frame: str, oldest_kept: int) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO frames (seq, frame) VALUES (?, ?)", (seq, frame))
            self.db.execute("DELETE FROM frames WHERE seq < ?", (oldest_kept,))
            self.db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('next_seq', ?)", (str(seq + 1),)
            )

    def forget_through(self, seq: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM frames WHERE seq <= ?", (seq,))

    def forget(self, seq: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM frames WHERE seq = ?", (seq,))

    def close(self) -> None:
        self.db.close()
        os.close(self.lock)

    def start_stream(self, owner: str) -> str:
        """A new stream for `owner`: no frames, sequence numbers from 1, a new stream id."""
        stream_id = uuid.uuid4().hex
        with self.db:
            self.db.execute("DELETE FROM frames")
            self.db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [("owner", owner), ("stream_id", stream_id), ("next_seq", "1")],
            )
        return stream_id


def _lock_exclusively(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutboxBusy(
            f"another agent is using the outbox {path.with_suffix('')} (give each agent its own --run-dir)"
        ) from None
    return fd  # held for the life of the process


def outbox_owner(server: str, token: str) -> str:
    """Who the journal's frames are for; the token itself is not written to disk."""
    return hashlib.sha256(f"{server.rstrip('/')}\n{token}".encode()).hexdigest()


@dataclass
class Outbox:
    """A bounded ring of (seq, frame). When full the oldest frame is dropped and counted."""

    capacity: int
    frames: deque[tuple[int, str]] = field(default_factory=deque)
    dropped: int = 0
    next_seq: int = 1
    journal: Journal | None = None
    stream_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    discarded: int = 0  # frames found on disk for another server or token

    @classmethod
    def on_disk(cls, path: Path, capacity: int, owner: str) -> Outbox:
        """The outbox kept in `path`: its frames, sequence and stream id carry over from the last run."""
        journal = Journal(path)
        if journal.get("owner") != owner:
            discarded = len(journal.frames())
            return cls(capacity, journal=journal, stream_id=journal.start_stream(owner), discarded=discarded)
        frames = journal.frames()
        kept = frames[-capacity:]
        return cls(
            capacity,
            deque(kept),
            dropped=len(frames) - len(kept),
            next_seq=int(journal.get("next_seq")),
            journal=journal,
            stream_id=journal.get("stream_id"),
        )

    def add(self, build: callable) -> int:
        """Append `build(seq)` under the next sequence number; return that number."""
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        if len(self.frames) >= self.capacity:
            self.frames.popleft()
            self.dropped += 1
        frame = build(seq)
        self.frames.append((seq, frame))
        if self.journal is not None:
            self.journal.record(seq, frame, oldest_kept=self.frames[0][0])
        return seq

    def ack(self, seq: int) -> None:
        """The server stored everything up to and including `seq`."""
        acked = False
        while self.frames and self.frames[0][0] <= seq:
            self.frames.popleft()
            acked = True
        if acked and self.journal is not None:
            self.journal.forget_through(seq)

    def drop(self, seq: int) -> None:
        """The server refused `seq` for good (it will never store it): stop sending it. The frames before and
        after it stay; the next ack covers its place."""
        kept = deque((s, frame) for s, frame in self.frames if s != seq)
        if len(kept) < len(self.frames):
            self.frames = kept
            if self.journal is not None:
                self.journal.forget(seq)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    def after(self, seq: int) -> list[tuple[int, str]]:
        return [(s, frame) for s, frame in self.frames if s > seq]

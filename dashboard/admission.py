"""Admission of agents' hellos during a reconnect wave (issue #13: a server restart under 1,000 agents).

After a restart every agent connects within about a second. Unbounded, their hellos all go to the database
thread at once, interleaved with the ingest flushes: every hello finishes late, the flushes wait behind
them, and agents whose welcome takes too long time out and come back, which makes the wave longer. Here at
most `concurrent` hellos are worked on at a time, in the order the agents connected; the server measures
how fast it welcomes them, and an agent that would wait longer than `max_wait_s` is told to come back
after the time the agents ahead of it need (a "busy" error with retry_after_s, agents.protocol.busy), which
costs the server one refused handshake instead of a hello it cannot finish in time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class HelloGate:
    concurrent: int = 8
    # Agents wait 30 s for a welcome (agents.runner); turning one away costs a handshake now and another later,
    # so only a wait close to that is worth it (at 15 s, a loaded 2-core machine turned away most of 1,000).
    max_wait_s: float = 25.0
    waiting: int = 0  # connections admitted and not yet welcomed (or gone)
    seconds_per_hello: float | None = None  # smoothed time between welcomes while a queue was waiting
    _last_welcome: float | None = None
    _turns: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self._turns = asyncio.Semaphore(self.concurrent)

    def expected_wait(self) -> float:
        return self.waiting * (self.seconds_per_hello or 0.0)

    def admit(self) -> float | None:
        """None: this connection joins the queue. Else the seconds it should come back after (spread by a
        random share of the queue, so that the deferred agents do not all return at the same moment)."""
        wait = self.expected_wait()
        if wait > self.max_wait_s:
            return wait * random.uniform(1.0, 1.5)
        self.waiting += 1
        return None

    def leave(self) -> None:
        """An admitted connection was welcomed, or closed before that."""
        self.waiting = max(0, self.waiting - 1)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        async with self._turns:
            yield
        self._welcomed(time.monotonic())

    def _welcomed(self, now: float) -> None:
        if self._last_welcome is not None and self.waiting > self.concurrent:  # a queue: the gap is the rate
            gap = now - self._last_welcome
            previous = self.seconds_per_hello
            self.seconds_per_hello = gap if previous is None else 0.9 * previous + 0.1 * gap
        self._last_welcome = now

"""Admission of agents' hellos during a reconnect wave (issue #13: a server restart under 1,000 agents).

After a restart every agent connects within about a second. Unbounded, their hellos all go to the database
thread at once, interleaved with the ingest flushes: every hello finishes late and the flushes wait behind
them. Here at most `concurrent` hellos are worked on at a time, in the order the agents connected, so the
first nodes are back (and their samples flowing) while the rest wait their turn.

Turning agents away with a delay (a "busy" reply with retry_after_s) when the queue was long was tried and
measured worse: at 1,000 agents the server was not saturated while the deferred agents waited out their
25-50 s (bench/README.md, restart storm). A server whose message bus is away still sends one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class HelloGate:
    concurrent: int = 8
    waiting: int = 0  # connections admitted and not yet welcomed (or gone)
    _turns: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self._turns = asyncio.Semaphore(self.concurrent)

    def admit(self) -> None:
        self.waiting += 1

    def leave(self) -> None:
        """An admitted connection was welcomed, or closed before that."""
        self.waiting = max(0, self.waiting - 1)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        async with self._turns:
            yield

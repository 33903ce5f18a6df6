"""Admission of agents' hellos during a reconnect wave (issue #13: a server restart under 1,000 agents).

After a restart every agent connects within about a second. `waiting` counts the connections not yet welcomed
(/metrics and the tests read it). With `concurrent` > 0 (settings.HELLO_CONCURRENT) at most that many hellos
are worked on at a time, in the order the agents connected. The default is no bound: a bound of 8 measured
worse at 1,000 agents (the last in the queue waited past an agent's 30 s welcome wait, reconnected and queued
again), and turning agents away with a delay measured worse too (bench/README.md, restart storm). A server
whose message bus is away still sends "busy" with retry_after_s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class HelloGate:
    concurrent: int = 0  # hellos worked on at once; 0: no bound (settings.HELLO_CONCURRENT)
    waiting: int = 0  # connections admitted and not yet welcomed (or gone)
    _turns: asyncio.Semaphore | contextlib.nullcontext = field(init=False)

    def __post_init__(self) -> None:
        self._turns = asyncio.Semaphore(self.concurrent) if self.concurrent > 0 else contextlib.nullcontext()

    def admit(self) -> None:
        self.waiting += 1

    def leave(self) -> None:
        """An admitted connection was welcomed, or closed before that."""
        self.waiting = max(0, self.waiting - 1)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        async with self._turns:
            yield

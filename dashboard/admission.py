"""Admission of agents' hellos during a reconnect wave (issue #13: a server restart under 1,000 agents).

After a restart every agent connects within about a second. `waiting` counts the connections not yet welcomed.
At most `concurrent` hellos (settings.HELLO_CONCURRENT, default 100: one `Batcher` batch; 0: no bound) are
worked on at a time, in the order the agents connected. Measured at 1,000 agents (bench/README.md, restart
storm): each turn of the gate is a trip to the agents' database thread, queued behind the ingest flush of the
moment, so 8 at a time (the bound before) took 125 trips and every node was fresh again after 21-33 s; 100 at a
time, 11-13 s. (Before hellos and token checks went to their own database thread in batches, no bound at all
kept browsers out for 120 s.) Turning agents away with a delay measured worse. A server whose message bus is
away sends "busy" with retry_after_s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class HelloGate:
    concurrent: int = 8  # hellos worked on at once; 0: no bound
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


@dataclass
class Batcher:
    """Work items done together: while one batch is in the database thread, the items that arrive meanwhile
    wait and go as the next batch (at most `most`), in one trip (`run`, from the database thread: a list in,
    each item's outcome out, in order). A lone item goes at once. A reconnect wave's 1,000 token checks and
    1,000 hellos were 2,000 trips, each queued behind the others and the ingest flushes. Each caller gets its
    own outcome, or its exception raised."""

    run: Callable[[list[Any]], Awaitable[list[Any]]]
    most: int = 100
    queue: list[tuple[Any, asyncio.Future]] = field(default_factory=list)
    _worker: asyncio.Task | None = None

    async def do(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.queue.append((item, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        outcome = await future
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _drain(self) -> None:
        while self.queue:
            batch, self.queue = self.queue[: self.most], self.queue[self.most :]
            try:
                outcomes = await self.run([item for item, _ in batch])
            except Exception as exc:  # noqa: BLE001 (every waiting caller is told, whatever went wrong)
                outcomes = [exc] * len(batch)
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():  # its connection may have closed meanwhile
                    future.set_result(outcome)

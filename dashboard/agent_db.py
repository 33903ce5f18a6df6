"""The agents' database thread: one thread of this server process, with its own database connection, for
everything the agent endpoint stores or reads (ingest flushes, hellos, tokens, answers).

Channels' `database_sync_to_async` (and the check channels runs before every websocket message) use asgiref's
one process-wide thread-sensitive thread; Django's own views get a thread per request. With 1,000 agents that one
thread stored 8,000 samples a second and the hellos of a reconnect wave, and every browser socket's message
queued behind it. The agents' work comes here instead, so the browsers' sockets keep asgiref's thread. One thread, not a pool: the agent path relies on its database
calls running one at a time and in the order they were made (a hello after the flush of what its connection
still held; one flush at a time moving the watermarks; and SQLite has one writer anyway).

Each call closes the thread's connection first and after if it is broken or older than CONN_MAX_AGE, as
channels' `database_sync_to_async` does for asgiref's thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import SyncToAsync
from django.db import close_old_connections, connections

P = ParamSpec("P")
R = TypeVar("R")

# Threads start on first use, so a process that forks before it (a Celery worker) inherits none.
EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-db")


class AgentDatabase(SyncToAsync):
    """SyncToAsync on the agents' thread, closing old connections around the call."""

    def __init__(self, func: Callable[..., Any]) -> None:
        super().__init__(func, thread_sensitive=False, executor=EXECUTOR)

    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            close_old_connections()


def agent_database(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`func` made awaitable, run on the agents' database thread."""
    return AgentDatabase(func)


async def close_connections() -> None:
    """Close the agents' thread's connections (a test's end: PostgreSQL cannot drop a database in use)."""
    await agent_database(connections.close_all)()

"""Follow-up work a service asks for: services return these, and the caller (a task, a view, the agent
consumer) hands them to `tasks.enqueue`, the one place that queues Celery tasks.

Why returned jobs rather than sending tasks by name (`current_app.send_task`) from a service: the service
then imports nothing above it (dashboard layers one way: consumers/views/tasks -> services -> models), its
result says what it wants done (a test reads it without a broker), and `tasks.enqueue` calls each task's
`.delay` where a grep finds it; a task renamed breaks at import, not in a worker that never hears of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchMembers:
    """A multi-node head reported its rendezvous port: launch the other nodes to join it."""

    deployment_id: str


@dataclass(frozen=True)
class StopProcesses:
    """Stop the deployment's server on every node it runs on (a node of it failed)."""

    deployment_id: str


@dataclass(frozen=True)
class DeliverNotifications:
    """Alert notifications were queued: deliver them now rather than at the next beat sweep."""


Job = LaunchMembers | StopProcesses | DeliverNotifications

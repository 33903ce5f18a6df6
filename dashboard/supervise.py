"""Keeping the demo stack's children alive (`manage.py runstack`).

At start-up each component is started and must show it is ready (answer a ping, serve a page, connect);
one that exits or never answers is fatal, named, with the last lines of its log. After start-up a child
that exits is started again with capped exponential backoff, and the others keep running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dashboard.stack import Service

Probe = Callable[[Any, Service], bool]


@dataclass
class Component:
    """One child of the stack: how to build its service from the stack's context, and how to tell it is up.

    `blocking`: the components after this one need it, so start-up waits for it to be ready before going on;
    the others are started together and checked at the end. `when` leaves a component out (e.g. the
    embedded Redis when REDIS_URL is given)."""

    name: str
    build: Callable[[Any], Service]
    ready: Probe
    blocking: bool = False
    when: Callable[[Any], bool] = lambda context: True
    timeout: float = 60.0


class StartupFailed(RuntimeError):
    def __init__(self, service: Service, reason: str) -> None:
        tail = service.log_tail()
        where = f"last lines of {service.log_path}" if service.log_path else "no log"
        super().__init__(f"{service.name} {reason}\n--- {where}:\n{tail}".rstrip())
        self.service = service


def exit_reason(returncode: int) -> str:
    return f"signal {-returncode}" if returncode < 0 else f"code {returncode}"


@dataclass
class Child:
    component: Component
    service: Service
    restarts: int = 0
    restart_at: float | None = None


@dataclass
class Keeper:
    """Starts components, checks them ready, and restarts any that exit afterwards."""

    context: Any
    say: Callable[[str], None]
    base_delay: float = 1.0
    max_delay: float = 30.0
    stable_after: float = 60.0  # a child up this long has its backoff reset
    children: list[Child] = field(default_factory=list)

    def start_all(self, components: list[Component]) -> None:
        waiting: list[Child] = []
        for component in (c for c in components if c.when(self.context)):
            service = component.build(self.context)
            service.name = component.name
            child = Child(component, service.start())
            self.children.append(child)
            waiting.append(child)
            if component.blocking:
                self.wait_ready(waiting)
                waiting = []
        self.wait_ready(waiting)

    def wait_ready(self, children: list[Child]) -> None:
        for child in children:
            self.wait_ready_one(child)

    def wait_ready_one(self, child: Child) -> None:
        deadline, last_error = time.monotonic() + child.component.timeout, ""
        while True:
            try:
                if child.component.ready(self.context, child.service):
                    return
            except Exception as exc:  # a probe failing is only "not yet"; remember why, for the message
                last_error = f" (last check: {type(exc).__name__}: {exc})"
            self.check_alive(child)
            if time.monotonic() > deadline:
                raise StartupFailed(
                    child.service, f"did not become ready within {child.component.timeout:g} s{last_error}"
                )
            time.sleep(0.25)

    def check_alive(self, child: Child) -> None:
        returncode = child.service.proc.poll()
        if returncode is not None:
            raise StartupFailed(child.service, f"exited ({exit_reason(returncode)}) during start-up")

    def check_all_alive(self) -> None:
        for child in self.children:
            self.check_alive(child)

    def tick(self) -> None:
        """Restart children that exited, each after its own backoff; the others are left alone."""
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self.restart(child)
            elif child.service.proc.poll() is not None:
                self.schedule_restart(child, now)
            elif child.service.up_for() >= self.stable_after:
                child.restarts = 0

    def schedule_restart(self, child: Child, now: float) -> None:
        child.restarts += 1
        delay = min(self.max_delay, self.base_delay * 2 ** (child.restarts - 1))
        child.restart_at = now + delay
        self.say(
            f"{child.service.name} exited ({exit_reason(child.service.proc.returncode)}); "
            f"restarting in {delay:g} s (restart {child.restarts})"
        )

    def restart(self, child: Child) -> None:
        child.service.start()
        child.restart_at = None
        self.say(f"{child.service.name} restarted (pid {child.service.proc.pid})")

    def run_forever(self, poll: float = 0.25) -> None:
        while True:
            self.tick()
            time.sleep(poll)

    def stop_all(self, timeout: float = 8.0) -> None:
        """SIGTERM to every child at once, then wait for them together (not one timeout after another)."""
        for child in reversed(self.children):
            child.service.terminate()
        deadline = time.monotonic() + timeout
        for child in reversed(self.children):
            child.service.wait_or_kill(max(0.0, deadline - time.monotonic()))

"""Canary probes: find out that an idle inference server can no longer generate before a user does.

A server can hang while nobody uses it (vllm-project/vllm#48720: TP ranks deadlocked while the API process
still answers /health). Nothing in its counters moves then, because nothing moves when it is idle either.
So once a deployment has served nothing for `idle_s`, the agent sends it a tiny completion (1-4 tokens,
OpenAI-compatible) that must answer within `timeout_s`, and again every `interval_s` while it stays idle.
What the probe found goes to the server as a `protocol.Probe`; the server opens a "hung while idle" alert
on a failure and resolves it on a success.

Probes must not look like use: the agent takes each answered probe's tokens and its request out of the
counters it reports (`CanaryClock.adjusted`), takes a probe in flight or left hanging out of the running
and waiting gauges, and reports no counters while a probe is in flight (its tokens may be counted by the
server before its answer says how many there were). Latency histograms still include answered probes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from agents.protocol import CanarySettings, ServerCounters

HEALTH_TIMEOUT_S = 2.0  # the health check runs during the last seconds of the probe's own timeout
PROMPT = "Say OK."
ACTIVITY = ("generation_tokens_total", "prompt_tokens_total", "requests_finished_total")

# agents.supervisor.http_call: (url, timeout[, JSON body]) -> (status, text), or None when nothing answered
HttpCall = Callable[..., tuple[int, str] | None]


@dataclass(frozen=True)
class ProbeOutcome:
    ok: bool
    elapsed_s: float
    timeout_s: float
    idle_s: float
    tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""
    health_status: int | None = None
    health_s: float | None = None
    health_body: str = ""
    answered: bool = False  # the server answered the completion (maybe too late, or with an error)

    @property
    def reported(self) -> dict:
        """The fields a protocol.Probe carries (prompt tokens and `answered` stay with the agent)."""
        fields = asdict(self)
        del fields["prompt_tokens"], fields["answered"]
        return fields


def completion_body(model: str, settings: CanarySettings) -> dict:
    """The probe: a completion of at most `max_tokens` tokens, marked in `user` so that logs can tell it."""
    return {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": settings.max_tokens,
        "temperature": 0,
        "stream": False,
        "user": "layercake-canary",
    }


def usage_of(text: str) -> tuple[int, int] | None:
    """(completion tokens, prompt tokens) of an OpenAI-compatible completion answer; None if it is not one."""
    try:
        answer = json.loads(text)
        usage = answer["usage"]
        tokens, prompt = int(usage.get("completion_tokens") or 0), int(usage.get("prompt_tokens") or 0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return (tokens, prompt) if answer.get("choices") else None


async def probe(
    http_call: HttpCall, url: str, body: dict, health_url: str, settings: CanarySettings, idle_s: float
) -> ProbeOutcome:
    """Send the completion; when it has not answered by the last HEALTH_TIMEOUT_S of its timeout, ask the
    health endpoint meanwhile, so that the outcome is known within the timeout either way."""
    timeout = settings.timeout_s
    health_timeout = min(HEALTH_TIMEOUT_S, timeout / 2)
    started = time.monotonic()
    completion = asyncio.ensure_future(asyncio.to_thread(http_call, url, timeout, body))
    await asyncio.wait({completion}, timeout=timeout - health_timeout)
    health = None if completion.done() else await ask_health(http_call, health_url, health_timeout)
    answer = await completion
    elapsed = time.monotonic() - started
    used = usage_of(answer[1]) if answer is not None and answer[0] == 200 else None
    tokens, prompt_tokens = used or (0, 0)
    if tokens >= 1 and elapsed <= timeout:
        return ProbeOutcome(True, elapsed, timeout, idle_s, tokens, prompt_tokens, answered=True)
    if health is None:  # the completion failed at once: what does the health endpoint say now?
        health = await ask_health(http_call, health_url, health_timeout)
    status, health_s, health_body = health
    return ProbeOutcome(
        False,
        elapsed,
        timeout,
        idle_s,
        tokens,
        prompt_tokens,
        answered=answer is not None,
        error=failure_text(answer, timeout, elapsed),
        health_status=status,
        health_s=health_s,
        health_body=health_body,
    )


async def ask_health(http_call: HttpCall, url: str, timeout: float) -> tuple[int | None, float, str]:
    """(status or None when nothing answered, seconds it took, the start of the body)."""
    started = time.monotonic()
    answer = await asyncio.to_thread(http_call, url, timeout)
    took = round(time.monotonic() - started, 3)
    return (answer[0], took, answer[1][:500]) if answer is not None else (None, took, "")


def failure_text(answer: tuple[int, str] | None, timeout: float, elapsed: float) -> str:
    if answer is None:
        return f"no answer within {timeout:g} s"
    if answer[0] != 200:
        return f"HTTP {answer[0]}: {answer[1][:300]}"
    if elapsed > timeout:
        return f"answered after {elapsed:.1f} s, past the {timeout:g} s timeout"
    return f"HTTP 200 without a generated token: {answer[1][:300]}"


@dataclass
class CanaryClock:
    """One deployment's probing: when it last did real work, when the next probe is due, and what the
    answered probes added to its counters."""

    settings: CanarySettings = field(default_factory=CanarySettings)
    active_at: float = field(default_factory=time.monotonic)
    next_at: float = 0.0
    task: asyncio.Task | None = None
    tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests: float = 0.0
    hanging: int = 0  # probes that got no answer and may still sit in the server
    last: ServerCounters | None = None

    @property
    def in_flight(self) -> bool:
        return self.task is not None

    def idle_for(self, now: float) -> float:
        return now - self.active_at

    def due(self, now: float) -> bool:
        s = self.settings
        return s.enabled and not self.in_flight and self.idle_for(now) >= s.idle_s and now >= self.next_at

    def adjusted(self, raw: ServerCounters, now: float) -> ServerCounters:
        """The counters without the probes; a move in them (or a request owed) is real use."""
        counters = raw.model_copy(update=self._without_probes(raw))
        owed = (counters.requests_running or 0) + (counters.requests_waiting or 0)
        moved = self.last is not None and any(
            (getattr(counters, k) or 0) != (getattr(self.last, k) or 0) for k in ACTIVITY
        )
        if owed or moved:
            self.active_at = now
        self.last = counters
        return counters

    def _without_probes(self, raw: ServerCounters) -> dict:
        taken = {
            "generation_tokens_total": self.tokens,
            "prompt_tokens_total": self.prompt_tokens,
            "requests_finished_total": self.requests,
        }
        update = {k: max(0.0, v - taken[k]) for k in taken if (v := getattr(raw, k)) is not None}
        held = float(self.hanging)
        for gauge in ("requests_running", "requests_waiting"):
            value = getattr(raw, gauge)
            if value is not None:
                update[gauge], held = max(0.0, value - held), max(0.0, held - value)
        return update

    def record(self, outcome: ProbeOutcome, now: float) -> None:
        """A probe ended: count what it added, and schedule the next one."""
        self.task = None
        self.next_at = now + self.settings.interval_s
        if outcome.answered:  # its tokens and its request are in the server's counters now
            self.tokens += outcome.tokens
            self.prompt_tokens += outcome.prompt_tokens
            self.requests += 1
        if outcome.ok:
            self.hanging = 0
        elif not outcome.answered:
            self.hanging = min(self.hanging + 1, 1000)

    def became_ready(self, now: float) -> None:
        self.active_at, self.next_at = now, 0.0

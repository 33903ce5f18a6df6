"""Prompts from the dashboard to an inference server this agent supervises ("Try it" and "Measure").

A browser cannot reach a node's loopback port, so the server sends an `ask` command and the agent sends
the prompt to the server's OpenAI-compatible chat endpoint, streamed, answering with `answer` frames:
the text as it comes (one stream), or, for a measurement, one frame with the timings of all the streams.
Each streamed content chunk counts as one token (vLLM, SGLang, llama.cpp and the simulated backend send
one token per chunk); the servers' own Prometheus counters stay the reference for throughput.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from agents import protocol

REQUEST_TIMEOUT_S = 120.0  # a server that sends nothing for this long (a stalled engine) ends the stream
MIN_SEND_INTERVAL_S = 0.1  # text is sent on at most every 100 ms: one frame per token would be chatty

Send = Callable[[str], Awaitable[None]]
# Prompts never run on the event loop's default pool: the supervisor's health and metrics probes run there,
# and prompts to a stalled server hang for REQUEST_TIMEOUT_S. At most this many at once; more are refused.
MAX_TRIES = 4
TRY_POOL = ThreadPoolExecutor(max_workers=MAX_TRIES, thread_name_prefix="ask-try")
in_flight = {"try": 0, "measure": 0}  # one measurement at a time per agent: two would measure each other
LIMITS = {"try": MAX_TRIES, "measure": 1}


@dataclass
class StreamTiming:
    """One streamed completion as the client saw it (monotonic clock)."""

    started: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    error: str = ""

    def token(self, now: float) -> None:
        self.first = self.first if self.first is not None else now
        self.last, self.tokens = now, self.tokens + 1

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the time between first and last (what the planner predicts)."""
        if self.tokens < 2 or self.last is None or self.first is None or self.last <= self.first:
            return None
        return (self.tokens - 1) / (self.last - self.first)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.started

    @property
    def itl_s(self) -> float | None:
        rate = self.decode_tok_s
        return None if rate is None else 1 / rate


def chat_body(model: str, prompt: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }


def delta_text(event: dict) -> str:
    """The text of one streamed chat (or completion) chunk; "" for role-only and usage chunks."""
    choices = event.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    delta = choice.get("delta") or {}
    text = delta.get("content") if isinstance(delta, dict) else None
    return str(text if text is not None else choice.get("text") or "")


def stream_chat(url: str, body: dict, on_text: Callable[[str], None]) -> StreamTiming:
    """POST a streamed chat request and read its server-sent events (blocking; run in a thread)."""
    timing = StreamTiming(time.monotonic())
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            read_events(response, timing, on_text)
    except urllib.error.HTTPError as exc:
        timing.error = f"the server answered {exc.code}: {exc.read()[:300].decode('utf-8', 'replace')}"
    except (OSError, ValueError) as exc:  # refused, reset, timed out, or not JSON
        timing.error = f"{type(exc).__name__}: {exc}"[:500]
    return timing


def read_events(lines, timing: StreamTiming, on_text: Callable[[str], None]) -> None:
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        text = delta_text(json.loads(data))
        if text:
            timing.token(time.monotonic())
            on_text(text)


def measurement(timings: list[StreamTiming]) -> protocol.Measurement:
    """Means over the streams that produced tokens; the total over the span in which tokens flowed."""
    done = [t for t in timings if t.tokens and not t.error]
    rates = [r for r in (t.decode_tok_s for t in done) if r is not None]
    ttfts = [x for x in (t.ttft_s for t in done) if x is not None]
    itls = [x for x in (t.itl_s for t in done) if x is not None]
    span = max((t.last for t in done), default=0.0) - min((t.first for t in done), default=0.0)
    after_first = sum(t.tokens - 1 for t in done)
    return protocol.Measurement(
        streams=len(timings),
        completed=len(done),
        tokens=sum(t.tokens for t in timings),
        seconds=round(max((t.last or t.started) - t.started for t in timings), 3),
        tok_s_per_stream=statistics.fmean(rates) if rates else None,
        tok_s_total=after_first / span if span > 0 else None,
        ttft_s=statistics.fmean(ttfts) if ttfts else None,
        itl_s=statistics.fmean(itls) if itls else None,
    )


def answer_frame(ask: protocol.Ask, **fields) -> str:
    return protocol.dump(
        protocol.Answer(
            type="answer", v=protocol.VERSION, deployment=ask.deployment, request=ask.request, **fields
        )
    )


async def try_prompt(ask: protocol.Ask, url: str, model: str, send: Send) -> None:
    """One stream: its text goes back as it comes, then a final frame (with the error, if any)."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    body = chat_body(model, ask.prompt, ask.max_tokens)
    job = loop.run_in_executor(
        TRY_POOL, stream_chat, url, body, lambda text: loop.call_soon_threadsafe(queue.put_nowait, text)
    )
    while not job.done() or not queue.empty():
        await asyncio.wait(
            [job, asyncio.ensure_future(asyncio.sleep(MIN_SEND_INTERVAL_S))], return_when="FIRST_COMPLETED"
        )
        text = "".join(queue.get_nowait() for _ in range(queue.qsize()))
        if text:
            await send(answer_frame(ask, text=text))
    timing = await job
    await send(answer_frame(ask, done=True, error=timing.error, measurement=measurement([timing])))


async def measure(ask: protocol.Ask, url: str, model: str, send: Send) -> None:
    """`streams` requests at once (each on its own thread), then one frame with the measurement."""
    loop = asyncio.get_running_loop()
    body = chat_body(model, ask.prompt, ask.max_tokens)
    with ThreadPoolExecutor(max_workers=ask.streams, thread_name_prefix="measure") as pool:
        jobs = [
            loop.run_in_executor(pool, stream_chat, url, body, lambda _text: None) for _ in range(ask.streams)
        ]
        timings = await asyncio.gather(*jobs)
    errors = sorted({t.error for t in timings if t.error})
    await send(answer_frame(ask, done=True, error="; ".join(errors)[:2000], measurement=measurement(timings)))


async def answer(ask: protocol.Ask, port: int | None, host: str, model: str, send: Send) -> None:
    """Answer one `ask` for a server listening on host:port (None: not serving, which is said)."""
    if port is None:
        await send(
            answer_frame(ask, done=True, error=f"deployment {ask.deployment} is not serving on this node")
        )
        return
    kind = "measure" if ask.measure else "try"
    if in_flight[kind] >= LIMITS[kind]:
        busy = (
            f"{in_flight[kind]} {'measurement' if ask.measure else 'prompt'}(s) already running on this node"
        )
        await send(answer_frame(ask, done=True, error=f"{busy}; try again when it ends"))
        return
    url = f"http://{host}:{port}/v1/chat/completions"
    in_flight[kind] += 1
    try:
        await (measure if ask.measure else try_prompt)(ask, url, model, send)
    finally:
        in_flight[kind] -= 1

"""A SIMULATED inference backend: no model, no GPU. For the demo fleet and for fault tests.

    python -m agents.sim.backend --port P --model NAME --tokens-per-s X
        [--fault none|nccl-init-hang|stall|crash|idle-hang] [--load-seconds S] [--crash-after S] [--tp N]
        [--stats-interval S] [--log-file F] [--host H] [--served-model-name N] [--max-model-len N]
        [--max-num-seqs N] [--kv-cache-tokens N] [--nnodes N --node-rank R --master-addr A --master-port P]

It behaves like a vLLM (V1) server from the outside, so the agent, the dashboard and the hang
detector can be exercised end to end on a machine without GPUs:
* OpenAI API: POST /v1/completions and /v1/chat/completions (streamed as SSE or not), GET /v1/models,
  GET /health, GET /version, and vLLM-named Prometheus metrics at GET /metrics. Every response says it
  is simulated (``system_fingerprint``, the model card's ``owned_by``).
* An engine loop that steps at ``--tokens-per-s``: each step gives every running request one token
  (continuous batching, as in vLLM), so one request gets X tokens/s and N concurrent requests get N*X
  (up to what one Python process can step: a few thousand tokens/s on a small CPU).
  The first step of a request is its prefill (its prompt tokens are counted then) and yields its first
  token. Text is a fixed cycle of words, one word per token; max_tokens is honoured (finish_reason
  "length"). Requests beyond ``--max-num-seqs`` wait. Prompt tokens are counted by a toy tokenizer
  (words and punctuation; 4 extra per chat message and 2 for the assistant turn).
* vLLM-style log lines on stdout (and ``--log-file``): banner, NCCL setup for ``--tp`` > 1, weight loading
  with shard progress, "Uvicorn running on ..." when ready, access lines, and the stats line every
  ``--stats-interval`` s. Like vLLM V1 an idle engine prints no stats line; unlike V1 (which drops to
  DEBUG after one zero line) a busy engine that makes no progress keeps printing its zero lines, as
  vLLM V0 did, so log-only stall detection has something to see.

Faults
* ``nccl-init-hang``: prints the NCCL channel setup, then hangs forever; the port never opens.
  Needs ``--tp`` 2 or more (a single-GPU server sets up no NCCL communicator).
* ``stall``: serves normally, but the engine does not step: the first request is admitted (running=1)
  and no token comes, the generation counter stands still and the stats lines show 0.0 tokens/s with
  Running: 1. SIGUSR1 toggles the stall off and on; so does POST /sim/fault {"fault": "none"|"stall"}
  (GET /sim/fault tells the current state).
* ``idle-hang``: the engine is deadlocked while the API process lives on (vllm-project/vllm#48720: TP ranks
  stuck with no watchdog): GET /health answers 200 and /metrics answers with counters that never move,
  but a completion is taken in and never answered, and the engine never counts it (running stays 0, as
  when the engine core that reports the stats is the part that hangs). Only a request shows the hang:
  layercake's canary probes. Settable at run time like ``stall``; setting ``none`` releases the requests.
* ``crash``: serves for ``--crash-after`` s (default 5) after it is ready, then prints a vLLM
  EngineCore traceback (marked simulated) and exits with code 1.
SIGTERM or SIGINT shut it down cleanly (exit 0).

Across nodes (``--nnodes`` > 1) every node runs one process: the head (``--node-rank 0``) waits for the
others on ``--master-addr:--master-port`` (agents.sim.rendezvous) before it loads and serves; the others
serve no API (like vLLM's ``--headless``). When any node goes away the rest log an NCCL error and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import socket
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agents.sim.rendezvous import Rendezvous, RendezvousError

FINGERPRINT = "layercake-simulated-backend"
OWNED_BY = "layercake-simbackend (SIMULATED: no model, no GPU)"
VLLM_VERSION = "0.10.1"  # the vLLM whose log format and metric names are imitated
FAULTS = ("none", "nccl-init-hang", "stall", "crash", "idle-hang")  # the one list (protocol.sim_fault agrees)
RUNTIME_FAULTS = ("none", "stall", "idle-hang")
WORDS = (
    "this",
    "text",
    "comes",
    "from",
    "a",
    "simulated",
    "inference",
    "backend",
    "that",
    "writes",
    "one",
    "word",
    "per",
    "token",
    "at",
    "a",
    "fixed",
    "rate",
    "so",
    "that",
    "counts",
    "and",
    "rates",
    "are",
    "easy",
    "to",
    "check",
)
TOKEN_RX = re.compile(r"\w+|[^\w\s]")
BLOCK_TOKENS = 16  # vLLM's default KV-cache block size
SHARDS = 4
MIN_SLEEP = 0.001  # above ~1000 tokens/s the engine does several steps per wake-up instead of spinning
MAX_BODY = 1 << 20
MAX_HEADERS = 100
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REASONS = ("stop", "length", "abort")
STATUS_TEXT = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
}


# ---- log lines ------------------------------------------------------------------------------------


class VllmLog:
    """Writes lines in vLLM's format to stdout and, if given, a log file; flushed line by line."""

    def __init__(self, path: Path | None) -> None:
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self._file = path.open("a", encoding="utf-8") if path else None

    def raw(self, text: str) -> None:
        print(text, flush=True)
        if self._file:
            self._file.write(text + "\n")
            self._file.flush()

    def line(self, proc: str, where: str, message: str, level: str = "INFO") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self.raw(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {message}")

    def api(self, where: str, message: str, level: str = "INFO") -> None:
        self.line("APIServer", where, message, level)

    def engine(self, where: str, message: str, level: str = "INFO") -> None:
        self.line("EngineCore_0", where, message, level)

    def uvicorn(self, message: str) -> None:
        self.raw(f"(APIServer pid={self.pid}) INFO:     {message}")

    def nccl(self, rank: int, message: str) -> None:
        self.raw(f"{self.host}:{self.pid}:{self.pid + rank} [{rank}] NCCL INFO {message}")


# ---- metrics -------------------------------------------------------------------------------------


class SimMetrics:
    """vLLM V1 metric names, counting exactly what the engine did."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model, "engine": "0"}

        def make(kind, name: str, doc: str, **kw):
            return kind(name, doc, list(labels), registry=self.registry, **kw).labels(**labels)

        self.running = make(
            Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt = make(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation = make(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.ttft = make(
            Histogram,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
        )
        self.itl = make(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=ITL_BUCKETS,
        )
        self.steps = make(
            Histogram,
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine step.",
            buckets=STEP_BUCKETS,
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.success = {reason: success.labels(**labels, finished_reason=reason) for reason in REASONS}

    def exposition(self, running: int, waiting: int, kv: float) -> bytes:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv.set(kv)
        return generate_latest(self.registry)


# ---- engine --------------------------------------------------------------------------------------


@dataclass(eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    max_tokens: int
    arrived: float = field(default_factory=time.monotonic)
    out: asyncio.Queue = field(default_factory=asyncio.Queue)  # token indices, then None at the end
    generated: int = 0
    last_token_at: float | None = None
    finish_reason: str | None = None

    def kv_blocks(self) -> int:
        return math.ceil((self.prompt_tokens + self.generated) / BLOCK_TOKENS)


class Engine:
    """Steps at a fixed rate while requests run and no stall holds it; one token per running request."""

    def __init__(self, rate: float, metrics: SimMetrics, max_num_seqs: int, kv_tokens: int) -> None:
        self.dt = 1.0 / rate
        self.catch_up = max(4, math.ceil(rate * 0.05))  # steps done at once when the loop runs late
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.kv_blocks = max(1, kv_tokens // BLOCK_TOKENS)
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.stalled = False
        self.frozen = False  # idle-hang: requests go into limbo, never seen by the engine's counters
        self.limbo: list[SimRequest] = []
        self.interval_prompt = 0
        self.interval_generated = 0
        self._wake = asyncio.Event()
        self._clock = (0.0, 0)  # (start, steps done since start)

    def submit(self, req: SimRequest) -> None:
        if self.frozen:
            self.limbo.append(req)
            return
        self.waiting.append(req)
        self._admit()
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        if req in self.limbo:
            self.limbo.remove(req)
        elif req.finish_reason is None:
            self._finish(req, "abort")

    def set_stalled(self, stalled: bool) -> None:
        self.stalled = stalled
        self._wake.set()

    def set_fault(self, fault: str) -> None:
        """A run-time fault: stall, idle-hang or none (which releases what idle-hang held)."""
        self.set_stalled(fault == "stall")
        self.frozen = fault == "idle-hang"
        if not self.frozen:
            held, self.limbo = self.limbo, []
            for req in held:
                self.submit(req)

    @property
    def fault(self) -> str:
        return "idle-hang" if self.frozen else "stall" if self.stalled else "none"

    def kv_usage(self) -> float:
        return min(1.0, sum(r.kv_blocks() for r in self.running) / self.kv_blocks)

    async def run(self) -> None:
        while True:
            await self._until_work()
            start, done = self._clock
            due = math.floor((time.monotonic() - start) / self.dt) - done
            for _ in range(min(due, self.catch_up)):
                if not self.running:  # all finished within this catch-up: no empty steps
                    break
                self._step()
            self._clock = (start, done + due) if due <= self.catch_up else (time.monotonic(), 0)
            next_at = self._clock[0] + (self._clock[1] + 1) * self.dt
            await asyncio.sleep(max(MIN_SLEEP, next_at - time.monotonic()))

    async def _until_work(self) -> None:
        if self.running and not self.stalled:
            return
        while not self.running or self.stalled:
            self._wake.clear()
            await self._wake.wait()
        self._clock = (time.monotonic(), 0)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.popleft())

    def _step(self) -> None:
        batch = list(self.running)
        for req in batch:
            self._advance(req, time.monotonic())
        self.metrics.steps.observe(len(batch))

    def _advance(self, req: SimRequest, now: float) -> None:
        if req.generated == 0:  # prefill: the prompt is processed and yields the first token
            self.metrics.prompt.inc(req.prompt_tokens)
            self.interval_prompt += req.prompt_tokens
            self.metrics.ttft.observe(now - req.arrived)
        else:
            self.metrics.itl.observe(now - req.last_token_at)
        req.out.put_nowait(req.generated)
        req.generated += 1
        req.last_token_at = now
        self.metrics.generation.inc()
        self.interval_generated += 1
        if req.generated >= req.max_tokens:
            self._finish(req, "length")

    def _finish(self, req: SimRequest, reason: str) -> None:
        req.finish_reason = reason
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.metrics.success[reason].inc()
        req.out.put_nowait(None)
        self._admit()


def token_text(index: int, chat: bool) -> str:
    word = WORDS[index % len(WORDS)]
    return word if chat and index == 0 else " " + word


def count_tokens(text: str) -> int:
    return len(TOKEN_RX.findall(text))


# ---- HTTP ----------------------------------------------------------------------------------------


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class HttpRequest:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        return connection != "close" if self.version == "HTTP/1.1" else connection == "keep-alive"

    def json(self) -> dict:
        try:
            data = json.loads(self.body or b"null")
        except ValueError as exc:
            raise HttpError(400, f"request body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HttpError(400, "request body must be a JSON object")
        return data


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    """One HTTP/1.1 request with a Content-Length body, or None when the client closed the connection."""
    line = await reader.readline()
    if not line.strip():
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line {line[:100]!r}")
    headers = await _read_headers(reader)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HttpError(400, "Content-Length is not a number") from None
    if not 0 <= length <= MAX_BODY:
        raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY}")
    body = await reader.readexactly(length)
    return HttpRequest(parts[0], parts[1], parts[2], headers, body)


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = (await reader.readline()).decode("latin-1").strip()
        if not line:
            return headers
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpError(400, f"malformed header line {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    raise HttpError(400, f"more than {MAX_HEADERS} header lines")


class Conn:
    """The response side of one request; logs an access line when the response starts, like uvicorn."""

    def __init__(self, writer: asyncio.StreamWriter, req: HttpRequest | None, log: VllmLog) -> None:
        self.writer, self.req, self.log = writer, req, log
        self.keep_alive = bool(req and req.keep_alive)
        self.status = 0

    async def send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        head = self._head(status, ctype, {"content-length": str(len(body))})
        self.writer.write(head + body)
        await self.writer.drain()

    async def send_json(self, status: int, obj: object) -> None:
        await self.send(status, json.dumps(obj).encode())

    async def send_error(self, err: HttpError) -> None:
        body = {"error": {"message": err.message, "type": err.kind, "param": None, "code": err.status}}
        await self.send_json(err.status, body)

    async def start_stream(self) -> None:
        self.writer.write(
            self._head(200, "text/event-stream; charset=utf-8", {"transfer-encoding": "chunked"})
        )
        await self.writer.drain()

    async def events(self, payloads: list[str]) -> None:
        data = "".join(f"data: {p}\n\n" for p in payloads).encode()
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()

    async def end_stream(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    def _head(self, status: int, ctype: str, extra: dict[str, str]) -> bytes:
        self.status = status
        self._access_log(status)
        lines = [
            f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}",
            f"content-type: {ctype}",
            "server: layercake-simbackend",
            f"connection: {'keep-alive' if self.keep_alive else 'close'}",
        ]
        lines += [f"{k}: {v}" for k, v in extra.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def _access_log(self, status: int) -> None:
        if self.req is None or self.req.path == "/metrics":  # scraped every interval: would drown the log
            return
        peer = self.writer.get_extra_info("peername") or ("-", 0)
        self.log.uvicorn(
            f'{peer[0]}:{peer[1]} - "{self.req.method} {self.req.target} {self.req.version}" '
            f"{status} {STATUS_TEXT.get(status, 'Error')}"
        )


# ---- OpenAI API ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


def _positive_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise HttpError(400, f"{key} must be a positive integer, got {value!r}")
    return value


def _prompt_tokens(prompt: object) -> int:
    """Tokens of a completions prompt: a string, token ids, or a batch of exactly one of those."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    raise HttpError(400, "prompt must be a string or a list of token ids (one prompt per request)")


def _message_tokens(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "messages must be a non-empty list")
    total = 2  # the assistant turn the template opens
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise HttpError(400, "each message must be an object with a role")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise HttpError(400, "message content must be a string or a list of text parts")
        total += 4 + count_tokens(content)
    return total


def parse_job(body: dict, chat: bool, served: str, max_model_len: int) -> Job:
    model = body.get("model")
    if model is not None and model != served:
        raise HttpError(404, f"The model `{model}` does not exist.", "NotFoundError")
    if body.get("n", 1) != 1:
        raise HttpError(400, "the simulated backend generates one choice per request (n must be 1)")
    if chat:
        prompt = _message_tokens(body.get("messages"))
        requested = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    else:
        prompt = _prompt_tokens(body.get("prompt"))
        requested = _positive_int(body, "max_tokens") or 16  # the OpenAI completions default
    if prompt < 1:
        raise HttpError(400, "the prompt is empty")
    max_tokens = requested or max_model_len - prompt
    if prompt + max_tokens > max_model_len:
        raise HttpError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt + max_tokens} tokens ({prompt} in the prompt, {max_tokens} in the "
            "completion). Please reduce the length of the prompt or completion.",
        )
    options = body.get("stream_options") or {}
    return Job(
        chat,
        prompt,
        max_tokens,
        body.get("stream") is True,
        isinstance(options, dict) and options.get("include_usage") is True,
    )


class Api:
    """The routes; completions go through the engine."""

    def __init__(
        self,
        opts: argparse.Namespace,
        engine: Engine,
        metrics: SimMetrics,
        log: VllmLog,
        fault_state: Callable[[str, str], None],
    ) -> None:
        self.opts, self.engine, self.metrics, self.log = opts, engine, metrics, log
        self.served = opts.served_model_name or opts.model
        self.set_fault = fault_state
        self.created = int(time.time())
        self.routes: dict[tuple[str, str], Callable[[HttpRequest, Conn], Awaitable[None]]] = {
            ("GET", "/health"): self.health,
            ("GET", "/version"): self.version,
            ("GET", "/v1/models"): self.models,
            ("GET", "/metrics"): self.prometheus,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat,
            ("GET", "/sim/fault"): self.get_fault,
            ("POST", "/sim/fault"): self.post_fault,
        }

    async def dispatch(self, req: HttpRequest, conn: Conn) -> None:
        handler = self.routes.get((req.method, req.path))
        if handler is None:
            allowed = any(path == req.path for _, path in self.routes)
            raise HttpError(
                405 if allowed else 404, f"{req.method} {req.path} is not served here", "NotFound"
            )
        await handler(req, conn)

    async def health(self, req: HttpRequest, conn: Conn) -> None:
        await conn.send(200, b"")

    async def version(self, req: HttpRequest, conn: Conn) -> None:
        await conn.send_json(200, {"version": f"{VLLM_VERSION}+simulated", "simulated": True})

    async def models(self, req: HttpRequest, conn: Conn) -> None:
        card = {
            "id": self.served,
            "object": "model",
            "created": self.created,
            "owned_by": OWNED_BY,
            "root": self.opts.model,
            "parent": None,
            "max_model_len": self.opts.max_model_len,
        }
        await conn.send_json(200, {"object": "list", "data": [card]})

    async def prometheus(self, req: HttpRequest, conn: Conn) -> None:
        e = self.engine
        body = self.metrics.exposition(len(e.running), len(e.waiting), e.kv_usage())
        await conn.send(200, body, "text/plain; version=0.0.4; charset=utf-8")

    async def get_fault(self, req: HttpRequest, conn: Conn) -> None:
        await conn.send_json(200, {"fault": self.engine.fault, "simulated": True})

    async def post_fault(self, req: HttpRequest, conn: Conn) -> None:
        fault = req.json().get("fault")
        if fault not in RUNTIME_FAULTS:
            raise HttpError(
                400, f"fault must be one of {', '.join(RUNTIME_FAULTS)} at run time, got {fault!r}"
            )
        self.set_fault(fault, "POST /sim/fault")
        self.engine.set_fault(fault)
        await self.get_fault(req, conn)

    async def completions(self, req: HttpRequest, conn: Conn) -> None:
        await self._complete(req, conn, chat=False)

    async def chat(self, req: HttpRequest, conn: Conn) -> None:
        await self._complete(req, conn, chat=True)

    async def _complete(self, req: HttpRequest, conn: Conn, chat: bool) -> None:
        job = parse_job(req.json(), chat, self.served, self.opts.max_model_len)
        sim = SimRequest(
            f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", job.prompt_tokens, job.max_tokens
        )
        self.engine.submit(sim)
        try:
            await (self._stream(job, sim, conn) if job.stream else self._whole(job, sim, conn))
        finally:
            self.engine.abort(sim)  # a no-op when it finished; frees the slot when the client went away

    async def _whole(self, job: Job, sim: SimRequest, conn: Conn) -> None:
        pieces = []
        while (index := await sim.out.get()) is not None:
            pieces.append(token_text(index, job.chat))
        text = "".join(pieces)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if job.chat
            else {"index": 0, "text": text}
        )
        choice.update({"logprobs": None, "finish_reason": sim.finish_reason, "stop_reason": None})
        body = self._envelope(job, sim, "chat.completion" if job.chat else "text_completion", [choice])
        body["usage"] = self._usage(sim)
        await conn.send_json(200, body)

    async def _stream(self, job: Job, sim: SimRequest, conn: Conn) -> None:
        await conn.start_stream()
        if job.chat:
            await conn.events([self._chunk(job, sim, {"role": "assistant", "content": ""}, None)])
        done = False
        while not done:
            indices = [await sim.out.get()]
            while not sim.out.empty():
                indices.append(sim.out.get_nowait())
            done = indices[-1] is None
            tokens = [i for i in indices if i is not None]
            payloads = [self._chunk(job, sim, token_text(i, job.chat), None) for i in tokens]
            if done:
                payloads += self._closing(job, sim)
            await conn.events(payloads)
        await conn.end_stream()

    def _closing(self, job: Job, sim: SimRequest) -> list[str]:
        closing = [self._chunk(job, sim, "", sim.finish_reason)]
        if job.include_usage:
            usage = self._envelope(job, sim, self._chunk_object(job), [])
            usage["usage"] = self._usage(sim)
            closing.append(json.dumps(usage))
        return [*closing, "[DONE]"]

    def _chunk(self, job: Job, sim: SimRequest, text: str | dict, finish: str | None) -> str:
        if job.chat:
            delta = text if isinstance(text, dict) else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice.update({"logprobs": None, "finish_reason": finish, "stop_reason": None})
        return json.dumps(self._envelope(job, sim, self._chunk_object(job), [choice]))

    @staticmethod
    def _chunk_object(job: Job) -> str:
        return "chat.completion.chunk" if job.chat else "text_completion"

    def _envelope(self, job: Job, sim: SimRequest, obj: str, choices: list) -> dict:
        return {
            "id": sim.rid,
            "object": obj,
            "created": int(time.time()),
            "model": self.served,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        }

    @staticmethod
    def _usage(sim: SimRequest) -> dict:
        return {
            "prompt_tokens": sim.prompt_tokens,
            "completion_tokens": sim.generated,
            "total_tokens": sim.prompt_tokens + sim.generated,
        }


# ---- the server process --------------------------------------------------------------------------


class SimServer:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.log = VllmLog(opts.log_file)
        self.metrics = SimMetrics(opts.served_model_name or opts.model)
        self.engine = Engine(opts.tokens_per_s, self.metrics, opts.max_num_seqs, opts.kv_cache_tokens)
        if opts.fault in RUNTIME_FAULTS:
            self.engine.set_fault(opts.fault)
        self.api = Api(opts, self.engine, self.metrics, self.log, self._fault_note)
        self.exit_code = 0
        self._stop = asyncio.Event()
        self.rendezvous = (
            Rendezvous(opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port)
            if opts.nnodes > 1
            else None
        )

    @property
    def world_size(self) -> int:
        return self.opts.tp * self.opts.nnodes

    @property
    def is_head(self) -> bool:
        return self.opts.node_rank == 0

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self._toggle_stall)
        work = asyncio.create_task(self._serve())
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, stop):
            task.cancel()
        if work.done() and not work.cancelled() and work.exception():
            raise work.exception()
        if self.exit_code == 0:
            self._log_shutdown()
        return self.exit_code

    async def _serve(self) -> None:
        self._log_banner()
        if not await self._start_ranks():
            self.exit_code = 1
            return
        await self._load_weights()
        if not self.is_head:
            await self._serve_headless()
            return
        server = await self._listen()
        if server is None:
            self.exit_code = 1
            return
        tasks = [asyncio.create_task(self.engine.run()), asyncio.create_task(self._stats_loop())]
        if self.opts.fault == "crash":
            tasks.append(asyncio.create_task(self._crash_later()))
        if self.rendezvous is not None:
            tasks.append(asyncio.create_task(self._watch_peers()))
        try:
            await asyncio.gather(*tasks)
        finally:
            server.close()
            for task in tasks:
                task.cancel()

    async def _start_ranks(self) -> bool:
        """NCCL-style setup of this node's ranks; across nodes, the rendezvous with the other nodes first."""
        if self.world_size > 1:
            self._log_nccl_setup()
        if self.rendezvous is not None:
            try:
                await self.rendezvous.complete()
            except RendezvousError as exc:
                self.log.line(self._worker, "parallel_state.py:1160", f"RuntimeError: {exc}", "ERROR")
                return False
        if self.opts.fault == "nccl-init-hang":
            await asyncio.Future()  # the first collective never completes
        if self.world_size > 1:
            self._log_nccl_complete()
        return True

    async def _serve_headless(self) -> None:
        """A non-head node: its ranks run layers for the head; it serves no API (vLLM's --headless)."""
        self.log.engine(
            "core.py:95",
            f"Node rank {self.opts.node_rank} of {self.opts.nnodes} is running headless: "
            f"serving the head at {self.rendezvous.endpoint}",
        )
        await self._watch_peers()

    async def _watch_peers(self) -> None:
        """Like a broken NCCL communicator: when another node goes away, this one cannot go on."""
        await self.rendezvous.peer_lost()
        for line in peer_lost_lines(self.rendezvous.endpoint):
            self.log.line(self._worker, "ProcessGroupNCCL.cpp:1915", line, "ERROR")
        self.exit_code = 1
        self._stop.set()

    async def _listen(self) -> asyncio.Server | None:
        o = self.opts
        self.log.api("api_server.py:1885", f"Starting vLLM API server 0 on http://{o.host}:{o.port}")
        self.log.api("launcher.py:29", "Available routes are:")
        for method, path in self.api.routes:
            self.log.api("launcher.py:37", f"Route: {path}, Methods: {method}")
        try:
            server = await asyncio.start_server(self._handle, o.host, o.port)
        except OSError as exc:
            self.log.api("api_server.py:1890", f"cannot listen on {o.host}:{o.port}: {exc}", "ERROR")
            return None
        self.log.uvicorn(f"Started server process [{self.log.pid}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        self.log.raw(f"INFO:     Uvicorn running on http://{o.host}:{o.port} (Press CTRL+C to quit)")
        return server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            req = await read_request(reader)
        except (HttpError, ValueError) as exc:  # ValueError: a line longer than the reader's limit
            err = exc if isinstance(exc, HttpError) else HttpError(400, f"bad request: {exc}")
            await Conn(writer, None, self.log).send_error(err)
            return False
        if req is None:
            return False
        conn = Conn(writer, req, self.log)
        try:
            await self.api.dispatch(req, conn)
        except HttpError as err:
            if conn.status:  # the response had started: the stream can only be cut
                return False
            await conn.send_error(err)
        return conn.keep_alive

    # ---- startup and shutdown log ----

    def _log_banner(self) -> None:
        o = self.opts
        self.log.api(
            "simbackend.py:1",
            f"SIMULATED inference backend (layercake agents.sim.backend): no model is "
            f"loaded and no GPU is used; it generates {o.tokens_per_s:g} tokens/s per request "
            f"(fault: {o.fault})",
            "WARNING",
        )
        self.log.api("api_server.py:1805", f"vLLM API server version {VLLM_VERSION} (simulated)")
        args = {
            "model": o.model,
            "host": o.host,
            "port": o.port,
            "tensor_parallel_size": o.tp,
            "max_model_len": o.max_model_len,
        }
        self.log.api("utils.py:326", f"non-default args: {args}")
        self.log.engine(
            "core.py:74",
            f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: "
            f"model='{o.model}', served_model_name={self.api.served}, tensor_parallel_size={o.tp}, "
            f"max_seq_len={o.max_model_len}, device_config=simulated",
        )

    @property
    def _ranks(self) -> range:
        """The global ranks on this node."""
        first = self.opts.node_rank * self.opts.tp
        return range(first, first + self.opts.tp)

    def _log_nccl_setup(self) -> None:
        world, rendezvous = self.world_size, self.rendezvous
        init = rendezvous.endpoint if rendezvous else "127.0.0.1:29500"  # torch.distributed's usual port
        for local, rank in enumerate(self._ranks):
            worker = f"VllmWorker rank={rank}"
            self.log.line(
                worker,
                "parallel_state.py:1134",
                f"world_size={world} rank={rank} local_rank={local} "
                f"distributed_init_method=tcp://{init} backend=nccl",
            )
            self.log.line(worker, "pynccl.py:70", "vLLM is using nccl==2.26.2")
        for rank in self._ranks:
            self.log.nccl(rank, "Bootstrap : Using lo:127.0.0.1<0>")
            self.log.nccl(rank, f"cudaDriverVersion 12080 (simulated rank {rank} of {world})")
        for rank in self._ranks:
            for channel in range(2):
                via = "NET/Socket" if rendezvous and rank == self._ranks[-1] else "P2P/CUMEM"
                self.log.nccl(
                    rank,
                    f"Channel {channel:02d}/0 : {rank}[{rank}] -> {(rank + 1) % world}"
                    f"[{(rank + 1) % world}] via {via}",
                )

    def _log_nccl_complete(self) -> None:
        tp = self.world_size
        for rank in self._ranks:
            self.log.nccl(rank, "Connected all rings")
            self.log.nccl(rank, "Connected all trees")
            self.log.nccl(
                rank,
                "2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, "
                "2 p2p channels per peer",
            )
            self.log.nccl(
                rank,
                f"comm 0x5151{rank:04x} rank {rank} nranks {tp} cudaDev {rank} nvmlDev {rank} "
                f"busId {rank + 1}000 commId 0x51ba11 - Init COMPLETE",
            )

    @property
    def _worker(self) -> str:
        """The process that loads weights: a worker per rank with TP, else the engine core itself."""
        return "VllmWorker rank=0" if self.opts.tp > 1 else "EngineCore_0"

    async def _load_weights(self) -> None:
        o = self.opts
        self.log.line(self._worker, "gpu_model_runner.py:1770", f"Starting to load model {o.model}...")
        started = time.monotonic()
        for done in range(SHARDS + 1):
            if done:
                await asyncio.sleep(o.load_seconds / SHARDS)
            spent = time.monotonic() - started
            self.log.raw(
                f"({self._worker} pid={self.log.pid}) Loading safetensors checkpoint shards: "
                f"{100 * done // SHARDS:3d}% Completed | {done}/{SHARDS} [{_mmss(spent)}<?, ?it/s]"
            )
        spent = time.monotonic() - started
        self.log.line(self._worker, "default_loader.py:262", f"Loading weights took {spent:.2f} seconds")
        self.log.line(
            self._worker,
            "gpu_model_runner.py:1801",
            f"Model loading took 0.00 GiB and {spent:.6f} seconds (simulated)",
        )
        kv = o.kv_cache_tokens
        self.log.engine("kv_cache_utils.py:849", f"GPU KV cache size: {kv:,} tokens")
        self.log.engine(
            "kv_cache_utils.py:853",
            f"Maximum concurrency for {o.max_model_len:,} tokens per request: {kv / o.max_model_len:.2f}x",
        )
        self.log.engine(
            "core.py:215", "init engine (profile, create kv cache, warmup model) took 0.00 seconds"
        )

    def _log_shutdown(self) -> None:
        self.log.uvicorn("Shutting down")
        self.log.uvicorn("Waiting for application shutdown.")
        self.log.uvicorn("Application shutdown complete.")
        self.log.uvicorn(f"Finished server process [{self.log.pid}]")

    # ---- periodic work and faults ----

    async def _stats_loop(self) -> None:
        e, last, was_busy = self.engine, time.monotonic(), False
        while True:
            await asyncio.sleep(self.opts.stats_interval)
            now = time.monotonic()
            prompt, gen = e.interval_prompt / (now - last), e.interval_generated / (now - last)
            e.interval_prompt = e.interval_generated = 0
            busy = bool(prompt or gen or e.running or e.waiting)
            if busy or was_busy:  # like vLLM V1: an idle engine stays quiet
                self.log.api(
                    "loggers.py:123",
                    f"Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, "
                    f"Avg generation throughput: {gen:.1f} tokens/s, Running: {len(e.running)} reqs, "
                    f"Waiting: {len(e.waiting)} reqs, GPU KV cache usage: {100 * e.kv_usage():.1f}%, "
                    "Prefix cache hit rate: 0.0%",
                )
            last, was_busy = now, busy

    def _toggle_stall(self) -> None:
        self._fault_note("none" if self.engine.stalled else "stall", "SIGUSR1")
        self.engine.set_stalled(not self.engine.stalled)

    def _fault_note(self, fault: str, source: str) -> None:
        self.log.api("simbackend.py:2", f"SIMULATED fault set to {fault} by {source}", "WARNING")

    async def _crash_later(self) -> None:
        await asyncio.sleep(self.opts.crash_after)
        for line in crash_traceback(self.opts.crash_after):
            self.log.engine("core.py:700", line, "ERROR")
        self.log.api("async_llm.py:420", "AsyncLLM output_handler failed.", "ERROR")
        self.log.api(
            "async_llm.py:420",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
            "issue. See stack trace (above) for the root cause.",
            "ERROR",
        )
        self.exit_code = 1
        self._stop.set()


def peer_lost_lines(endpoint: str) -> list[str]:
    return [
        f"NCCL WARN NET/Socket : peer of the rendezvous at {endpoint} closed its connection (SIMULATED)",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
        ":1915, remote process exited or there was a network error, NCCL version 2.26.2",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
    ]


def crash_traceback(after: float) -> list[str]:
    site = "/usr/local/lib/python3.12/dist-packages/vllm"
    return [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        f'  File "{site}/v1/engine/core.py", line 691, in run_engine_core',
        "    engine_core.run_busy_loop()",
        f'  File "{site}/v1/engine/core.py", line 718, in run_busy_loop',
        "    self._process_engine_step()",
        f'  File "{site}/v1/worker/gpu_model_runner.py", line 1523, in execute_model',
        "    valid_sampled_token_ids = sampled_token_ids.tolist()",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        f"(SIMULATED: layercake simbackend --fault crash, {after:g} s after it was ready)",
    ]


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


# ---- command line --------------------------------------------------------------------------------


def _number(kind: type, minimum: float, strict: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}, got {text!r}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agents.sim.backend",
        description="SIMULATED vLLM-like inference backend (no model, no GPU).",
    )
    p.add_argument("--port", type=_number(int, 1, False), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", required=True, help="model name or path to pretend to serve")
    p.add_argument("--served-model-name", default=None)
    p.add_argument(
        "--tokens-per-s",
        type=_number(float, 0, True),
        required=True,
        help="generation rate per running request",
    )
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--load-seconds", type=_number(float, 0, False), default=2.0)
    p.add_argument(
        "--crash-after",
        type=_number(float, 0, False),
        default=None,
        help="with --fault crash: seconds of serving before the crash (default 5)",
    )
    p.add_argument("--tp", type=_number(int, 1, False), default=1, help="tensor-parallel size to pretend")
    p.add_argument("--stats-interval", type=_number(float, 0, True), default=5.0)
    p.add_argument("--max-model-len", type=_number(int, 16, False), default=4096)
    p.add_argument("--max-num-seqs", type=_number(int, 1, False), default=256)
    p.add_argument("--kv-cache-tokens", type=_number(int, BLOCK_TOKENS, False), default=65536)
    p.add_argument("--log-file", type=Path, default=None)
    p.add_argument("--nnodes", type=_number(int, 1, False), default=1, help="nodes this server spans")
    p.add_argument(
        "--node-rank", type=_number(int, 0, False), default=0, help="0: the head, which serves the API"
    )
    p.add_argument("--master-addr", default=None, help="the head's address (with --nnodes > 1)")
    p.add_argument(
        "--master-port", type=_number(int, 1, False), default=None, help="the head's rendezvous port"
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _parser()
    opts = parser.parse_args(argv)
    if opts.port > 65535:
        parser.error(f"--port must be at most 65535, got {opts.port}")
    if opts.fault == "nccl-init-hang" and opts.tp * opts.nnodes < 2:
        parser.error(
            "--fault nccl-init-hang needs --tp 2 or more, or --nnodes 2 or more (a single-GPU server "
            "sets up no NCCL communicator)"
        )
    if opts.nnodes > 1 and (opts.master_addr is None or opts.master_port is None):
        parser.error(
            "--nnodes > 1 needs --master-addr and --master-port (where the head waits for the others)"
        )
    if opts.node_rank >= opts.nnodes:
        parser.error(f"--node-rank {opts.node_rank} must be below --nnodes {opts.nnodes}")
    if opts.crash_after is not None and opts.fault != "crash":
        parser.error("--crash-after only applies to --fault crash")
    opts.crash_after = 5.0 if opts.crash_after is None else opts.crash_after
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return asyncio.run(SimServer(opts).run())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""The real llama.cpp engine (llama-cpp-python's OpenAI-compatible server) with vLLM-style /metrics and logs.

llama-cpp-python's server has no /metrics. This wraps its app so the agent can watch it like vLLM:

* every token the engine samples is counted as it comes out of `Llama.generate` (the loop that both
  streaming and non-streaming completions, and chat completions, run through), so
  `vllm:generation_tokens_total` equals the sum of the responses' `usage.completion_tokens`;
* `vllm:num_requests_running` is 1 while the engine works on a request (llama-cpp-python runs one at
  a time), `vllm:num_requests_waiting` counts completion requests queued behind it;
* time to first token runs from the HTTP request's arrival to the first sampled token;
* stdout gets vLLM-like lines ("Uvicorn running on ...", "Avg prompt throughput: ...") so the same log
  classifier (agents/logscan.py) and progress parsing apply.

    python -m agents.sim.llamacpp_server --model PATH --host 127.0.0.1 --port P [--n_ctx N] [--n_threads T]
        [--n_gpu_layers N] [--served_model_name NAME] [--log_stats_interval S] [--verbose]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import logging.config
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app

from agents.sim.backend import ITL_BUCKETS, TTFT_BUCKETS  # vLLM's own bounds: dashboards read both alike

log = logging.getLogger("llamacpp_server")

COMPLETION_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/engines/copilot-codex/completions"}
)
QUIET_PATHS = frozenset({"/metrics", "/health"})  # polled every few seconds by the agent
LOG_FORMAT = "%(levelname)s %(asctime)s [%(module)s.py:%(lineno)d] %(message)s"
LOG_DATEFMT = "%m-%d %H:%M:%S"

_arrival: ContextVar[float | None] = ContextVar("request_arrival", default=None)
# ggml.h's ggml_log_level (llama-cpp-python's _logger.py comment still has an older, shifted enum)
GGML_LOG_SHOWN = (2, 3, 4)  # INFO, WARN, ERROR; DEBUG is 1
GGML_LOG_CONT = 5  # continues the previous message (llama.cpp's loading progress dots)
_log_callbacks: list = []  # ctypes callbacks must outlive every call llama.cpp makes to them


@dataclass(frozen=True)
class Totals:
    prompt_tokens: int
    generation_tokens: int
    running: int
    waiting: int
    kv_usage: float


class EngineMeter:
    """What the engine did, in vLLM's metric names, in a registry of its own."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._prompt = self._generation = self._running = self._in_flight = 0
        self.kv_usage: Callable[[], float] = lambda: 0.0
        self._define(model_name)

    def _define(self, model_name: str) -> None:
        r, labels = self.registry, ["model_name"]
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", labels, registry=r)
        self.success = Counter(
            "vllm:request_success", "Finished requests.", [*labels, "finished_reason"], registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first token.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between successive tokens.",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(model_name)
        for name, doc, read in (
            (
                "vllm:num_requests_running",
                "Requests the engine is working on.",
                lambda: self.totals().running,
            ),
            ("vllm:num_requests_waiting", "Requests queued for the engine.", lambda: self.totals().waiting),
            (
                "vllm:kv_cache_usage_perc",
                "Fraction of the context (KV cache) in use.",
                lambda: self.totals().kv_usage,
            ),
        ):
            Gauge(name, doc, labels, registry=r).labels(model_name).set_function(read)
        self.model_name = model_name

    def totals(self) -> Totals:
        with self._lock:
            running, waiting = self._running, max(0, self._in_flight - self._running)
            prompt, generation = self._prompt, self._generation
        return Totals(prompt, generation, running, waiting, self.kv_usage() if running else 0.0)

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """One completion request, from its arrival at the HTTP server until its response is sent."""
        token = _arrival.set(time.monotonic())
        self._add(in_flight=1)
        try:
            yield
        finally:
            self._add(in_flight=-1)
            _arrival.reset(token)

    def started(self) -> None:
        self._add(running=1)

    def finished(self, reason: str) -> None:
        self._add(running=-1)
        self.success.labels(self.model_name, reason).inc()

    def prompt(self, tokens: int) -> None:
        self._add(prompt=tokens)
        self.prompt_tokens.labels(self.model_name).inc(tokens)

    def generated(self) -> None:
        self._add(generation=1)
        self.generation_tokens.labels(self.model_name).inc()

    def _add(self, prompt: int = 0, generation: int = 0, running: int = 0, in_flight: int = 0) -> None:
        with self._lock:
            self._prompt += prompt
            self._generation += generation
            self._running += running
            self._in_flight += in_flight


class TokenClock:
    """Times one request's tokens: the first against the request's arrival, the rest against each other."""

    def __init__(self, meter: EngineMeter) -> None:
        self.meter = meter
        self.start = _arrival.get() or time.monotonic()
        self.last: float | None = None

    def tick(self, counts: bool) -> None:
        now = time.monotonic()
        if self.last is None:
            self.meter.ttft.observe(now - self.start)
        else:
            self.meter.itl.observe(now - self.last)
        self.last = now
        if counts:
            self.meter.generated()


def instrument(llama: Any, meter: EngineMeter) -> None:
    """Wrap this Llama instance's token loop and completion entry point so the meter sees every token."""
    import llama_cpp

    # The same end-of-generation test the library applies before it counts a token in `usage`.
    is_end = partial(llama_cpp.llama_vocab_is_eog, llama._model.vocab)
    llama.generate = _metered_generate(llama.generate, meter, is_end)
    llama.create_completion = _metered_completion(llama.create_completion, meter)
    meter.kv_usage = lambda: min(1.0, llama.n_tokens / max(1, llama.n_ctx()))


def _metered_generate(generate: Callable, meter: EngineMeter, is_end: Callable[[int], bool]) -> Callable:
    def metered(tokens: list[int], *args: Any, **kwargs: Any) -> Iterator[int]:
        meter.prompt(len(tokens))
        clock = TokenClock(meter)
        for token in generate(tokens, *args, **kwargs):
            clock.tick(counts=not is_end(token))
            yield token

    return metered


def _metered_completion(create_completion: Callable, meter: EngineMeter) -> Callable:
    def metered(*args: Any, **kwargs: Any) -> Any:
        # the library and its chat handlers always pass `stream` by keyword
        if kwargs.get("stream"):
            return _metered_stream(create_completion(*args, **kwargs), meter)
        meter.started()
        reason = "abort"
        try:
            result = create_completion(*args, **kwargs)
            reason = result["choices"][0].get("finish_reason") or "stop"
            return result
        finally:
            meter.finished(reason)

    return metered


def _metered_stream(chunks: Iterator[dict], meter: EngineMeter) -> Iterator[dict]:
    """Running from the first chunk asked for until the last is consumed or the client goes away.

    Nothing is counted before the first chunk: a stream dropped unread never runs and must not
    leave the running gauge up.
    """
    meter.started()
    reason = None
    try:
        for chunk in chunks:
            choices = chunk.get("choices") or [{}]
            reason = choices[0].get("finish_reason") or reason
            yield chunk
    finally:
        meter.finished(reason or "abort")


class MeteredApp:
    """ASGI wrapper: serves /metrics from the meter's registry and tracks completion requests in flight."""

    def __init__(self, app: Callable, meter: EngineMeter) -> None:
        self.app = app
        self.meter = meter
        self.metrics = make_asgi_app(registry=meter.registry)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == "/metrics":
            await self.metrics(scope, receive, send)
        elif path in COMPLETION_PATHS and scope.get("method") == "POST":
            with self.meter.request():
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class StatsLogger(threading.Thread):
    """Prints vLLM's periodic throughput line, averaged over each interval."""

    def __init__(self, meter: EngineMeter, interval: float) -> None:
        super().__init__(name="stats-logger", daemon=True)
        self.meter = meter
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        before, since = self.meter.totals(), time.monotonic()
        while not self.stopped.wait(self.interval):
            now, totals = time.monotonic(), self.meter.totals()
            log.info(stats_line(before, totals, now - since))
            before, since = totals, now


def stats_line(before: Totals, after: Totals, seconds: float) -> str:
    seconds = max(seconds, 1e-9)
    prompt = (after.prompt_tokens - before.prompt_tokens) / seconds
    generation = (after.generation_tokens - before.generation_tokens) / seconds
    return (
        f"Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation throughput: {generation:.1f} tokens/s, "
        f"Running: {after.running} reqs, Waiting: {after.waiting} reqs, "
        f"KV cache usage: {after.kv_usage * 100:.1f}%"
    )


class QuietProbes(logging.Filter):
    """Drops access-log lines for the endpoints the agent polls."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (len(args) >= 3 and str(args[2]).split("?")[0] in QUIET_PATHS)


def log_config() -> dict:
    """One stdout handler in vLLM's line format, shared by this module and uvicorn."""
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stdout", "formatter": "vllm"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": {"format": LOG_FORMAT, "datefmt": LOG_DATEFMT}},
        "filters": {"quiet": {"()": QuietProbes}},
        "handlers": {"out": handler, "access": {**handler, "filters": ["quiet"]}},
        "loggers": {
            name: {
                "handlers": ["access" if name == "uvicorn.access" else "out"],
                "level": "INFO",
                "propagate": False,
            }
            for name in ("llamacpp_server", "uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def show_llama_cpp_info_log() -> None:
    """llama.cpp's info, warnings and errors to stderr, without its debug lines.

    llama-cpp-python's verbose mode prints every level, about 2,000 debug lines (one per tensor and per
    graph input) for even a 135M model, which would drown the loading lines in the agent's log tail.
    """
    import llama_cpp

    state = {"shown": False}

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        state["shown"] = state["shown"] if level == GGML_LOG_CONT else level in GGML_LOG_SHOWN
        if state["shown"]:
            print(text.decode("utf-8", "replace"), end="", file=sys.stderr, flush=True)

    _log_callbacks.append(callback)
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


def build_app(args: argparse.Namespace) -> tuple[MeteredApp, EngineMeter]:
    """Load the model into llama-cpp-python's own server app and wrap it with the meter."""
    from llama_cpp.server import app as server_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    # create_app would let a CONFIG_FILE from the environment replace everything given on the command line
    os.environ.pop("CONFIG_FILE", None)
    model = ModelSettings(**_model_options(args))
    # interrupt_requests=False: a second request queues behind the running one instead of cutting its stream off
    server = ServerSettings(host=args.host, port=args.port, interrupt_requests=False)
    app = server_app.create_app(server_settings=server, model_settings=[model])
    meter = EngineMeter(model.model_alias or args.model)
    instrument(server_app._llama_proxy(None), meter)
    app.add_api_route("/health", partial(_health, meter), methods=["GET"])
    return MeteredApp(app, meter), meter


async def _health(meter: EngineMeter) -> dict:
    # the app exists only once create_app has loaded the model, so answering at all means loaded
    return {"status": "ok", "model": meter.model_name}


def _model_options(args: argparse.Namespace) -> dict:
    options = {"model": str(args.model), "verbose": args.verbose, "n_gpu_layers": args.n_gpu_layers}
    for name in ("n_ctx", "n_threads"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.served_model_name:
        options["model_alias"] = args.served_model_name
    return options


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 1 and 65535, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agents.sim.llamacpp_server", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", required=True, type=Path, help="path to a GGUF file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--n_ctx", type=_positive, help="context length (default: llama-cpp-python's, 2048)")
    p.add_argument("--n_threads", type=_positive, help="CPU threads (default: half the cores)")
    p.add_argument("--n_gpu_layers", type=int, default=0, help="layers to offload to the GPU (-1: all)")
    p.add_argument("--served_model_name", "--served-model-name", help="model name in the API and metrics")
    p.add_argument("--log_stats_interval", type=float, default=5.0, help="seconds between throughput lines")
    p.add_argument("--verbose", action="store_true", help="also print llama.cpp's own log (info and up)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.model.is_file():
        parser().error(f"--model {args.model}: no such file")
    if args.log_stats_interval <= 0:
        parser().error(f"--log_stats_interval must be positive, got {args.log_stats_interval}")
    logging.config.dictConfig(log_config())
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    import llama_cpp
    import uvicorn

    log.info(
        "llama-cpp-python %s (llama.cpp engine) loading model %s: n_ctx=%s, n_threads=%s, n_gpu_layers=%s",
        llama_cpp.__version__,
        args.model,
        args.n_ctx or "default",
        args.n_threads or "default",
        args.n_gpu_layers,
    )
    if args.verbose:
        show_llama_cpp_info_log()
    began = time.monotonic()
    try:
        app, meter = build_app(args)
    except (ValueError, OSError, RuntimeError) as exc:
        log.error("failed to load model %s: %s", args.model, exc)
        return 1
    log.info("Model %s loaded in %.2f s", meter.model_name, time.monotonic() - began)
    StatsLogger(meter, args.log_stats_interval).start()
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_config=log_config(), timeout_graceful_shutdown=5
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

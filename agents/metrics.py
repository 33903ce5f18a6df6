"""Turn what an inference server exposes into backend-neutral `ServerCounters`, and counters into rates.

Sources
* Prometheus text expositions (``/metrics``) of vLLM, SGLang and llama.cpp's ``llama-server``; the
  backend is recognised by its metric-name prefix (``vllm:``, ``sglang:``, ``llamacpp:``). Values of
  one metric are summed over its label sets (several ``model_name`` / ``engine`` / rank labels), except
  KV-cache usage, a fraction, which is averaged (SGLang: used / capacity tokens when both are there).
  Where a metric was renamed, the newer name wins and the older one is the fallback.
* Ollama has no ``/metrics``. ``/api/ps`` says which models are loaded, how much of each sits in VRAM
  and when each is due to unload, nothing about tokens or requests: ``counters_from_ollama_ps`` gives
  only ``unload_overdue_s`` (how long a listed model is past its unload time, what ``ollama ps`` shows
  as "Stopping..."), ``ollama_loaded_models`` returns everything it does say. Token counts and timings
  exist only in each finished response (``counters_from_ollama_response``); ``accumulate`` adds those
  up into cumulative counters for whoever sees the responses (a proxy, a test client).

What a backend cannot tell
* vLLM 0.2.x exported only 5-s average throughput gauges (``vllm:avg_*_throughput_toks_per_s``), no
  token counters: such a server gives running/waiting/KV usage but no token counts. The gauges are
  not used because a rate is derived from counter deltas, which the averaged gauges cannot give.
* llama.cpp has no TTFT histogram and no finished-request counter, and its KV gauge was removed
  upstream. Its ITL is the mean generation time per token: ``tokens_predicted_seconds_total`` over
  ``tokens_predicted_total``. llama.cpp adds a request's tokens to ``tokens_predicted_total`` only
  when the request finishes; ``n_decode_total`` (steps) moves during a long generation.
* SGLang has no step counter.

``rates`` turns two scrapes into per-second rates and interval means; a counter that went down means
the server restarted, so its new value counts from zero. (A restart that generates more than before
within one interval cannot be told from progress; the usual Prometheus caveat.)
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from agents.protocol import ServerCounters

Alternatives = tuple[tuple[str, ...], ...]  # first alternative present wins; names in one are added up
Pair = tuple[str, str]  # (sum sample, count sample) of one histogram


class ExpositionError(ValueError):
    """The text is not a usable metrics exposition; the message says what is wrong."""


@dataclass(frozen=True)
class Dialect:
    backend: str
    prefix: str
    totals: dict[str, Alternatives]
    kv_fraction: tuple[str, ...] = ()  # gauges 0-1, newest name first, averaged over label sets
    kv_tokens: Pair | None = None  # (used, capacity) gauges giving an exact fraction
    ttft: tuple[Pair, ...] = ()
    itl: tuple[Pair, ...] = ()


def _hist(*bases: str) -> tuple[Pair, ...]:
    return tuple((f"{base}_sum", f"{base}_count") for base in bases)


DIALECTS: tuple[Dialect, ...] = (
    Dialect(
        "vllm",
        "vllm:",
        {
            "generation_tokens_total": (("vllm:generation_tokens_total",),),
            "prompt_tokens_total": (("vllm:prompt_tokens_total",),),
            "requests_running": (("vllm:num_requests_running",),),
            # V0's swapped requests were preempted to CPU and wait to resume
            "requests_waiting": (("vllm:num_requests_waiting", "vllm:num_requests_swapped"),),
            "steps_total": (("vllm:iteration_tokens_total_count",),),
            "requests_finished_total": (("vllm:request_success_total",),),
        },
        kv_fraction=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        ttft=_hist("vllm:time_to_first_token_seconds"),
        itl=_hist("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    Dialect(
        "sglang",
        "sglang:",
        {
            "generation_tokens_total": (("sglang:generation_tokens_total",),),
            "prompt_tokens_total": (("sglang:prompt_tokens_total",),),
            "requests_running": (("sglang:num_running_reqs",),),
            "requests_waiting": (("sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs"),),
            "requests_finished_total": (
                ("sglang:num_requests_total",),
                ("sglang:e2e_request_latency_seconds_count",),
            ),
        },
        kv_fraction=("sglang:token_usage",),
        kv_tokens=("sglang:num_used_tokens", "sglang:max_total_num_tokens"),
        ttft=_hist("sglang:time_to_first_token_seconds"),
        itl=_hist("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    ),
    Dialect(
        "llamacpp",
        "llamacpp:",
        {
            "generation_tokens_total": (("llamacpp:tokens_predicted_total",),),
            "prompt_tokens_total": (("llamacpp:prompt_tokens_total",),),
            "requests_running": (("llamacpp:requests_processing",),),
            "requests_waiting": (("llamacpp:requests_deferred",),),
            "steps_total": (("llamacpp:n_decode_total",),),
        },
        kv_fraction=("llamacpp:kv_cache_usage_ratio",),
        itl=(("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"),),
    ),
)
DIALECT_BY_BACKEND = {d.backend: d for d in DIALECTS}


class Samples:
    """Every sample value of one exposition, by sample name (NaN values dropped: 'no data')."""

    def __init__(self, text: str) -> None:
        self.families: list[str] = []
        self.values: dict[str, list[float]] = {}
        try:
            for family in text_string_to_metric_families(_unescape(text)):
                self.families.append(family.name)
                for sample in family.samples:
                    if not math.isnan(sample.value):
                        self.values.setdefault(sample.name, []).append(float(sample.value))
        except ValueError as exc:
            raise ExpositionError(f"not a Prometheus text exposition: {exc}") from None

    def total(self, names: tuple[str, ...]) -> float | None:
        found = [v for name in names for v in self.values.get(name, [])]
        return sum(found) if found else None

    def first_total(self, alternatives: Alternatives) -> float | None:
        return next((t for names in alternatives if (t := self.total(names)) is not None), None)

    def mean(self, name: str) -> float | None:
        found = self.values.get(name)
        return sum(found) / len(found) if found else None


def _unescape(text: str) -> str:
    """Some llama-server builds (about b7010-b7100) served /metrics as one JSON string."""
    stripped = text.strip()
    if stripped.startswith('"') and stripped.endswith('"'):
        try:
            decoded = json.loads(stripped)
        except ValueError:
            return text
        return decoded if isinstance(decoded, str) else text
    return text


def detect_backend(samples: Samples) -> Dialect:
    counts = {d.backend: sum(name.startswith(d.prefix) for name in samples.families) for d in DIALECTS}
    best = max(counts, key=lambda backend: counts[backend])
    if counts[best] == 0:
        seen = ", ".join(samples.families[:5]) or "no metrics at all"
        raise ExpositionError(f"no vllm:, sglang: or llamacpp: metrics in the exposition (found: {seen})")
    return DIALECT_BY_BACKEND[best]


def parse_exposition(text: str) -> tuple[str, ServerCounters]:
    """The backend that wrote the exposition and the counters read from it."""
    samples = Samples(text)
    dialect = detect_backend(samples)
    values = {field: samples.first_total(alts) for field, alts in dialect.totals.items()}
    values["kv_cache_usage"] = _kv_usage(samples, dialect)
    values.update(_histogram("ttft_seconds", samples, dialect.ttft))
    values.update(_histogram("itl_seconds", samples, dialect.itl))
    try:
        return dialect.backend, ServerCounters(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ExpositionError(
            f"{dialect.backend} exposition gives an impossible {field}: {first['msg']}"
        ) from None


def counters_from_exposition(text: str) -> ServerCounters:
    """Backend-neutral counters from a vLLM, SGLang or llama.cpp /metrics text."""
    return parse_exposition(text)[1]


def _kv_usage(samples: Samples, dialect: Dialect) -> float | None:
    if dialect.kv_tokens:
        used, capacity = (samples.total((name,)) for name in dialect.kv_tokens)
        if used is not None and capacity:
            return used / capacity
    return next((m for name in dialect.kv_fraction if (m := samples.mean(name)) is not None), None)


def _histogram(field: str, samples: Samples, pairs: tuple[Pair, ...]) -> dict[str, float | None]:
    """Sum and count from the first histogram present; both from the same one, never mixed."""
    for sum_name, count_name in pairs:
        count = samples.total((count_name,))
        if count is not None:
            return {f"{field}_sum": samples.total((sum_name,)), f"{field}_count": count}
    return {f"{field}_sum": None, f"{field}_count": None}


# ---- rates ---------------------------------------------------------------------------------------

COUNTER_RATES = {
    "generation_tokens_per_s": "generation_tokens_total",
    "prompt_tokens_per_s": "prompt_tokens_total",
    "steps_per_s": "steps_total",
    "requests_finished_per_s": "requests_finished_total",
}
INTERVAL_MEANS = {"ttft_mean_s": "ttft_seconds", "itl_mean_s": "itl_seconds"}
GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")


def _delta(prev: float | None, cur: float | None) -> tuple[float | None, bool]:
    """Increase of a counter and whether it was reset (went down: the server restarted)."""
    if prev is None or cur is None:
        return None, False
    return (cur, True) if cur < prev else (cur - prev, False)


def _interval_mean(prev: ServerCounters, cur: ServerCounters, base: str) -> tuple[float | None, bool]:
    p_sum, p_count = getattr(prev, f"{base}_sum"), getattr(prev, f"{base}_count")
    c_sum, c_count = getattr(cur, f"{base}_sum"), getattr(cur, f"{base}_count")
    if None in (p_sum, p_count, c_sum, c_count):
        return None, False
    reset = c_count < p_count or c_sum < p_sum
    d_sum, d_count = (c_sum, c_count) if reset else (c_sum - p_sum, c_count - p_count)
    return (d_sum / d_count if d_count > 0 else None), reset


def rates(prev: ServerCounters, prev_t: float, cur: ServerCounters, cur_t: float) -> dict:
    """Per-second rates and interval means between two scrapes taken at prev_t and cur_t (seconds).

    Keys: generation_tokens_per_s, prompt_tokens_per_s, steps_per_s, requests_finished_per_s,
    ttft_mean_s and itl_mean_s (None when no request got a first token / no token gap was observed in
    the interval), the gauges of the newer scrape (requests_running, requests_waiting, kv_cache_usage),
    interval_s, and reset (True if any counter went down). Unknown values are None.
    """
    interval = cur_t - prev_t
    if not math.isfinite(interval) or interval <= 0:
        raise ValueError(f"cur_t ({cur_t}) must be later than prev_t ({prev_t})")
    out: dict = {"interval_s": interval}
    resets = []
    for key, field in COUNTER_RATES.items():
        delta, reset = _delta(getattr(prev, field), getattr(cur, field))
        out[key] = None if delta is None else delta / interval
        resets.append(reset)
    for key, base in INTERVAL_MEANS.items():
        out[key], reset = _interval_mean(prev, cur, base)
        resets.append(reset)
    out.update({gauge: getattr(cur, gauge) for gauge in GAUGES})
    out["reset"] = any(resets)
    return out


# ---- Ollama ----------------------------------------------------------------------------------------

COUNTER_FIELDS = (
    "generation_tokens_total",
    "prompt_tokens_total",
    "ttft_seconds_sum",
    "ttft_seconds_count",
    "itl_seconds_sum",
    "itl_seconds_count",
    "steps_total",
    "requests_finished_total",
)
NS = 1e-9
# Go's time.Time in JSON (RFC 3339 with up to 9 fractional digits); an offset is required to place it in time.
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")


@dataclass(frozen=True)
class LoadedModel:
    """One entry of Ollama's /api/ps."""

    name: str
    size_bytes: int
    vram_bytes: int
    expires_at: str | None
    context_length: int | None
    expires_t: float | None  # expires_at in seconds since the epoch

    @property
    def gpu_fraction(self) -> float:
        """Share of the model in VRAM; below 1 the rest runs on the CPU (slow, not hung)."""
        return self.vram_bytes / self.size_bytes if self.size_bytes else 0.0


def _models_of(obj: object) -> list[dict]:
    models = obj.get("models") if isinstance(obj, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise ValueError("Ollama /api/ps answer must be an object with a 'models' list of objects")
    return models


def _count(value: object, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _instant(value: object, what: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as Go writes it; None when absent."""
    if value is None:
        return None
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        raise ValueError(
            f"{what} must be an RFC 3339 time with an offset (2025-04-10T19:31:02.5Z), got {value!r}"
        )
    try:
        return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", value)).timestamp()  # datetime keeps µs
    except ValueError as exc:
        raise ValueError(f"{what} is not a real time: {value!r} ({exc})") from None


def ollama_loaded_models(obj: dict) -> list[LoadedModel]:
    """The models Ollama has loaded, with their size, VRAM share, unload time and context length."""
    loaded = []
    for entry in _models_of(obj):
        name = entry.get("name") or entry.get("model")
        if not isinstance(name, str) or not name:
            raise ValueError("Ollama /api/ps: a model entry has no name")
        where = f"Ollama /api/ps: {name!r}"
        loaded.append(
            LoadedModel(
                name,
                _count(entry.get("size", 0), f"{where} size"),
                _count(entry.get("size_vram", 0), f"{where} size_vram"),
                entry.get("expires_at"),
                _count(entry.get("context_length"), f"{where} context_length"),
                _instant(entry.get("expires_at"), f"{where} expires_at"),
            )
        )
    return loaded


def counters_from_ollama_ps(obj: dict, now: float | None = None) -> ServerCounters:
    """Counters from Ollama's /api/ps: only how long a loaded model is overdue to unload.

    /api/ps lists loaded models (name, size, size_vram, expires_at, context_length) and nothing about
    requests, tokens or the KV cache, so those counters stay None (unknown, not zero). A model still
    listed after its expires_at is one `ollama ps` shows as "Stopping...": ``unload_overdue_s`` is the
    longest such overrun at ``now`` (seconds since the epoch, default the current time), 0 when every
    model is within its keep-alive, None when no model (with an expires_at) is listed. The input is
    checked, so a wrong endpoint is reported. Use ``ollama_loaded_models`` for the rest of what /api/ps
    says, and ``counters_from_ollama_response`` for tokens and timings.
    """
    expiries = [m.expires_t for m in ollama_loaded_models(obj) if m.expires_t is not None]
    if not expiries:
        return ServerCounters()
    now = time.time() if now is None else now
    return ServerCounters(unload_overdue_s=max(0.0, now - min(expiries)))


def _duration(obj: dict, key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(
            f"Ollama response: {key} must be a non-negative number of nanoseconds, got {value!r}"
        )
    return value * NS


def counters_from_ollama_response(obj: dict) -> ServerCounters:
    """Counters of one finished /api/generate or /api/chat response (its final, done=true chunk).

    eval_count generated tokens in eval_duration (ns): one ITL observation per token, so the interval
    mean is eval_duration / eval_count. TTFT is load_duration + prompt_eval_duration, the server-side
    time before decoding began (time spent queued is not reported).
    """
    if not isinstance(obj, dict) or obj.get("done") is not True:
        raise ValueError("Ollama response: only the final chunk (done: true) carries token counts")
    gen = _count(obj.get("eval_count"), "Ollama response: eval_count")
    prompt = _count(obj.get("prompt_eval_count"), "Ollama response: prompt_eval_count")
    load, prefill, decode = (
        _duration(obj, k) for k in ("load_duration", "prompt_eval_duration", "eval_duration")
    )
    ttft = None if prefill is None else prefill + (load or 0.0)
    return ServerCounters(
        generation_tokens_total=gen,
        prompt_tokens_total=prompt,
        ttft_seconds_sum=ttft,
        ttft_seconds_count=None if ttft is None else 1,
        itl_seconds_sum=decode if gen is not None else None,
        itl_seconds_count=gen if decode is not None else None,
        requests_finished_total=1,
    )


def accumulate(total: ServerCounters, one: ServerCounters) -> ServerCounters:
    """Add one response's counters to running totals (for servers that report per response only)."""
    summed = {}
    for field in COUNTER_FIELDS:
        a, b = getattr(total, field), getattr(one, field)
        summed[field] = b if a is None else a if b is None else a + b
    return ServerCounters(**summed)

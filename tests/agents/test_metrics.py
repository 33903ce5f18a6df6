"""agents.metrics: counters from real /metrics expositions, rates between scrapes, Ollama's answers.

The expected numbers below were read off the fixture texts by hand; `test_it_reads_values_that_are_in_the_text`
checks that each one really appears there, next to the sample it was read from.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from agents.metrics import (
    ExpositionError,
    accumulate,
    counters_from_exposition,
    counters_from_ollama_ps,
    counters_from_ollama_response,
    ollama_loaded_models,
    parse_exposition,
    rates,
)
from agents.protocol import ServerCounters
from tests.fixtures import fixture_files, read_fixture

ALL_NONE = dict.fromkeys(ServerCounters.model_fields)

# fixture -> (backend, {field: (value, sample line it comes from)}); fields not listed must be None
EXPECTED: dict[str, tuple[str, dict[str, tuple[float, str]]]] = {
    "llamacpp_metrics.txt": (
        "llamacpp",
        {
            "generation_tokens_total": (7801, "llamacpp:tokens_predicted_total 7801"),
            "prompt_tokens_total": (33065, "llamacpp:prompt_tokens_total 33065"),
            "requests_running": (0, "llamacpp:requests_processing 0"),
            "requests_waiting": (0, "llamacpp:requests_deferred 0"),
            "steps_total": (7831, "llamacpp:n_decode_total 7831"),
            "itl_seconds_sum": (279.178, "llamacpp:tokens_predicted_seconds_total 279.178"),
            "itl_seconds_count": (7801, "llamacpp:tokens_predicted_total 7801"),
        },
    ),
    "llamacpp_metrics_ik_llama.txt": (
        "llamacpp",
        {
            "generation_tokens_total": (3469, "llamacpp:tokens_predicted_total 3469"),
            "prompt_tokens_total": (6886, "llamacpp:prompt_tokens_total 6886"),
            "itl_seconds_sum": (3544.27, "llamacpp:tokens_predicted_seconds_total 3544.27"),
            "itl_seconds_count": (3469, "llamacpp:tokens_predicted_total 3469"),
        },
    ),
    # only request_prompt_tokens buckets: recognisably SGLang, nothing this module reads
    "sglang_metrics.txt": ("sglang", {}),
    "vllm_metrics.txt": (
        "vllm",
        {
            "requests_running": (
                0,
                'vllm:num_requests_running{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0',
            ),
            "requests_waiting": (
                0,
                'vllm:num_requests_waiting{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0',
            ),
            "kv_cache_usage": (
                0,
                'vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0',
            ),
        },
    ),
    # HELP/TYPE lines only: a V0 server before its first request has no samples yet
    "vllm_metrics_v0_help_only.txt": ("vllm", {}),
    "vllm_metrics_v1_design_doc.txt": (
        "vllm",
        {
            "requests_running": (
                8,
                'vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.0',
            ),
            "generation_tokens_total": (
                27453,
                'vllm:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 27453.0',
            ),
            # stop 1 + length 131 + abort 0
            "requests_finished_total": (
                132,
                'vllm:request_success_total{finished_reason="length",model_name="meta-llama/Llama-3.1-8B-Instruct"} '
                "131.0",
            ),
            "ttft_seconds_count": (
                140,
                'vllm:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 140.0',
            ),
        },
    ),
}


def exposition_of(body: str) -> str:
    """The scrape itself: fixtures keep the shell prompt ('$ curl ...') and the docs' '...' elisions."""
    return "\n".join(
        line for line in body.splitlines() if not line.startswith("$ ") and line.strip() != "..."
    )


def metrics_fixtures():
    return [pytest.param(path, id=path.name) for path in fixture_files("metrics")]


@pytest.mark.parametrize("path", metrics_fixtures())
def test_it_reads_every_metrics_fixture(path) -> None:
    header, body = read_fixture(path)
    assert path.name in EXPECTED, f"{path.name} has no hand-checked expectation in this test"
    backend, fields = EXPECTED[path.name]
    got_backend, counters = parse_exposition(exposition_of(body))
    assert got_backend == backend == header["backend"]
    expected = {**ALL_NONE, **{name: value for name, (value, _) in fields.items()}}
    assert counters.model_dump() == pytest.approx(expected)


@pytest.mark.parametrize("path", metrics_fixtures())
def test_it_reads_values_that_are_in_the_text(path) -> None:
    _, body = read_fixture(path)
    for name, (value, line) in EXPECTED[path.name][1].items():
        assert line in body.splitlines(), f"{name}: {line!r} is not a line of {path.name}"
        if name != "requests_finished_total":
            assert float(line.rsplit(" ", 1)[1]) == value


def test_it_sums_request_outcomes_over_finish_reasons() -> None:
    _, body = read_fixture(fixture_files("metrics", "vllm_metrics_v1_design_doc.txt")[0])
    outcomes = re.findall(r'^vllm:request_success_total\{finished_reason="\w+",.*\} ([\d.]+)$', body, re.M)
    assert len(outcomes) == 3
    assert counters_from_exposition(exposition_of(body)).requests_finished_total == sum(map(float, outcomes))


def test_it_agrees_with_llamacpps_own_throughput_gauge() -> None:
    """The ITL read from llama.cpp's counters is the inverse of the generation rate it reports itself."""
    _, body = read_fixture(fixture_files("metrics", "llamacpp_metrics.txt")[0])
    counters = counters_from_exposition(exposition_of(body))
    gauge = float(re.search(r"^llamacpp:predicted_tokens_seconds ([\d.]+)$", body, re.M).group(1))
    assert counters.itl_seconds_count / counters.itl_seconds_sum == pytest.approx(gauge, rel=1e-3)


def test_it_refuses_text_that_is_not_an_exposition() -> None:
    _, body = read_fixture(fixture_files("metrics", "llamacpp_metrics.txt")[0])
    with pytest.raises(ExpositionError, match=r"not a Prometheus text exposition.*\$ curl"):
        counters_from_exposition(body)  # the fixture still has its shell prompt line
    with pytest.raises(ExpositionError, match="no vllm:, sglang: or llamacpp: metrics.*process_open_fds"):
        counters_from_exposition("# TYPE process_open_fds gauge\nprocess_open_fds 45.0\n")
    with pytest.raises(ExpositionError, match="no metrics at all"):
        counters_from_exposition("")


def test_it_refuses_impossible_values() -> None:
    with pytest.raises(ExpositionError, match="vllm exposition gives an impossible generation_tokens_total"):
        counters_from_exposition('vllm:generation_tokens_total{model_name="m"} -3\n')
    with pytest.raises(ExpositionError, match="impossible kv_cache_usage"):
        counters_from_exposition('vllm:kv_cache_usage_perc{model_name="m"} 7\n')


NEW_VLLM_TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="m"} 500.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 90.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 90.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 4.5
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 10.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 999.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 999.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 70.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 1000.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 30.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 500.0
"""


def test_it_sums_engines_and_prefers_new_vllm_names() -> None:
    c = counters_from_exposition(NEW_VLLM_TWO_ENGINES)
    assert (c.requests_running, c.requests_waiting, c.generation_tokens_total) == (5, 1, 1500)
    assert c.kv_cache_usage == pytest.approx(0.5)  # mean of the engines; the deprecated name is ignored
    assert (c.itl_seconds_sum, c.itl_seconds_count) == (5.0, 100)  # not the old TPOT histogram
    assert c.steps_total == 100


def test_it_falls_back_to_old_vllm_names() -> None:
    text = """\
vllm:gpu_cache_usage_perc{model_name="m"} 0.4
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:num_requests_swapped{model_name="m"} 1.0
vllm:time_per_output_token_seconds_count{model_name="m"} 10.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.3
vllm:avg_generation_throughput_toks_per_s{model_name="m"} 52.0
"""
    c = counters_from_exposition(text)
    assert (c.kv_cache_usage, c.requests_waiting) == (0.4, 3)  # swapped requests wait to resume
    assert (c.itl_seconds_sum, c.itl_seconds_count) == (0.3, 10)
    assert c.generation_tokens_total is None  # a throughput gauge is not a token count


def test_it_reads_sglang_with_several_label_sets() -> None:
    text = """\
sglang:num_running_reqs{model_name="m",tp_rank="0"} 4.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 4.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
sglang:num_grammar_queue_reqs{model_name="m",tp_rank="0"} 1.0
sglang:num_used_tokens{model_name="m",tp_rank="0"} 300.0
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 1000.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.99
sglang:generation_tokens_total{model_name="m"} 4096.0
sglang:prompt_tokens_total{model_name="m"} 1024.0
sglang:num_requests_total{model_name="m"} 12.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 2.4
sglang:time_to_first_token_seconds_count{model_name="m"} 12.0
sglang:gen_throughput{model_name="m"} NaN
"""
    c = counters_from_exposition(text)
    assert (c.requests_running, c.requests_waiting, c.kv_cache_usage) == (8, 3, 0.3)
    assert (c.generation_tokens_total, c.prompt_tokens_total, c.requests_finished_total) == (4096, 1024, 12)
    assert (c.ttft_seconds_sum, c.ttft_seconds_count, c.steps_total) == (2.4, 12, None)


def test_it_reads_json_escaped_llamacpp_metrics() -> None:
    _, body = read_fixture(fixture_files("metrics", "llamacpp_metrics.txt")[0])
    plain = exposition_of(body)
    assert counters_from_exposition(json.dumps(plain)) == counters_from_exposition(plain)


# ---- rates ---------------------------------------------------------------------------------------


def scrape(**values) -> ServerCounters:
    return ServerCounters(**values)


def test_it_computes_rates_and_interval_means() -> None:
    prev = scrape(
        generation_tokens_total=1000,
        prompt_tokens_total=50,
        ttft_seconds_sum=2.0,
        ttft_seconds_count=10,
        itl_seconds_sum=20.0,
        itl_seconds_count=990,
        steps_total=400,
        requests_finished_total=9,
    )
    cur = scrape(
        generation_tokens_total=1500,
        prompt_tokens_total=150,
        ttft_seconds_sum=3.0,
        ttft_seconds_count=12,
        itl_seconds_sum=30.0,
        itl_seconds_count=1490,
        steps_total=650,
        requests_finished_total=11,
        requests_running=2,
        requests_waiting=1,
        kv_cache_usage=0.3,
    )
    r = rates(prev, 100.0, cur, 110.0)
    assert r == pytest.approx(
        {
            "interval_s": 10.0,
            "generation_tokens_per_s": 50.0,
            "prompt_tokens_per_s": 10.0,
            "steps_per_s": 25.0,
            "requests_finished_per_s": 0.2,
            "ttft_mean_s": 0.5,
            "itl_mean_s": 0.02,
            "requests_running": 2,
            "requests_waiting": 1,
            "kv_cache_usage": 0.3,
            "reset": False,
        }
    )


def test_it_counts_from_zero_after_a_restart() -> None:
    prev = scrape(generation_tokens_total=90_000, ttft_seconds_sum=50.0, ttft_seconds_count=400)
    cur = scrape(generation_tokens_total=300, ttft_seconds_sum=0.6, ttft_seconds_count=3)
    r = rates(prev, 0.0, cur, 5.0)
    assert r["generation_tokens_per_s"] == pytest.approx(60.0)
    assert r["ttft_mean_s"] == pytest.approx(0.2)
    assert r["reset"] is True


def test_it_reports_unknown_and_idle_as_none_not_zero() -> None:
    prev = scrape(generation_tokens_total=10, itl_seconds_sum=1.0, itl_seconds_count=9)
    cur = scrape(generation_tokens_total=10, itl_seconds_sum=1.0, itl_seconds_count=9)
    r = rates(prev, 0.0, cur, 1.0)
    assert r["generation_tokens_per_s"] == 0.0  # known, and nothing happened
    assert r["itl_mean_s"] is None  # no token gap in the interval: no mean
    assert r["prompt_tokens_per_s"] is None and r["ttft_mean_s"] is None  # never exposed
    assert rates(scrape(), 0.0, cur, 1.0)["generation_tokens_per_s"] is None  # metric appeared only now


def test_it_refuses_intervals_that_do_not_move_forward() -> None:
    with pytest.raises(ValueError, match=r"cur_t \(5.0\) must be later than prev_t \(5.0\)"):
        rates(scrape(), 5.0, scrape(), 5.0)


# ---- Ollama ----------------------------------------------------------------------------------------

# shaped like the /api/ps example of Ollama's API documentation, second model partly offloaded to the CPU
OLLAMA_PS = {
    "models": [
        {
            "name": "mistral:latest",
            "model": "mistral:latest",
            "size": 5137025024,
            "digest": "2ae6f6dd7a3d",
            "details": {
                "format": "gguf",
                "family": "llama",
                "parameter_size": "7.2B",
                "quantization_level": "Q4_0",
            },
            "expires_at": "2024-06-04T14:38:31.83753-07:00",
            "size_vram": 5137025024,
        },
        {
            "name": "llama3:70b",
            "model": "llama3:70b",
            "size": 40000000000,
            "size_vram": 30000000000,
            "expires_at": "2024-06-04T14:40:00-07:00",
            "context_length": 8192,
        },
    ]
}


def at(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp()


def test_it_knows_no_token_or_request_counters_from_ollama_ps() -> None:
    before_expiry = at("2024-06-04T14:30:00-07:00")
    assert counters_from_ollama_ps(OLLAMA_PS, now=before_expiry).model_dump() == {
        **ALL_NONE,
        "unload_overdue_s": 0.0,
    }
    assert counters_from_ollama_ps({"models": []}).model_dump() == ALL_NONE
    assert (
        counters_from_ollama_ps({"models": [{"name": "m", "size": 1}]}).model_dump() == ALL_NONE
    )  # no expires_at


def overdue(expires_at: str, now: str) -> float | None:
    ps = {"models": [{"name": "llama3.2:3b", "size": 1, "size_vram": 1, "expires_at": expires_at}]}
    return counters_from_ollama_ps(ps, now=at(now)).unload_overdue_s


def test_it_reports_no_unload_overrun_while_the_model_is_kept_alive() -> None:
    # OLLAMA_KEEP_ALIVE=-1: Go's longest duration, so expires_at lands in 2318
    assert overdue("2318-03-20T02:43:35.123456789+08:00", "2025-04-10T19:31:02Z") == 0.0
    assert overdue("2025-04-10T19:31:02.5Z", "2025-04-10T19:31:02Z") == 0.0


def test_it_measures_how_long_a_listed_model_is_past_its_unload_time() -> None:
    assert overdue("2025-04-10T19:31:02.123456789Z", "2025-04-10T19:33:32.623456Z") == pytest.approx(150.5)
    assert overdue("2025-04-11T03:31:02+08:00", "2025-04-10T19:36:18Z") == pytest.approx(316.0)


def test_it_takes_the_most_overdue_of_several_models() -> None:
    kept = {"name": "qwen2.5:7b", "size": 1, "expires_at": "2318-01-01T00:00:00Z"}
    ps = {"models": [*OLLAMA_PS["models"], kept]}
    counters = counters_from_ollama_ps(ps, now=at("2024-06-04T14:45:00-07:00"))
    assert counters.unload_overdue_s == pytest.approx(6 * 60 + 28.16247)  # mistral, due at 14:38:31.83753


@pytest.mark.parametrize(
    "bad",
    [
        "2025-04-10",
        "2025-04-10T19:31:02",
        "2025-04-10 19:31:02Z",
        "1744313462",
        1744313462,
        "2025-04-10T19:31:02.1234567890Z",
        "2025-13-10T19:31:02Z",
    ],
)
def test_it_names_expires_at_when_it_is_not_an_rfc3339_time(bad) -> None:
    ps = {"models": [{"name": "llama3.2:3b", "size": 1, "expires_at": bad}]}
    with pytest.raises(
        ValueError, match=r"'llama3.2:3b' expires_at (must be an RFC 3339 time|is not a real time)"
    ):
        counters_from_ollama_ps(ps, now=0.0)


def test_it_lists_ollamas_loaded_models() -> None:
    first, second = ollama_loaded_models(OLLAMA_PS)
    assert (first.name, first.gpu_fraction, first.context_length) == ("mistral:latest", 1.0, None)
    assert (second.name, second.gpu_fraction, second.context_length) == ("llama3:70b", 0.75, 8192)


def test_it_refuses_what_is_not_an_ollama_ps_answer() -> None:
    with pytest.raises(ValueError, match="'models' list"):
        counters_from_ollama_ps({"object": "list", "data": []})  # an OpenAI /v1/models answer
    with pytest.raises(ValueError, match="size_vram must be a non-negative integer"):
        ollama_loaded_models({"models": [{"name": "m", "size": 1, "size_vram": "1 GB"}]})


OLLAMA_DONE = {
    "model": "llama3",
    "created_at": "2023-08-04T19:22:45.499127Z",
    "response": "",
    "done": True,
    "total_duration": 10706818083,
    "load_duration": 6338219291,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 130079000,
    "eval_count": 259,
    "eval_duration": 4232710000,
}


def test_it_reads_an_ollama_response() -> None:
    c = counters_from_ollama_response(OLLAMA_DONE)
    assert (c.generation_tokens_total, c.prompt_tokens_total, c.requests_finished_total) == (259, 26, 1)
    assert c.ttft_seconds_sum == pytest.approx(6.338219291 + 0.130079)
    assert c.itl_seconds_count == 259 and c.itl_seconds_sum == pytest.approx(4.23271)
    with pytest.raises(ValueError, match="only the final chunk"):
        counters_from_ollama_response({"model": "llama3", "response": "The", "done": False})
    with pytest.raises(ValueError, match="eval_count must be a non-negative integer"):
        counters_from_ollama_response({**OLLAMA_DONE, "eval_count": -1})


def test_it_accumulates_responses_into_counters_rates_can_use() -> None:
    one = counters_from_ollama_response(OLLAMA_DONE)
    total = accumulate(accumulate(ServerCounters(), one), one)
    assert (total.generation_tokens_total, total.requests_finished_total, total.ttft_seconds_count) == (
        518,
        2,
        2,
    )
    r = rates(one, 0.0, total, 10.0)
    assert r["generation_tokens_per_s"] == pytest.approx(25.9)
    assert r["itl_mean_s"] == pytest.approx(4.23271 / 259)
